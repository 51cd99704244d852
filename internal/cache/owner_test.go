package cache

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// entryFor builds an entry answering name, with its query.
func entryFor(t testing.TB, name string) (*Entry, *wire.Query) {
	t.Helper()
	_, q := query(t, name, dns.TypeA, 0, false)
	e, err := Build(answer(t, name, dns.TypeA, 0, []string{name + " 300 IN A 192.0.2.1"}, nil, false), q, externalP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	return e, q
}

// TestOneClientsChurnCannotPushOutTheOthers: issue 37's cache row. One
// client asks a stream of new names, each many times (2,500 a second,
// 1-12 times each, several cache sizes over), while another asks its
// working set again and again: the other's hit ratio stays over 95%
// (it was 40% when eviction kept the most-hit entries), since the heavy
// client's new names push out its own, and a hit counts a client once.
func TestOneClientsChurnCannotPushOutTheOthers(t *testing.T) {
	c := New(Config{})
	churner, victim := netip.MustParseAddr("10.99.7.1"), netip.MustParseAddr("10.99.0.11")
	const working = 300
	vq := make([]*wire.Query, working)
	for i := range vq {
		e, q := entryFor(t, fmt.Sprintf("hot%d.example.", i))
		q.Client = victim
		c.PutFor(e, victim)
		vq[i] = q
	}
	asked, misses := 0, 0
	ask := func(q *wire.Query, now int64) bool {
		e, _ := c.Get(q, now)
		return e != nil
	}
	now := t0
	v := 0
	for n := range 30000 { // 12 s of 2,500 new names a second
		e, q := entryFor(t, fmt.Sprintf("c%d.churn.example.", n))
		q.Client = churner
		c.PutFor(e, churner)
		for range n % 12 {
			ask(q, now)
		}
		if n%25 == 0 { // the victim: 100 questions a second
			now += int64(10e6)
			q := vq[v%working]
			v++
			asked++
			if !ask(q, now) {
				misses++
				e, _ := entryFor(t, wire.NameString(q.Name))
				c.PutFor(e, victim)
			}
		}
	}
	ratio := 100 * (1 - float64(misses)/float64(asked))
	t.Logf("victim: %d asked, %d misses, hit ratio %.2f%%; %+v", asked, misses, ratio, c.Stats())
	if ratio < 95 {
		t.Fatalf("the victim's hit ratio %.2f%% under churn, want >= 95%%", ratio)
	}
}

// TestPopularityCountsClients: one client hitting its entry many times
// makes it no more popular than once; an entry hit by three clients is
// kept over one hit by one client, however often.
func TestPopularityCountsClients(t *testing.T) {
	c := New(Config{SuccessCapacity: 3, Shards: 1})
	names := []string{"one.example.", "three.example.", "other.example."}
	qs := map[string]*wire.Query{}
	for _, n := range names {
		e, q := entryFor(t, n)
		c.Put(e)
		qs[n] = q
	}
	for i := range 50 {
		qs["one.example."].Client = netip.AddrFrom4([4]byte{10, 0, 0, 1})
		c.Get(qs["one.example."], t0+int64(i))
	}
	for i := range 3 {
		q := qs["three.example."]
		q.Client = netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})
		c.Get(q, t0)
	}
	q := qs["other.example."]
	q.Client = netip.AddrFrom4([4]byte{10, 0, 2, 1})
	c.Get(q, t0+100) // the most recent: one.example. goes (as popular, less recent)
	e, _ := entryFor(t, "new.example.")
	c.Put(e)
	if get(c, qs["one.example."], t0+101) != nil || get(c, qs["three.example."], t0+101) == nil {
		t.Fatal("the entry one client hit 50 times outlived the one three clients hit")
	}
}

// TestHeavyOwnerMakesRoomFromItsOwn: in a full shard, the owner holding
// more than its equal part gives its own entry for its insert, and for a
// light owner's insert too; a light owner's entries stay.
func TestHeavyOwnerMakesRoomFromItsOwn(t *testing.T) {
	c := New(Config{SuccessCapacity: 10, Shards: 1}) // a shard holds 20 (shardSkew), the cache 10
	heavy, light := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var lq []*wire.Query
	for i := range 3 {
		e, q := entryFor(t, fmt.Sprintf("l%d.example.", i))
		c.PutFor(e, light)
		lq = append(lq, q)
	}
	for i := range 50 {
		e, _ := entryFor(t, fmt.Sprintf("h%d.example.", i))
		c.PutFor(e, heavy)
	}
	for _, q := range lq {
		if get(c, q, t0) == nil {
			t.Fatalf("%s: the light owner's entry went for the heavy one's", wire.NameString(q.Name))
		}
	}
	e, _ := entryFor(t, "l3.example.")
	c.PutFor(e, light)
	s := &c.shards[0]
	if s.owners[light].count[Success] != 4 || s.owners[heavy].count[Success] != 6 || len(s.owners) != 2 {
		t.Fatalf("light %d heavy %d owners %d", s.owners[light].count[Success], s.owners[heavy].count[Success], len(s.owners))
	}
	// Put (an import, a prefetch) keeps the owner of what it replaces.
	e, _ = entryFor(t, "l0.example.")
	c.Put(e)
	if e.own.key != light {
		t.Fatalf("a replacement's owner %v, want the light one", e.own.key)
	}
	// Gone with its last entry.
	c.DropZone([]byte("\x07example\x00"))
	if len(s.owners) != 0 || s.bytes != 0 {
		t.Fatalf("owners %d bytes %d after every entry went", len(s.owners), s.bytes)
	}
}
