package daemon

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
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
	matched := e.d.run.DirectiveStats()[0].Template.Matches.Load()
	if r := e.ask(t, "www.example.org.", dns.TypeAAAA, false, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("AAAA again: %v", r)
	}
	if n := e.d.run.DirectiveStats()[0].Template.Matches.Load(); n != matched {
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
	if st := e.d.run.DirectiveStats(); len(st) != 1 || st[0].Template == nil || st[0].Template.Matches.Load() == 0 {
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
