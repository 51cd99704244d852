package cache

import (
	"fmt"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// BenchmarkCacheHit measures the whole hit path of one query: parse the
// client's packet, look it up, write the answer. It must not allocate.
func BenchmarkCacheHit(b *testing.B) {
	c := New(Config{})
	raw, q := query(b, "svc-1.default.svc.cluster.local.", dns.TypeA, 1232, false)
	e, err := Build(answer(b, "svc-1.default.svc.cluster.local.", dns.TypeA, 0, []string{"svc-1.default.svc.cluster.local. 30 IN A 10.96.0.10"}, nil, true), q, clusterP, 0, t0)
	if err != nil {
		b.Fatal(err)
	}
	c.Put(e)
	out := make([]byte, 0, 1232)
	var pq wire.Query
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := wire.ParseQuery(raw, &pq); err != nil {
			b.Fatal(err)
		}
		hit, _ := c.Get(&pq, t0)
		if hit == nil {
			b.Fatal("miss")
		}
		out = hit.Write(out[:0], &pq, t0, 1232, 1232)
	}
}

// BenchmarkCacheHitParallel is the same with every core hitting 20 names.
func BenchmarkCacheHitParallel(b *testing.B) {
	c := New(Config{})
	var raws [][]byte
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("name-%d.example.", i)
		raw, q := query(b, name, dns.TypeA, 1232, false)
		e, _ := Build(answer(b, name, dns.TypeA, 0, []string{name + " 300 IN A 192.0.2.1"}, nil, true), q, externalP, 0, t0)
		c.Put(e)
		raws = append(raws, raw)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]byte, 0, 1232)
		var pq wire.Query
		i := 0
		for pb.Next() {
			_ = wire.ParseQuery(raws[i%len(raws)], &pq)
			if hit, _ := c.Get(&pq, t0); hit != nil {
				out = hit.Write(out[:0], &pq, t0, 1232, 1232)
			}
			i++
		}
	})
}

// BenchmarkEntryBytes reports the memory accounted per typical entry.
func BenchmarkEntryBytes(b *testing.B) {
	c := New(Config{SuccessCapacity: 1 << 30})
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("host-%d.example.", i)
		_, q := query(b, name, dns.TypeA, 0, false)
		e, _ := Build(answer(b, name, dns.TypeA, 0, []string{name + " 300 IN A 192.0.2.1"}, nil, false), q, externalP, 0, t0)
		c.Put(e)
	}
	st := c.Stats()
	if st.Entries[Success] > 0 {
		b.ReportMetric(float64(st.Bytes)/float64(st.Entries[Success]), "bytes/entry")
	}
}

// BenchmarkCacheHitTruncated is the hit path for a headless Service of
// 100 addresses asked by a client without EDNS: the answer is cut at the
// last whole record that fits in 512 bytes. It must not allocate either.
func BenchmarkCacheHitTruncated(b *testing.B) {
	c := New(Config{})
	const name = "web.default.svc.cluster.local."
	var ans []string
	for i := 0; i < 100; i++ {
		ans = append(ans, fmt.Sprintf("%s 30 IN A 10.244.0.%d", name, i+1))
	}
	raw, q := query(b, name, dns.TypeA, 0, false)
	e, err := Build(answer(b, name, dns.TypeA, 0, ans, nil, true), q, clusterP, 0, t0)
	if err != nil {
		b.Fatal(err)
	}
	c.Put(e)
	out := make([]byte, 0, 4096)
	var pq wire.Query
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := wire.ParseQuery(raw, &pq); err != nil {
			b.Fatal(err)
		}
		hit, _ := c.Get(&pq, t0)
		if hit == nil {
			b.Fatal("miss")
		}
		out = hit.Write(out[:0], &pq, t0, int(pq.Size), 1232)
	}
	if wire.Flags(out)&wire.FlagTC == 0 || len(out) > 512 {
		b.Fatalf("not truncated to 512: %d bytes", len(out))
	}
}

// BenchmarkPutFull is the cache's part of a miss under a storm of new
// names: a Put into a full cache (the stock 9984 entries) whose entries
// are all younger than their TTL, so every Put evicts one.
func BenchmarkPutFull(b *testing.B) {
	c := New(Config{})
	const pool = 1 << 16 // well above the capacity: a Put rarely finds its own entry
	es := make([]*Entry, pool)
	for i := range es {
		name := fmt.Sprintf("u%d.default.svc.cluster.local.", i)
		_, q := query(b, name, dns.TypeA, 0, false)
		e, err := Build(answer(b, name, dns.TypeA, 0, []string{name + " 30 IN A 10.96.0.10"}, nil, false), q, clusterP, 0, t0)
		if err != nil {
			b.Fatal(err)
		}
		es[i] = e
	}
	for _, e := range es {
		c.Put(e)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Put(es[i%pool])
	}
	b.StopTimer()
	if st := c.Stats(); st.Entries[Success] > 9984+int64(len(c.shards)) {
		b.Fatalf("%d entries in a 9984-entry cache", st.Entries[Success])
	}
}

// BenchmarkBuild is the cache's part of a miss: building the entry from the
// upstream's answer. "1rr" is a single A record, "100rr-uncompressed" a
// headless Service of 100 addresses as kube-dns sends it over TCP (no name
// compression).
func BenchmarkBuild(b *testing.B) {
	const name = "web.default.svc.cluster.local."
	var ans []string
	for i := 0; i < 100; i++ {
		ans = append(ans, fmt.Sprintf("%s 30 IN A 10.244.0.%d", name, i+1))
	}
	one := answer(b, name, dns.TypeA, 0, ans[:1], nil, true)
	m := unpack(b, answer(b, name, dns.TypeA, 0, ans, nil, false))
	m.Compress = false
	hundred, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	_, q := query(b, name, dns.TypeA, 0, false)
	for _, c := range []struct {
		name string
		resp []byte
	}{{"1rr", one}, {"100rr-uncompressed", hundred}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Build(c.resp, q, clusterP, 0, t0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
