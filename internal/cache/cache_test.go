package cache

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// TestCapacityEvictsLeastUsed: with every entry of the shard sampled, the
// one never hit since it was stored goes first.
func TestCapacityEvictsLeastUsed(t *testing.T) {
	c := New(Config{SuccessCapacity: 4, DenialCapacity: 4, Shards: 1})
	put := func(name string) {
		_, q := query(t, name, dns.TypeA, 0, false)
		e, err := Build(answer(t, name, dns.TypeA, 0, []string{name + " 30 IN A 1.1.1.1"}, nil, false), q, externalP, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		c.Put(e)
	}
	get := func(name string) bool {
		_, q := query(t, name, dns.TypeA, 0, false)
		return get(c, q, t0) != nil
	}
	for i := 0; i < 4; i++ {
		put(fmt.Sprintf("n%d.example.", i))
	}
	for _, n := range []string{"n0", "n2", "n3"} { // n1 is never asked for
		get(n + ".example.")
	}
	put("n4.example.")
	if get("n1.example.") {
		t.Fatal("the entry nobody asked for survived")
	}
	for _, n := range []string{"n0", "n2", "n3", "n4"} {
		if !get(n + ".example.") {
			t.Fatalf("%s evicted", n)
		}
	}
	st := c.Stats()
	if st.Entries[Success] != 4 || st.Evictions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEvictsExpiredFirst(t *testing.T) {
	c := New(Config{SuccessCapacity: 3, Shards: 1})
	add := func(name string, ttl int, now int64) {
		_, q := query(t, name, dns.TypeA, 0, false)
		e, _ := Build(answer(t, name, dns.TypeA, 0, []string{fmt.Sprintf("%s %d IN A 1.1.1.1", name, ttl)}, nil, false), q, externalP, 0, now)
		c.Put(e)
	}
	add("old.example.", 30, t0)
	add("short.example.", 1, t0)
	add("new.example.", 30, t0)
	later := t0 + int64(2*time.Second)
	add("x.example.", 30, later)
	_, q := query(t, "old.example.", dns.TypeA, 0, false)
	if get(c, q, later) == nil {
		t.Fatal("the least recently used entry was evicted although an expired one was there")
	}
}

func TestByteBudget(t *testing.T) {
	const budget = 1 << 20
	c := New(Config{SuccessCapacity: 1 << 20, MaxBytes: budget, Shards: 4})
	for i := 0; i < 20000; i++ {
		name := fmt.Sprintf("host-%d.example.", i)
		_, q := query(t, name, dns.TypeA, 0, false)
		e, _ := Build(answer(t, name, dns.TypeA, 0, []string{name + " 30 IN A 1.1.1.1"}, nil, false), q, externalP, 0, t0)
		c.Put(e)
	}
	st := c.Stats()
	if st.Bytes > budget {
		t.Fatalf("%d bytes held, budget %d", st.Bytes, budget)
	}
	if st.Evictions == 0 || st.Entries[Success] == 0 {
		t.Fatalf("stats %+v", st)
	}
	// The gauges are exact: they equal the sum over what is stored.
	var sum int64
	var n int64
	for i := range c.shards {
		for _, e := range c.shards[i].items {
			sum += e.size()
			n++
		}
	}
	if sum != st.Bytes || n != st.Entries[Success] {
		t.Fatalf("gauges %d bytes/%d entries, actual %d/%d", st.Bytes, st.Entries[Success], sum, n)
	}
}

func get(c *Cache, q *wire.Query, now int64) *Entry {
	e, _ := c.Get(q, now)
	return e
}

// TestWorkingSetThatFitsNeverThrashes: 9,500 names in a 9,984-entry cache
// split over 64 shards. Hashing puts more than the fair share in some
// shards; with per-shard hard limits those shards would miss every name
// on every cycle. The limits are global, so the second cycle is all hits.
func TestWorkingSetThatFitsNeverThrashes(t *testing.T) {
	c := New(Config{SuccessCapacity: 9984})
	var qs []*wire.Query
	for i := 0; i < 9500; i++ {
		name := fmt.Sprintf("n%d.example.", i)
		_, q := query(t, name, dns.TypeA, 0, false)
		e, _ := Build(answer(t, name, dns.TypeA, 0, []string{name + " 300 IN A 192.0.2.1"}, nil, false), q, externalP, 0, t0)
		c.Put(e)
		qs = append(qs, q)
	}
	for _, q := range qs {
		if get(c, q, t0) == nil {
			t.Fatalf("%s evicted although the working set fits: %+v", wire.NameString(q.Name), c.Stats())
		}
	}
	if st := c.Stats(); st.Evictions != 0 {
		t.Fatalf("%d evictions", st.Evictions)
	}
}

// TestCyclicWorkloadSlightlyLargerThanTheCache: clients walk 10,000 names
// in a cache of 9,984. Strict LRU would miss every query (each miss evicts
// the name asked for next); sampled eviction keeps the miss rate near the
// overflow.
func TestCyclicWorkloadSlightlyLargerThanTheCache(t *testing.T) {
	c := New(Config{SuccessCapacity: 9984})
	var qs []*wire.Query
	var resps [][]byte
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("n%d.example.", i)
		_, q := query(t, name, dns.TypeA, 0, false)
		qs = append(qs, q)
		resps = append(resps, answer(t, name, dns.TypeA, 0, []string{name + " 300 IN A 192.0.2.1"}, nil, false))
	}
	misses := 0
	for cycle := 0; cycle < 5; cycle++ {
		for i, q := range qs {
			if get(c, q, t0) == nil {
				if cycle >= 2 {
					misses++
				}
				e, _ := Build(resps[i], q, externalP, 0, t0)
				c.Put(e)
			}
		}
	}
	rate := float64(misses) / float64(3*len(qs))
	t.Logf("miss rate over cycles 3-5: %.2f%%", 100*rate)
	if rate > 0.05 {
		t.Fatalf("miss rate %.1f%%: the cache thrashes on a cyclic workload", 100*rate)
	}
}
