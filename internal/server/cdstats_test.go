package server

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// TestCoreDNSCounters: queries over UDP and TCP count under the longest
// Corefile zone of their name, with CoreDNS's type and rcode cells, hits
// and misses, and a malformed query under "dropped".
func TestCoreDNSCounters(t *testing.T) {
	s, _ := startServer(t, countByBlocks(t, []CDZone{{Name: "cluster.local.", Plugin: "errors"}, {Name: "svc.cluster.local.", Plugin: "cache"}, {Name: ".", Plugin: "errors"},
		{Name: "corp.example.", Off: true}}))
	ask := func(network, name string, qtype uint16) {
		t.Helper()
		c := &dns.Client{Net: network, Timeout: 5 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		addr := s.Addr().String()
		if network == "tcp" {
			addr = s.TCPAddr().String()
		}
		if _, _, err := c.Exchange(m, addr); err != nil {
			t.Fatal(err)
		}
	}
	ask("udp", "a.default.svc.cluster.local.", dns.TypeA) // miss
	ask("udp", "A.default.SVC.cluster.local.", dns.TypeA) // hit
	ask("udp", "x.cluster.local.", dns.TypeMX)
	ask("tcp", "example.com.", dns.TypeAAAA)
	ask("udp", "example.com.", dns.TypeNAPTR)   // "other"
	ask("udp", "host.corp.example.", dns.TypeA) // a block without prometheus: not counted, not under "."
	c, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0}) // two questions promised, none there: FORMERR
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 512)); err != nil {
		t.Fatal(err)
	}

	want := map[string]func(b CDBlock) bool{
		"svc.cluster.local.": func(b CDBlock) bool {
			return b.Requests[0][0][0] == 2 && b.Responses[0][0] == 2 && b.HitsSuccess == 1 && b.CacheMisses == 1 &&
				b.Duration[len(b.Duration)-1] == 0 && sum(b.Duration[:]) == 2 && sum(b.ReqSize[0][:]) == 2 && b.Plugin == "cache"
		},
		"cluster.local.": func(b CDBlock) bool { return b.Requests[0][0][5] == 1 && b.Plugin == "errors" },
		".": func(b CDBlock) bool {
			return b.Requests[1][0][7] == 1 && b.Requests[0][0][len(CDTypes)-1] == 1 && sum(b.RespSize[1][:]) == 1 &&
				b.Requests[0][0][0] == 0 // host.corp.example. A is not here
		},
		CDDropped: func(b CDBlock) bool { return b.Responses[1][1] == 1 && b.Plugin == "" },
	}
	// The miss path counts its answer after sending it: poll.
	deadline := time.Now().Add(5 * time.Second)
	for {
		bad := ""
		got := map[string]bool{}
		for _, b := range s.CDSnapshot() {
			if b.Server != "dns://"+s.Addr().String() {
				t.Fatalf("server %q", b.Server)
			}
			got[b.Zone] = true
			if f := want[b.Zone]; f == nil || !f(b) {
				bad = b.Zone
			}
		}
		if bad == "" && len(got) == len(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone %q wrong or missing: %+v", bad, s.CDSnapshot())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sum(v []uint64) (n uint64) {
	for _, x := range v {
		n += x
	}
	return
}

// BenchmarkCoreDNSCount is what a UDP hit adds for the CoreDNS-named
// series: the zone match, the request and response cells, and the flush
// of a batch of 64 (compare with BenchmarkUDPHit's per-query cost).
func BenchmarkCoreDNSCount(b *testing.B) {
	cfg := Config{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	countByBlocks(b, []CDZone{{Name: "cluster.local.", Plugin: "errors"}, {Name: "in-addr.arpa.", Plugin: "errors"}, {Name: "ip6.arpa.", Plugin: "errors"}, {Name: ".", Plugin: "errors"}})(&cfg)
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cd := newCDCounters(1, s.cdz.n, true)
	var q wire.Query
	m := new(dns.Msg)
	m.SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
	raw, _ := m.Pack()
	if err := wire.ParseQuery(raw, &q); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := s.cdKey(0, s.resolver(0).Block(q.Name).Metric, false)
		cd.request(k, &q, len(raw))
		cd.cache(k, cdHitSuccess)
		cd.response(k, 0, true, 120, -1)
		if i%64 == 63 {
			cd.flush(s.cdz.n, 30000)
		}
	}
}

// countByBlocks makes a server count under zones as the daemon does: its
// Resolver serves by an internal/blocks table holding them (over
// zoneForward), and CoreDNSZone reads the label of a policy's block.
func countByBlocks(tb testing.TB, zones []CDZone) func(*Config) {
	tb.Helper()
	var names []string
	for _, z := range zones {
		names = append(names, z.Name)
	}
	pol := resolve.Policy{TTL: cache.Policy{SuccessMax: time.Minute, DenialMax: time.Minute}}
	v, err := blocks.CompileView(blocks.Sources{Default: pol, Policy: func([]byte) *resolve.Policy { return &pol }, Metrics: names})
	if err != nil {
		tb.Fatal(err)
	}
	res := newResolver(tb, (&zoneForward{}).forward, func(c *resolve.Config) { c.Blocks = v.Block })
	return func(c *Config) {
		c.Resolver, c.CoreDNSZones = res, zones
	}
}
