// Package zone finds the zone a name is in: the longest of a set of zones
// holding it, as CoreDNS picks a server block. Every question of "which
// zone holds this name" asks it: a query's block (once, when it arrives),
// and, while a configuration is compiled, its routes, policies, chains
// and metric zones.
//
// A Table answers in time that grows with the name's labels, not with the
// number of zones: it keeps its zones in a map keyed by their lower-case
// wire form and looks up the name's suffixes, longest first, only at the
// label counts some zone has (a configuration with the cluster domain and
// the root asks one suffix of a name). A lookup of a wire name allocates
// nothing.
//
// It knows nothing of what the zones mean; it imports only the wire
// format.
package zone

import (
	"fmt"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Holds reports whether zone holds name: name is zone or below it. Both
// are lower-case FQDNs ("." is the root, which holds every name).
func Holds(zone, name string) bool {
	return zone == "." || name == zone || strings.HasSuffix(name, "."+zone) && zone != ""
}

// HoldsAny reports whether one of zones holds name (lower-case FQDNs).
func HoldsAny(zones []string, name string) bool {
	for _, z := range zones {
		if Holds(z, name) {
			return true
		}
	}
	return false
}

// Longest returns the longest of zones holding name (lower-case FQDNs),
// "" when none does.
func Longest(zones []string, name string) string {
	best := ""
	for _, z := range zones {
		if Holds(z, name) && len(z) > len(best) {
			best = z
		}
	}
	return best
}

// maxLabels is the most labels a wire name can have (255 bytes, each label
// at least two).
const maxLabels = 128

// Table gives a name the value of the longest of its zones holding it, or
// its default. Built whole by NewTable (or a Builder), never changed: safe
// for concurrent use.
type Table[T any] struct {
	m   map[string]T // by the zone's lower-case wire name
	def T            // the root's value, or the default
	// counts has bit n set when a zone of n labels (1 <= n < 64) is in m;
	// long is set when one of 64 labels or more is.
	counts uint64
	long   bool
	most   int // labels of the longest zone
	// zones lists the zones in the order first added (for Zones).
	zones []string
}

// Builder collects a Table's zones.
type Builder[T any] struct {
	t Table[T]
}

// NewBuilder starts a table whose names in no zone get def.
func NewBuilder[T any](def T) *Builder[T] {
	return &Builder[T]{t: Table[T]{m: map[string]T{}, def: def}}
}

// Set gives the names of zone (a presentation name, any case; "." is the
// root, whose value replaces the default) the value v, replacing the
// value the zone had.
func (b *Builder[T]) Set(zone string, v T) error {
	w, ok := wire.AppendNameWire(nil, zone)
	if !ok {
		return fmt.Errorf("zone: invalid zone name %q", zone)
	}
	w = wire.AppendLower(w[:0:0], w)
	n := labels(w)
	if n == 0 {
		if _, dup := b.t.m["."]; !dup {
			b.t.zones = append(b.t.zones, ".")
		}
		b.t.m["."] = v // kept for Has and Get; the lookup reads def
		b.t.def = v
		return nil
	}
	k := string(w)
	if _, dup := b.t.m[k]; !dup {
		b.t.zones = append(b.t.zones, lowerFQDN(zone))
	}
	b.t.m[k] = v
	if n < 64 {
		b.t.counts |= 1 << n
	} else {
		b.t.long = true
	}
	b.t.most = max(b.t.most, n)
	return nil
}

// SetFirst is Set unless the zone has a value already (the first value of
// a zone given twice wins).
func (b *Builder[T]) SetFirst(zone string, v T) error {
	if b.Has(zone) {
		return nil
	}
	return b.Set(zone, v)
}

// Has reports whether zone has a value.
func (b *Builder[T]) Has(zone string) bool {
	_, ok := b.t.Get(zone)
	return ok
}

// Table returns the table built. The builder must not be used after.
func (b *Builder[T]) Table() *Table[T] {
	t := b.t
	b.t = Table[T]{}
	return &t
}

// NewTable builds a table of zones (zones[i] gets vals[i]; a zone given
// twice keeps the last value) whose names in no zone get def.
func NewTable[T any](def T, zones []string, vals []T) (*Table[T], error) {
	if len(zones) != len(vals) {
		return nil, fmt.Errorf("zone: %d zones, %d values", len(zones), len(vals))
	}
	b := NewBuilder(def)
	for i, z := range zones {
		if err := b.Set(z, vals[i]); err != nil {
			return nil, err
		}
	}
	return b.Table(), nil
}

// labels counts the labels of a well-formed wire name.
func labels(w []byte) int {
	n := 0
	for off := 0; off < len(w) && w[off] != 0; off += 1 + int(w[off]) {
		n++
	}
	return n
}

// lowerFQDN is a presentation zone as the table lists it.
func lowerFQDN(z string) string {
	z = strings.ToLower(z)
	if z == "" || z == "." {
		return "."
	}
	if !strings.HasSuffix(z, ".") {
		z += "."
	}
	return z
}

// Lookup returns the value of the longest zone holding name (wire format,
// any case), or the default. It allocates nothing. A name that is not a
// well-formed wire name gets the default.
func (t *Table[T]) Lookup(name []byte) T {
	v, _ := t.lookup(name)
	return v
}

// LookupZone is Lookup that also says whether a zone (not the default)
// held the name; the root zone counts as one.
func (t *Table[T]) LookupZone(name []byte) (T, bool) {
	return t.lookup(name)
}

func (t *Table[T]) lookup(name []byte) (T, bool) {
	if t.counts == 0 && !t.long {
		_, root := t.m["."]
		return t.def, root
	}
	// The start of each label, and the number of labels.
	var starts [maxLabels]uint8
	n, off := 0, 0
	for {
		if off >= len(name) || n == maxLabels {
			return t.def, false // not a wire name: no zone holds it
		}
		l := int(name[off])
		if l == 0 {
			break
		}
		if l > 63 || off+1+l >= len(name) {
			return t.def, false
		}
		starts[n] = uint8(min(off, 255))
		n++
		off += 1 + l
	}
	end := off + 1 // the root label included
	if end > 255 {
		return t.def, false
	}
	// Lower-case the longest suffix any zone could be, once.
	k := min(n, t.most)
	from := int(starts[n-k])
	var buf [255]byte
	low := buf[:end-from]
	for i, c := range name[from:end] {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		low[i] = c
	}
	for ; k > 0; k-- {
		if k < 64 && t.counts&(1<<k) == 0 {
			continue
		}
		if k >= 64 && !t.long {
			continue
		}
		if v, ok := t.m[string(low[int(starts[n-k])-from:])]; ok {
			return v, true
		}
	}
	_, root := t.m["."]
	return t.def, root
}

// LookupString is Lookup of a presentation name (a lower-case FQDN, no
// escapes), for compiling: it allocates.
func (t *Table[T]) LookupString(name string) T {
	v, _ := t.LookupStringZone(name)
	return v
}

// LookupStringZone is LookupZone of a presentation name.
func (t *Table[T]) LookupStringZone(name string) (T, bool) {
	w, ok := wire.AppendNameWire(make([]byte, 0, len(name)+2), name)
	if !ok {
		return t.def, false
	}
	return t.lookup(w)
}

// Get returns the value of exactly zone (a presentation name), and whether
// it has one.
func (t *Table[T]) Get(zone string) (T, bool) {
	w, ok := wire.AppendNameWire(nil, zone)
	if !ok {
		var zero T
		return zero, false
	}
	if labels(w) == 0 {
		v, ok := t.m["."]
		return v, ok
	}
	v, ok := t.m[string(wire.AppendLower(w[:0:0], w))]
	return v, ok
}

// Default is the value of names in no zone (the root's, when it has one).
func (t *Table[T]) Default() T { return t.def }

// Zones lists the table's zones (lower-case FQDNs) in the order first set.
func (t *Table[T]) Zones() []string { return t.zones }

// Len is the number of zones.
func (t *Table[T]) Len() int { return len(t.zones) }
