package running

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// templateCorefile is internal/daemon's chain_test's Corefile: a template
// answering one name, another answering AAAA NOERROR.
func templateCorefile(addr string) string {
	return fmt.Sprintf(".:53 {\n  bind 127.0.0.1\n  cache 30\n  template IN A pinned.test {\n    answer \"{{ .Name }} 300 IN A %s\"\n  }\n  template IN AAAA {\n    rcode NOERROR\n  }\n  forward . /etc/resolv.conf\n}\n", addr)
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
	d := &State{cfg: cfg, log: slog.New(slog.DiscardHandler), clock: clock.Real}
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
	run := c.Run("www.example.org.") // the block's chain, as its View's Block carries it
	fetch := func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		return blocks.RunChain(ctx, run, qname, query)
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
