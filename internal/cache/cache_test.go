package cache

import (
	"fmt"
	"math"
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

// TestSweepRemovesEveryExpiredEntryOnce: a full shard with expired entries
// gives them all back in one sweep when it needs room, and sweeps again only
// after sweepEvery; in between a sample that meets an expired entry takes it.
func TestSweepRemovesEveryExpiredEntryOnce(t *testing.T) {
	c := New(Config{SuccessCapacity: 8, Shards: 1})
	add := func(name string, ttl int, now int64) {
		t.Helper()
		_, q := query(t, name, dns.TypeA, 0, false)
		e, err := Build(answer(t, name, dns.TypeA, 0, []string{fmt.Sprintf("%s %d IN A 1.1.1.1", name, ttl)}, nil, false), q, externalP, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		if !c.Put(e) {
			t.Fatalf("%s not stored", name)
		}
	}
	has := func(name string, now int64) bool {
		_, q := query(t, name, dns.TypeA, 0, false)
		return get(c, q, now) != nil
	}
	s := &c.shards[0]
	// The shard's capacity is 2×8 (shardSkew), the global one 8.
	for i := 0; i < 3; i++ {
		add(fmt.Sprintf("short%d.example.", i), 1, t0)
	}
	for i := 0; i < 5; i++ {
		add(fmt.Sprintf("long%d.example.", i), 20, t0)
	}
	if s.soonest[Success] != t0+int64(time.Second) {
		t.Fatalf("soonest %d, want the short entries' expiry %d", s.soonest[Success]-t0, int64(time.Second))
	}
	later := t0 + int64(2*time.Second)
	add("new.example.", 300, later)
	st := c.Stats()
	if st.Evictions != 3 || st.Entries[Success] != 6 {
		t.Fatalf("after the sweep: %+v, want the 3 expired entries gone and nothing else", st)
	}
	for i := 0; i < 5; i++ {
		if !has(fmt.Sprintf("long%d.example.", i), later) {
			t.Fatalf("long%d evicted although expired entries were there", i)
		}
	}
	if s.soonest[Success] != t0+int64(20*time.Second) || s.lastSweep[Success] != later {
		t.Fatalf("soonest %d lastSweep %d after the sweep", s.soonest[Success]-t0, s.lastSweep[Success]-t0)
	}
	// Full again, nothing expired: a sample decides, no sweep (the bound
	// says there is nothing to find).
	add("new2.example.", 300, later)
	add("new3.example.", 300, later)
	add("new4.example.", 300, later+1)
	if st := c.Stats(); st.Evictions != 4 || s.lastSweep[Success] != later {
		t.Fatalf("stats %+v, last sweep %d: want one sampled eviction and no sweep", st, s.lastSweep[Success]-t0)
	}
	// An expired entry that arrives within sweepEvery of the last sweep:
	// no sweep yet, but a sample that meets it takes it. The sample's
	// order is random, so the shard holds just one expired entry and one
	// live one: a sample of both meets the expired one in either order.
	c = New(Config{SuccessCapacity: 2, Shards: 1})
	s = &c.shards[0]
	add("a.example.", 1, t0)
	add("b.example.", 300, t0)
	s.lastSweep[Success] = t0 + int64(1500*time.Millisecond)
	add("c.example.", 300, t0+int64(2*time.Second)) // within sweepEvery of the last sweep
	if has("a.example.", t0+int64(2*time.Second)) || !has("b.example.", t0+int64(2*time.Second)) {
		t.Fatal("the sample did not take the expired entry")
	}
	if s.lastSweep[Success] != t0+int64(1500*time.Millisecond) {
		t.Fatal("swept within sweepEvery of the last sweep")
	}
	// Emptying the kind resets the bound.
	if n := c.DropZone([]byte("\x07example\x00")); n != 2 {
		t.Fatalf("dropped %d entries, want 2", n)
	}
	if st := c.Stats(); st.Entries[Success] != 0 || s.soonest[Success] != math.MaxInt64 {
		t.Fatalf("an emptied kind: %+v, soonest %d", st, s.soonest[Success])
	}
}
