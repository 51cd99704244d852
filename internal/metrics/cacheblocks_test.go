package metrics

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// TestCacheSeriesPerBlock: with CacheBlocks each block's entries are
// shown under its own server and zones (joined by "," as CoreDNS joins a
// block's zones), counted exactly by the entries' tags; a block without
// cache has no series; counters appear with their first event.
func TestCacheSeriesPerBlock(t *testing.T) {
	c := cache.New(cache.Config{})
	put := func(name string, tag uint16, rcode int) {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		raw, _ := m.Pack()
		var q wire.Query
		if err := wire.ParseQuery(raw, &q); err != nil {
			t.Fatal(err)
		}
		m.Response, m.Rcode = true, rcode
		if rcode == dns.RcodeSuccess {
			rr, _ := dns.NewRR(name + " 30 IN A 192.0.2.1")
			m.Answer = []dns.RR{rr}
		} else {
			soa, _ := dns.NewRR("test. 30 IN SOA ns.test. h.test. 1 2 3 4 30")
			m.Ns = []dns.RR{soa}
		}
		resp, _ := m.Pack()
		e, err := cache.Build(resp, &q, cache.Policy{SuccessMax: 3600e9, DenialMax: 3600e9, Tag: tag}, 0, 1)
		if err != nil || !c.Put(e) {
			t.Fatalf("put %s: %v", name, err)
		}
	}
	put("a.cluster.local.", 1, dns.RcodeSuccess)
	put("b.cluster.local.", 1, dns.RcodeNameError)
	put("www.example.org.", 3, dns.RcodeSuccess)
	m := New(nil, nil)
	m.CoreDNS(CoreDNSConfig{
		Servers: func() []string { return []string{"dns://169.254.20.10:53", "dns://10.0.0.10:53"} },
		Cache:   c,
		CacheBlocks: func() []CacheBlock {
			return []CacheBlock{
				{Server: 0, Zones: "cluster.local.,in-addr.arpa.", Cache: true},
				{Server: 0, Zones: "corp.example.", Cache: false},
				{Server: 1, Zones: ".", Cache: true},
			}
		},
	})
	want := `
# HELP coredns_cache_entries The number of elements in the cache.
# TYPE coredns_cache_entries gauge
coredns_cache_entries{server="dns://10.0.0.10:53",type="denial",view="",zones="."} 0
coredns_cache_entries{server="dns://10.0.0.10:53",type="success",view="",zones="."} 1
coredns_cache_entries{server="dns://169.254.20.10:53",type="denial",view="",zones="cluster.local.,in-addr.arpa."} 1
coredns_cache_entries{server="dns://169.254.20.10:53",type="success",view="",zones="cluster.local.,in-addr.arpa."} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "coredns_cache_entries", "coredns_cache_prefetch_total", "coredns_cache_evictions_total"); err != nil {
		t.Error(err)
	}
}
