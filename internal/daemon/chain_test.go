package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

func templateCorefile(addr string) string {
	return fmt.Sprintf(".:53 {\n  bind 127.0.0.1\n  cache 30\n  template IN A pinned.test {\n    answer \"{{ .Name }} 300 IN A %s\"\n  }\n  template IN AAAA {\n    rcode NOERROR\n  }\n  forward . /etc/resolv.conf\n}\n", addr)
}

// The block's chain answers misses; a Corefile change to a directive
// replaces the chain and drops the block's cached answers, so even a
// cached name gets the new answer within the reload's 2 s.
func TestCorefileDirectiveChangeDropsCachedAnswers(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, templateCorefile("10.0.0.1"))
	for i := 0; i < 2; i++ { // miss, then hit
		if got := e.firstA(t, "pinned.test."); got != "10.0.0.1" {
			t.Fatalf("round %d: %s", i, got)
		}
	}
	if r := e.ask(t, "www.example.org.", dns.TypeAAAA, false, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("AAAA: %v", r)
	}
	// The template's empty NOERROR is cached as CoreDNS's cache keeps it
	// (5 s): the second AAAA is a hit, the template does not run again.
	matched := e.d.DirectiveStats()[0].Template.Matches.Load()
	if r := e.ask(t, "www.example.org.", dns.TypeAAAA, false, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("AAAA again: %v", r)
	}
	if n := e.d.DirectiveStats()[0].Template.Matches.Load(); n != matched {
		t.Fatalf("the template ran again for a cached AAAA (%d matches, was %d)", n, matched)
	}
	before := e.node.count()
	writeAtomic(t, conf, templateCorefile("10.0.0.2"))
	start := time.Now()
	for e.firstA(t, "pinned.test.") != "10.0.0.2" {
		if time.Since(start) > 2*time.Second {
			t.Fatal("the cached answer of the old template is still served 2 s after the change")
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if n := e.node.count(); n != before {
		t.Fatalf("the upstream got %d queries", n-before)
	}
	if st := e.d.DirectiveStats(); len(st) != 1 || st[0].Template == nil || st[0].Template.Matches.Load() == 0 {
		t.Fatalf("stats %+v", st)
	}
	// CoreDNS's template series: one per (zone, class, type), counting on
	// across the reload that rebuilt the directive (a second registration
	// would make the scrape fail with duplicate series): A matched once
	// before the change and at least once after it (the hit in between is
	// the cache's), AAAA once.
	mfs, err := e.d.Metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("scrape after a reload: %v", err)
	}
	matches := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "coredns_template_matches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" {
					key = l.GetValue()
				}
			}
			matches[key] += m.GetCounter().GetValue()
		}
	}
	if matches["A"] < 2 || matches["AAAA"] < 1 || len(matches) != 2 {
		t.Fatalf("coredns_template_matches_total by type: %v", matches)
	}
}

// BenchmarkChainFetch is the cost the chain adds to a miss: the query
// unpacked, the block's chain (here a template answering AAAA NOERROR, or
// passing A on to the forward), the answer packed.
func BenchmarkChainFetch(b *testing.B) {
	cfg := &config.Config{}
	srv, err := corefile.Build("Corefile", mustParse(b, templateCorefile("10.0.0.1")), corefile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cfg.DropIn.Corefile = &config.CorefileConfig{Servers: srv}
	d := &Daemon{cfg: cfg, log: slog.New(slog.DiscardHandler), clock: clock.Real}
	ans := new(dns.Msg)
	ans.SetQuestion("www.example.org.", dns.TypeA)
	ans.Response = true
	a, _ := dns.NewRR("www.example.org. 60 IN A 10.0.0.1")
	ans.Answer = []dns.RR{a}
	wire, _ := ans.Pack()
	next := func(context.Context, string, []byte) ([]byte, error) { return wire, nil }
	if err := d.initChain(next); err != nil {
		b.Fatal(err)
	}
	c := d.chain.Load()
	fetch := func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		return c.Fetch(ctx, qname, query, next)
	}
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeA} {
		q := new(dns.Msg)
		q.SetQuestion("www.example.org.", qt)
		q.SetEdns0(1232, false)
		qw, _ := q.Pack()
		b.Run(dns.TypeToString[qt], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fetch(context.Background(), "www.example.org.", qw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("no-chain", func(b *testing.B) {
		q := new(dns.Msg)
		q.SetQuestion("www.example.org.", dns.TypeA)
		qw, _ := q.Pack()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := next(context.Background(), "www.example.org.", qw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func mustParse(b *testing.B, text string) []*corefile.Block {
	bs, err := corefile.Parse("Corefile", []byte(text), func(string) string { return "" })
	if err != nil {
		b.Fatal(err)
	}
	return bs
}

// The fetch-side directives are registered by their packages (the chain
// is built from the registry alone).
func TestFetchSideDirectivesRegistered(t *testing.T) {
	if got, want := directive.Names(), []string{"dns64", "hosts", "rewrite", "template"}; !slices.Equal(got, want) {
		t.Fatalf("registered %v, want %v", got, want)
	}
}
