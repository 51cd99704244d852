package cache

import (
	"testing"

	"github.com/miekg/dns"
)

// The view is part of the key: the same question stored in two views
// gives each view its own answer, and neither sees the other's.
func TestViewsKeepSeparateAnswers(t *testing.T) {
	c := New(Config{})
	for v, addr := range []string{"192.0.2.1", "192.0.2.2"} {
		_, q := query(t, "x.example.", dns.TypeA, 0, false)
		q.View = uint8(v)
		e, err := Build(answer(t, "x.example.", dns.TypeA, 0, []string{"x.example. 30 IN A " + addr}, nil, false), q, externalP, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		c.Put(e)
	}
	for v, addr := range []string{"192.0.2.1", "192.0.2.2", ""} {
		_, q := query(t, "x.example.", dns.TypeA, 0, false)
		q.View = uint8(v)
		e := get(c, q, t0)
		switch {
		case addr == "" && e != nil:
			t.Errorf("view %d: an answer of another view", v)
		case addr != "":
			m := new(dns.Msg)
			if e == nil || m.Unpack(e.msg) != nil || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != addr {
				t.Errorf("view %d: %v", v, m)
			}
		}
	}
	if st := c.Stats(); st.Entries[Success] != 2 {
		t.Errorf("entries %+v", st.Entries)
	}
}

// Entries, evictions and prefetches are counted per Policy.Tag, exactly.
func TestTagStats(t *testing.T) {
	c := New(Config{SuccessCapacity: 3, Shards: 1, PrefetchHits: 1})
	put := func(name string, tag uint16) {
		_, q := query(t, name, dns.TypeA, 0, false)
		pol := externalP
		pol.Tag = tag
		e, err := Build(answer(t, name, dns.TypeA, 0, []string{name + " 30 IN A 1.1.1.1"}, nil, false), q, pol, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		c.Put(e)
	}
	put("a.example.", 1)
	put("b.example.", 2)
	put("c.example.", 2)
	put("d.example.", 3) // evicts one of a, b, c (never hit: sampled)
	ts := c.TagStats()
	if len(ts) != 4 {
		t.Fatalf("tags %+v", ts)
	}
	var entries int64
	var evictions uint64
	for _, s := range ts {
		entries += s.Entries[Success]
		evictions += s.Evictions[Success]
	}
	if entries != 3 || evictions != 1 || ts[3].Entries[Success] != 1 {
		t.Errorf("tags %+v", ts)
	}
	// A hit in the last tenth of the life starts a prefetch, counted
	// under the entry's tag.
	_, q := query(t, "d.example.", dns.TypeA, 0, false)
	if _, pf := c.Get(q, t0+28e9); !pf {
		t.Fatal("no prefetch")
	}
	if ts := c.TagStats(); ts[3].Prefetches != 1 || ts[1].Prefetches+ts[2].Prefetches != 0 {
		t.Errorf("prefetches %+v", ts)
	}
	c.DropZone([]byte("\x07example\x00"))
	for i, s := range c.TagStats() {
		if s.Entries != [numKinds]int64{} {
			t.Errorf("tag %d after drop: %+v", i, s)
		}
	}
}
