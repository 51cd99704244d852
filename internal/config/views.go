package config

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// A view is what a query sees by the address it arrived on, as in CoreDNS:
// each block listens on its binds (a block without bind, or bound to the
// unspecified address, on every address), and a query is handled by the
// blocks listening on the address it arrived on, longest zone first. The
// kernel gives a query to a socket bound to its destination address before
// a wildcard one, so an address that some block binds explicitly sees only
// the blocks binding it; any other address sees the wildcard blocks.
//
// Listen addresses that see the same blocks share one view. When every
// address resolves every zone to a block with the same settings as the
// zone's first block (every Corefile where all blocks bind the same
// addresses, as the stock ones do), there is one view and CorefileConfig.Views
// is nil: the daemon runs one policy table, one fetch chain and one route
// table, as without views.

// View is the set of blocks seen from some listen addresses.
type View struct {
	// Addrs are the listen sockets (address and port) that see this view.
	Addrs []netip.AddrPort
	// Blocks are the blocks seen, indexes into CorefileConfig.Servers.
	Blocks []int
	// Pick gives every zone of the Corefile the block that serves its
	// names here (the longest zone of this view's blocks holding it), -1
	// when none does: CoreDNS answers REFUSED.
	Pick map[string]int
	// ZonePolicies are this view's cache policies, by zone.
	ZonePolicies []ZonePolicy
	// Routes are the zones whose block here forwards elsewhere than the
	// zone's first block (the daemon's shared route table): this view's
	// own groups for them.
	Routes []ZoneRoute
	// Refused are the zones no block of this view serves.
	Refused []string
}

// MaxViews bounds the views: the view index is part of the cache key and
// takes 6 bits of it (cache.keyFlags).
const MaxViews = 64

// BlocksSeenFrom lists the blocks (indexes into srv) a query to ap sees
// (port 0: on any port).
func BlocksSeenFrom(srv []*corefile.Server, ap netip.AddrPort) []int { return viewBlocks(srv, ap) }

// viewBlocks lists the blocks a query to ap sees: the blocks on its port
// (port 0: every block) that bind its address, else those on every address.
func viewBlocks(srv []*corefile.Server, ap netip.AddrPort) []int {
	a := ap.Addr().Unmap()
	var bound, wild []int
	for i, s := range srv {
		if ap.Port() != 0 && s.Port != int(ap.Port()) {
			continue
		}
		if len(s.Bind) == 0 {
			wild = append(wild, i)
			continue
		}
		exact, any := false, false
		for _, b := range s.Bind {
			b = b.Unmap()
			switch {
			case b == a || (b.IsUnspecified() && a.IsUnspecified()):
				// 0.0.0.0 and :: are one wildcard socket: a block binding
				// either is on it.
				exact = true
			case b.IsUnspecified():
				// CoreDNS listens on "udp"/"tcp" 0.0.0.0 or ::, which Go
				// opens dual-stack ([::], IPV6_V6ONLY off: `ss -lnu` shows
				// the stock node-cache's *:53): either one is every
				// address of both families.
				any = true
			}
		}
		if exact {
			bound = append(bound, i)
		} else if any {
			wild = append(wild, i)
		}
	}
	if len(bound) > 0 {
		return bound
	}
	return wild
}

// picker gives a name the block of blocks (indexes into srv) whose
// longest zone holds it, -1 if none (of a zone in two of them, the first).
func picker(srv []*corefile.Server, blocks []int) *zone.Table[int] {
	b := zone.NewBuilder(-1)
	for _, i := range blocks {
		for _, z := range srv[i].Zones {
			_ = b.SetFirst(z, i)
		}
	}
	return b.Table()
}

// blockSig is what of a block decides how a query is answered
// (corefile.Server.Sig: derived from its directives, not listed here). Two
// blocks with equal signatures answer alike.
func blockSig(s *corefile.Server) any { return s.Sig() }

// buildViews groups the listen addresses by the blocks they see and builds
// each view's policies and routes; it leaves cc.Views nil when one view
// answers like every other. first maps a zone to its first block (the
// shared policy and route table).
func (c *Config) buildViews(cc *CorefileConfig, set map[string]bool) error {
	srv := cc.Servers
	cc.Views = nil
	var zones []string
	first := map[string]int{}
	for i, s := range srv {
		for _, z := range s.Zones {
			if _, ok := first[z]; !ok {
				first[z] = i
				zones = append(zones, z)
			}
		}
	}
	var views []View
	for _, a := range c.Sockets() {
		blocks := viewBlocks(srv, a)
		k := slices.IndexFunc(views, func(v View) bool { return slices.Equal(v.Blocks, blocks) })
		if k < 0 {
			views = append(views, View{Blocks: blocks})
			k = len(views) - 1
		}
		views[k].Addrs = append(views[k].Addrs, a)
	}
	same := true
	for vi := range views {
		v := &views[vi]
		v.Pick = map[string]int{}
		pick := picker(srv, v.Blocks)
		for _, z := range zones {
			p := pick.LookupString(z)
			v.Pick[z] = p
			if p != first[z] && (p < 0 || !reflect.DeepEqual(blockSig(srv[p]), blockSig(srv[first[z]]))) {
				same = false
			}
		}
	}
	if same {
		return nil
	}
	if len(views) > MaxViews {
		return usage("the Corefile's binds make %d views (sets of blocks seen from one listen address); at most %d are supported", len(views), MaxViews)
	}
	for vi := range views {
		v := &views[vi]
		for _, z := range zones {
			p := v.Pick[z]
			if p < 0 {
				v.Refused = append(v.Refused, z)
				continue
			}
			zp, _ := c.zonePolicy(uncachedOutside(srv[p], z), z, set) // notes: given once by zonePolicies
			zp.TTL.Tag = uint16(p + 1)
			v.ZonePolicies = append(v.ZonePolicies, zp)
			f, g := srv[p].Forward, srv[first[z]].Forward
			if f == nil || reflect.DeepEqual(f, g) {
				continue
			}
			if f.From != "." && !slices.Contains(srv[p].Zones, f.From) {
				continue // refused by mapCorefile
			}
			ns, err := c.resolve(srv[p], f)
			if err != nil {
				return err
			}
			v.Routes = append(v.Routes, ZoneRoute{Zone: z, Servers: ns, ForceTCP: f.ForceTCP, Opts: forwardOptions(f, c.MaxInflight), From: srv[p].Pos.String()})
		}
		for _, p := range v.Blocks {
			for _, z := range cacheZones(srv, v.Blocks, p) {
				if !slices.ContainsFunc(v.ZonePolicies, func(zp ZonePolicy) bool { return zp.Zone == z }) {
					zp, _ := c.zonePolicy(uncachedOutside(srv[p], z), z, set)
					zp.TTL.Tag = uint16(p + 1)
					v.ZonePolicies = append(v.ZonePolicies, zp)
				}
			}
		}
	}
	cc.Views = views
	return nil
}

// Describe says, for -check-config, which blocks the view's addresses see
// and what differs from the shared tables.
func (v View) Describe(srv []*corefile.Server) []string {
	var blocks []string
	for _, i := range v.Blocks {
		blocks = append(blocks, srv[i].Pos.String()+" ("+strings.Join(srv[i].Zones, " ")+")")
	}
	out := []string{fmt.Sprintf("addresses %v see the blocks %s", v.Addrs, strings.Join(blocks, ", "))}
	for _, zp := range v.ZonePolicies {
		out = append(out, fmt.Sprintf("zone %s served by the block at %s: %s", zp.Zone, zp.Block, zp))
	}
	for _, r := range v.Routes {
		out = append(out, fmt.Sprintf("zone route %s -> %v (tcp %v) from %s", r.Zone, r.Servers, r.ForceTCP, r.From))
	}
	for _, z := range v.Refused {
		out = append(out, fmt.Sprintf("zone %s: no block here: REFUSED (as CoreDNS)", z))
	}
	return out
}

// Sig is what of the view decides its answers, without file positions:
// equal signatures answer alike (a reload may keep the running view).
func (v View) Sig(srv []*corefile.Server) any {
	type zoneSig struct {
		Zone  string
		Block any
	}
	var zs []zoneSig
	for z, p := range v.Pick {
		var b any
		if p >= 0 {
			b = blockSig(srv[p])
		}
		zs = append(zs, zoneSig{z, b})
	}
	slices.SortFunc(zs, func(a, b zoneSig) int { return strings.Compare(a.Zone, b.Zone) })
	pols := slices.Clone(v.ZonePolicies)
	for i := range pols {
		pols[i].Block = ""
	}
	routes := slices.Clone(v.Routes)
	for i := range routes {
		routes[i].From = ""
	}
	return []any{v.Addrs, zs, pols, routes, v.Refused}
}
