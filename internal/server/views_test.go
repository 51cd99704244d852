package server

import (
	"context"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// viewQuestion is a parsed A query for name.
func viewQuestion(t *testing.T, name string) *wire.Query {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q := new(wire.Query)
	if err := wire.ParseQuery(raw, q); err != nil {
		t.Fatal(err)
	}
	return q
}

// A resolver replaced by SetViews keeps counting for one generation (its
// misses may still finish), then its counts move into the server's
// retired total and it is let go: counters never go back, and reloads do
// not keep every old resolver alive.
func TestSetViewsRetiresReplacedResolvers(t *testing.T) {
	z := &zoneForward{}
	first := newResolver(t, z.forward)
	s, err := New(Config{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Resolver: first})
	if err != nil {
		t.Fatal(err)
	}
	q := viewQuestion(t, "a.example.")
	if _, _, err := first.Resolve(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if got := s.Snapshot().CacheMisses; got != 1 {
		t.Fatalf("misses %d, want 1", got)
	}
	second, third := newResolver(t, z.forward), newResolver(t, z.forward)
	if err := s.SetViews([]*resolve.Resolver{second}, nil); err != nil {
		t.Fatal(err)
	}
	// A miss that was in flight on the replaced resolver still counts.
	if _, _, err := first.Resolve(context.Background(), viewQuestion(t, "b.example.")); err != nil {
		t.Fatal(err)
	}
	if got, n := s.Snapshot().CacheMisses, len(s.allRes); got != 2 || n != 2 {
		t.Fatalf("after one swap: misses %d, resolvers kept %d; want 2 and 2", got, n)
	}
	if err := s.SetViews([]*resolve.Resolver{third}, nil); err != nil {
		t.Fatal(err)
	}
	if got, n := s.Snapshot().CacheMisses, len(s.allRes); got != 2 || n != 2 {
		t.Fatalf("after two swaps: misses %d, resolvers kept %d; want 2 and 2 (second and third)", got, n)
	}
	for _, r := range s.allRes {
		if r == first {
			t.Fatal("the resolver replaced two swaps ago is still kept")
		}
	}
}
