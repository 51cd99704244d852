// Package blocks is the one place that decides which block serves a name.
// What serves each part of the name space (the Corefile's server blocks as
// one view sees them, or without a Corefile the zones the flags name) is
// compiled into a View: per zone, one Block holding its cache policy, its
// fetch-side directive chain, its own forward group and whether the zone is
// refused. A miss looks its name up once (the resolver's PolicyFunc); the
// Block rides with the miss as the policy's Route to the fetch (resolve's
// StartFunc, and PolicyOf in a FetchFunc), so nothing is matched twice.
//
// A View is built whole and never changed: a reload compiles a new one and
// swaps one pointer, so a query sees the old configuration or the new one,
// never a mix.
//
// The sources a view is compiled from live here too: the blocks' fetch-side
// chains (BuildChains: each block's directives, registered with
// internal/directive, linked in plugin.cfg order) and, with several views,
// a view's own routes (Routes: its groups, its refused zones).
package blocks

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Block is what serves the names of one zone (the longest zone of the
// view holding them).
type Block struct {
	// Zone is the zone, a lower-case FQDN; "" for the names in no zone.
	Zone string
	// Policy is the cache policy; its Route is this Block.
	Policy resolve.Policy
	// Run is the block's fetch-side chain (template, hosts, rewrite,
	// dns64, ending in its forward); nil: the fetch is a plain forward.
	Run directive.Next
	// Group is the view's own forward group for the zone; nil: the shared
	// route table.
	Group *forward.Group
	// Refused: no block of the view serves the zone (CoreDNS answers
	// REFUSED).
	Refused bool
}

// View is the compiled table of one view. Safe for concurrent use; never
// modified once compiled.
type View struct {
	zones []zone // longest first
	def   *Block
}

type zone struct {
	wire []byte // lower-case wire name
	b    *Block
}

// Compile builds a view over zones (any order, duplicates ignored; "."
// allowed). at gives the block of a zone as the configuration says it,
// evaluated at the zone's own name; def is the block of names in no zone.
//
// The sources of a block (the policies, the chains, the view's routes) may
// each know a different set of zones: zones must be their union. Then the
// longest zone holding a name is also the longest of each source's zones
// holding it, extended to the union, so evaluating every source at that
// zone gives what it would give for the name.
func Compile(zones []string, def Block, at func(zone string) (Block, error)) (*View, error) {
	v := &View{def: &def}
	v.def.Policy.Route = v.def
	seen := map[string]bool{}
	for _, z := range zones {
		if seen[z] {
			continue
		}
		seen[z] = true
		w, ok := wire.AppendNameWire(nil, z)
		if !ok {
			return nil, fmt.Errorf("blocks: invalid zone %q", z)
		}
		b, err := at(z)
		if err != nil {
			return nil, fmt.Errorf("blocks: zone %s: %w", z, err)
		}
		b.Zone = z
		bp := &b
		bp.Policy.Route = bp
		v.zones = append(v.zones, zone{wire: wire.AppendLower(nil, w), b: bp})
	}
	slices.SortStableFunc(v.zones, func(a, b zone) int { return cmp.Compare(len(b.wire), len(a.wire)) })
	return v, nil
}

// Lookup returns the block serving name (wire format, any case). It
// allocates nothing.
func (v *View) Lookup(name []byte) *Block {
	for i := range v.zones {
		if wire.InZone(name, v.zones[i].wire) {
			return v.zones[i].b
		}
	}
	return v.def
}

// Policy is Lookup's block's policy: a resolve.PolicyFunc.
func (v *View) Policy(name []byte) *resolve.Policy { return &v.Lookup(name).Policy }

// Of returns the block a policy was found with (its Route); nil when it
// came from elsewhere.
func Of(p *resolve.Policy) *Block {
	if p == nil {
		return nil
	}
	b, _ := p.Route.(*Block)
	return b
}

// Zones lists the view's zones, longest first (for logs and tests).
func (v *View) Zones() []string {
	out := make([]string, len(v.zones))
	for i, z := range v.zones {
		out[i] = z.b.Zone
	}
	return out
}

// CompileView compiles a view from its sources: the cache policies (pol,
// over polZones; def for names in none), the chains (nil: none) and the
// view's routes (nil: the shared route table).
func CompileView(def resolve.Policy, pol resolve.PolicyFunc, polZones []string, c *Chains, vr *Routes) (*View, error) {
	zones := slices.Clone(polZones)
	zones = append(zones, c.Zones()...)
	if vr != nil {
		zones = append(zones, vr.Zones...)
	}
	return Compile(zones, Block{Policy: def}, func(z string) (Block, error) {
		w, ok := wire.AppendNameWire(nil, z)
		if !ok {
			return Block{}, fmt.Errorf("invalid zone name %q", z)
		}
		b := Block{Policy: *pol(w), Run: c.Run(z)}
		if vr != nil {
			b.Refused, b.Group = vr.At(z)
		}
		return b, nil
	})
}
