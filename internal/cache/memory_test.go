package cache

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The heap may hold more than the byte budget when the cache is full: map
// growth slack (Go maps double), shard headers, and the allocator's
// per-size-class spans. Entry.size already counts an estimate of the map
// slot and struct, so measured here the heap stays just under the budget
// (262 heap bytes per A-record entry against 270 accounted); the stated
// bound allows 15% plus 8 MiB.
const (
	memoryOverheadPercent = 15
	memoryOverheadFixed   = 8 << 20
)

// TestMemoryBound fills the cache with 1,000,000 distinct names and checks
// the heap after GC stays within the byte budget plus the stated overhead.
func TestMemoryBound(t *testing.T) {
	if raceEnabled {
		t.Skip("memory is measured without the race detector (make test runs it so)")
	}
	const budget = 32 << 20
	const names = 1_000_000
	// One template answer; each name is a fixed-width rewrite of it, so
	// building a million answers is cheap.
	tmpl := answer(t, "h0000000.example.", dns.TypeA, 0, []string{"h0000000.example. 300 IN A 192.0.2.1"}, nil, false)
	raw, _ := query(t, "h0000000.example.", dns.TypeA, 0, false)
	digits := func(b []byte, i int) {
		copy(b[wire.HeaderLen+2:], fmt.Sprintf("%07d", i))
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	c := New(Config{SuccessCapacity: 2 * names, DenialCapacity: 1, MaxBytes: budget})
	resp := make([]byte, len(tmpl))
	qb := make([]byte, len(raw))
	var q wire.Query
	for i := 0; i < names; i++ {
		copy(resp, tmpl)
		copy(qb, raw)
		digits(resp, i)
		digits(qb, i)
		if err := wire.ParseQuery(qb, &q); err != nil {
			t.Fatal(err)
		}
		e, err := Build(resp, &q, externalP, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		c.Put(e)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	st := c.Stats()
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	limit := budget + int64(budget*memoryOverheadPercent/100) + memoryOverheadFixed
	t.Logf("%d entries, %d accounted bytes (%.0f B/entry), heap %d bytes (%.0f B/entry), evictions %d",
		st.Entries[Success], st.Bytes, float64(st.Bytes)/float64(st.Entries[Success]), heap, float64(heap)/float64(st.Entries[Success]), st.Evictions)
	if st.Bytes > budget {
		t.Fatalf("accounted %d bytes over the %d budget", st.Bytes, budget)
	}
	if heap > limit {
		t.Fatalf("heap grew %d bytes for a %d budget (limit %d)", heap, budget, limit)
	}
	runtime.KeepAlive(c)
}
