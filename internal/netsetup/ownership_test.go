package netsetup

import (
	"net/netip"
	"slices"
	"testing"
)

func TestOwnershipMergeAndInherit(t *testing.T) {
	a, b, c := netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("fd00::10"), netip.MustParseAddr("10.0.0.1")
	m := Ownership{Addrs: []netip.Addr{a}}.Merge(Ownership{LinkCreated: true, Addrs: []netip.Addr{a, b}})
	if !m.LinkCreated || !slices.Equal(m.Addrs, []netip.Addr{a, b}) {
		t.Fatalf("merge: %+v", m)
	}
	s, err := New(Config{Addrs: []netip.Addr{a, b}, SetupInterface: true})
	if err != nil {
		t.Fatal(err)
	}
	if o := s.Ownership(); o.LinkCreated || len(o.Addrs) != 0 {
		t.Fatalf("fresh setup owns %+v", o)
	}
	s.Inherit(Ownership{Addrs: []netip.Addr{b, c}})
	if o := s.Ownership(); o.LinkCreated || !slices.Equal(o.Addrs, []netip.Addr{b}) {
		t.Fatalf("after inheriting %v (%v is not ours): %+v", []netip.Addr{b, c}, c, o)
	}
	s.Inherit(Ownership{LinkCreated: true})
	if !s.Ownership().LinkCreated {
		t.Fatal("link ownership not inherited")
	}
}
