package cache

import (
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func TestDropZoneRemovesOnlyThatZone(t *testing.T) {
	c := New(Config{Shards: 4})
	names := []string{
		"stub.example.", "a.stub.example.", "B.A.Stub.Example.", // in the zone
		"xstub.example.", "example.", "other.example.", "www.example.com.", // not
	}
	for _, name := range names {
		_, q := query(t, name, dns.TypeA, 0, false)
		e, err := Build(answer(t, name, dns.TypeA, 0, []string{name + " 30 IN A 1.1.1.1"}, nil, false), q, externalP, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		if !c.Put(e) {
			t.Fatalf("%s not stored", name)
		}
	}
	before := c.Stats()
	zone, _ := wire.AppendNameWire(nil, "STUB.example.")
	if n := c.DropZone(zone); n != 3 {
		t.Fatalf("dropped %d entries, want 3", n)
	}
	for i, name := range names {
		_, q := query(t, name, dns.TypeA, 0, false)
		e, _, _ := c.Lookup(q, t0)
		if got, want := e != nil, i >= 3; got != want {
			t.Fatalf("%s: present %v, want %v", name, got, want)
		}
	}
	st := c.Stats()
	if st.Entries[Success] != 4 || st.Bytes >= before.Bytes || st.Evictions != 0 {
		t.Fatalf("gauges after drop: %+v (before %+v)", st, before)
	}
	if n := c.DropZone([]byte{0}); n != 4 || c.Stats().Bytes != 0 {
		t.Fatalf("root zone dropped %d, bytes left %d", n, c.Stats().Bytes)
	}
}
