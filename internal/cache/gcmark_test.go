package cache

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/miekg/dns"
)

// BenchmarkCollectFullCache is a collection of a heap that holds a full
// cache (the stock 9984 success entries plus as many denials) of typical
// answers: what marking the cache costs each collection. (Run it with
// GOMAXPROCS=1 to see one core's share, as on a node's loaded core. An
// Entry with its message and records in one allocation made this slower,
// 1.8-2.8 ms against 1.5-1.9: the collector scans every word of a
// pointerful object, so fewer, larger objects did not help; only entries
// without pointers would.)
func BenchmarkCollectFullCache(b *testing.B) {
	c := New(Config{})
	for i := 0; i < 2*9984; i++ {
		name := fmt.Sprintf("svc-%d.ns-%d.svc.cluster.local.", i, i%50)
		_, q := query(b, name, dns.TypeA, 0, false)
		var resp []byte
		if i%2 == 0 {
			resp = answer(b, name, dns.TypeA, 0, []string{name + " 30 IN A 10.96.0.10"}, nil, false)
		} else {
			resp = answer(b, name, dns.TypeA, 3, nil, []string{"cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30"}, false)
		}
		e, err := Build(resp, q, clusterP, 0, t0)
		if err != nil {
			b.Fatal(err)
		}
		c.Put(e)
	}
	runtime.GC()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.GC()
	}
	b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapObjects), "heap-objects")
	runtime.KeepAlive(c)
}
