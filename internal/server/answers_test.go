package server

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/rwanswer"
)

// rewriteTTL is a block's `rewrite ttl NAME TTL` as the server gets it.
func rewriteTTL(name string, ttl uint32) *chained {
	rules := rwanswer.New([]rwanswer.Step{{Kind: rwanswer.TTL, Stop: true, Min: ttl, Max: ttl, Match: func(q string) bool { return q == name }}})
	return newChained([]string{"rewrite"}, rules)
}

// TestRewriteOnEveryAnswer: a block's rewrite ttl rule is applied to the
// miss and to the hits after it, over UDP and TCP, and the cache keeps
// the upstream's TTL (a name the rule does not match gets it).
func TestRewriteOnEveryAnswer(t *testing.T) {
	rw := rewriteTTL("a.example.", 7)
	s, z := startServer(t, nil, rw.rmut)
	for _, c := range []struct {
		name, net string
		want      uint32
	}{
		{"a.example.", "udp", 7}, {"a.example.", "udp", 7}, {"a.example.", "tcp", 7},
		{"b.example.", "tcp", 60}, {"b.example.", "udp", 60}, {"A.Example.", "tcp", 7},
	} {
		m := new(dns.Msg)
		m.SetQuestion(c.name, dns.TypeA)
		addr := s.Addr().String()
		if c.net == "tcp" {
			addr = s.TCPAddr().String()
		}
		r, _, err := (&dns.Client{Net: c.net, Timeout: 3 * time.Second}).Exchange(m, addr)
		if err != nil {
			t.Fatal(err)
		}
		// The cache caps TTLs at a minute (newResolver).
		if len(r.Answer) != 1 || r.Answer[0].Header().Ttl > c.want || r.Answer[0].Header().Ttl < c.want-1 {
			t.Errorf("%s over %s: %v, want TTL %d", c.name, c.net, r.Answer, c.want)
		}
	}
	if n := z.n.Load(); n != 2 {
		t.Errorf("%d upstream queries, want 2 (the rest are hits)", n)
	}
	// Off: a block without the rule does not rewrite.
	rw.off.Store(true)
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	r, err := dns.Exchange(m, s.Addr().String())
	if err != nil || len(r.Answer) != 1 || r.Answer[0].Header().Ttl < 50 {
		t.Fatalf("with no block rewriting: %v %v", r, err)
	}
}

// BenchmarkUDPHitRewriteTTL is BenchmarkUDPHit with a block's rewrite ttl
// rule matching every answer: compare the two within one run.
func BenchmarkUDPHitRewriteTTL(b *testing.B) {
	benchmarkUDPHit(b, func(c *Config) { c.UDPSockets = 1 }, rewriteTTL("bench.example.", 30).rmut)
}
