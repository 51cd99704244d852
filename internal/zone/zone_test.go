package zone

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func wname(t testing.TB, s string) []byte {
	t.Helper()
	w, ok := wire.AppendNameWire(nil, s)
	if !ok {
		t.Fatalf("%q does not pack", s)
	}
	return w
}

// longest is the reference: the longest zone holding name, by scanning.
func longest(zones []string, name string) string {
	best := ""
	for _, z := range zones {
		if Holds(z, name) && (best == "" || len(z) > len(best)) {
			best = z
		}
	}
	return best
}

// TestLookupIsLongestZone: the table gives every name the value of the
// longest zone holding it (case-insensitively), the root's or the default
// when none, as a scan of every zone does.
func TestLookupIsLongestZone(t *testing.T) {
	zones := []string{"cluster.local.", "svc.cluster.local.", "in-addr.arpa.", "10.in-addr.arpa.", "Example.COM.",
		"a.b.c.d.e.f.g.h.example.com.", "local."}
	for _, withRoot := range []bool{false, true} {
		b := NewBuilder("default")
		for _, z := range zones {
			if err := b.Set(z, strings.ToLower(z)); err != nil {
				t.Fatal(err)
			}
		}
		all := zones
		if withRoot {
			if err := b.Set(".", "."); err != nil {
				t.Fatal(err)
			}
			all = append(all[:len(all):len(all)], ".")
		}
		tb := b.Table()
		for _, name := range []string{"a.svc.cluster.local.", "svc.cluster.local.", "x.cluster.local.", "cluster.local.", "local.",
			"foo.local.", "1.2.10.in-addr.arpa.", "1.2.11.in-addr.arpa.", "example.com.", "WWW.EXAMPLE.com.", "www.example.org.",
			"z.a.b.c.d.e.f.g.h.example.com.", "b.c.d.e.f.g.h.example.com.", ".", "com."} {
			want := longest(lowerAll(all), strings.ToLower(name))
			if want == "" {
				want = "default"
			}
			got := tb.Lookup(wname(t, name))
			if got != want {
				t.Errorf("root %v: %s: %q, want %q", withRoot, name, got, want)
			}
			if s := tb.LookupString(strings.ToLower(name)); s != want {
				t.Errorf("root %v: LookupString %s: %q, want %q", withRoot, name, s, want)
			}
		}
	}
}

func lowerAll(zs []string) []string {
	out := make([]string, len(zs))
	for i, z := range zs {
		out[i] = strings.ToLower(z)
	}
	return out
}

// TestLookupMalformed: a name that is not a well-formed wire name gets
// the default, never a panic.
func TestLookupMalformed(t *testing.T) {
	tb, err := NewTable("def", []string{"example.com."}, []string{"ex"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range [][]byte{nil, {}, {3, 'a', 'b'}, {7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm'}, {64}, {0xc0, 0x0c}} {
		if got := tb.Lookup(n); got != "def" {
			t.Errorf("%v: %q", n, got)
		}
	}
	long := make([]byte, 0, 300)
	for len(long) < 280 {
		long = append(long, 1, 'a')
	}
	long = append(long, 0)
	if got := tb.Lookup(long); got != "def" {
		t.Errorf("a 281-byte name: %q", got)
	}
}

// TestLookupAllocatesNothing: a lookup on the hot path allocates nothing.
func TestLookupAllocatesNothing(t *testing.T) {
	tb := benchTable(1000)
	name := wname(t, "WWW.Zone500.Example.")
	if n := testing.AllocsPerRun(100, func() { tb.Lookup(name) }); n != 0 {
		t.Errorf("%v allocations per lookup", n)
	}
}

func TestSetFirstAndGet(t *testing.T) {
	b := NewBuilder(0)
	_ = b.SetFirst("a.example.", 1)
	_ = b.SetFirst("A.example", 2)
	_ = b.Set(".", 9)
	tb := b.Table()
	if v, ok := tb.Get("a.example."); !ok || v != 1 {
		t.Errorf("Get: %v %v", v, ok)
	}
	if v, ok := tb.Get("."); !ok || v != 9 || tb.Default() != 9 {
		t.Errorf("root: %v %v %v", v, ok, tb.Default())
	}
	if z := tb.Zones(); len(z) != 2 || z[0] != "a.example." || z[1] != "." {
		t.Errorf("zones %v", z)
	}
	if _, root := tb.LookupStringZone("x.org."); !root {
		t.Error("the root holds every name")
	}
}

func benchTable(n int) *Table[int] {
	b := NewBuilder(-1)
	for i := 0; i < n; i++ {
		_ = b.Set(fmt.Sprintf("zone%d.example.", i), i)
	}
	_ = b.Set(".", -2)
	return b.Table()
}

// BenchmarkLookup looks a name up in tables of 1, 1,000 and 20,000 zones:
// the cost is the name's labels', not the table's size (the rows stay
// within 2x of each other).
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{1, 1000, 20000} {
		tb := benchTable(n)
		for _, c := range []struct{ what, name string }{
			{"hit", "pod-1.Zone0.example."},
			{"miss", "www.kubernetes.io."},
		} {
			name := wname(b, c.name)
			b.Run(fmt.Sprintf("zones=%d/%s", n, c.what), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					tb.Lookup(name)
				}
			})
		}
	}
}
