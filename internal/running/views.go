package running

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// Views (config.View): when the Corefile's blocks seen from one listen
// address answer otherwise than those seen from another, each view gets
// its own resolver over the shared cache (the view index is part of the
// cache key, wire.Query.View, so the byte budget and capacities stay one
// bound for all), its own block table (its blocks' policies, answer-side
// chains, fetch chains and routes: blocks.View), and its own groups for
// the zones it forwards elsewhere than the shared route table.
// The server picks the resolver by the socket a query arrived on. With one
// view (Views nil) none of this exists and the daemon runs as before.
//
// One resolver per view rather than a view argument through resolve: its
// BlockFunc looks a name up in its own view's table, and the hit path is
// the same code with one more byte in the key. Each view's resolver admits up
// to -max-inflight distinct questions; the groups bound what reaches an
// upstream.

// viewSet is the running views: their resolvers (by view index), the view
// of each listen address (by index in cfg.LocalIPs), their own groups, and
// the first view's chain (for DirectiveStats). nil res: one view, the
// daemon's shared resolver.
type viewSet struct {
	cc     *config.CorefileConfig
	res    []*resolve.Resolver
	addr   []uint8
	groups []*forward.Group
	chain0 *blocks.Chains
	tables []*viewTable // by view index
}

// viewTable is what one view's block table is compiled from (publish
// compiles it anew with every reload).
type viewTable struct {
	sp sharedPolicy
	c  *blocks.Chains
	vr *blocks.Routes
	// metrics are the CoreDNS metric zones by label index, "" where no
	// block of the view has the zone: a name is labelled by the zone of
	// the block serving it here (CoreDNS's prometheus counts under its own
	// block's keys), e.g. "." for a zone another port's block has.
	metrics []string
}

// newViews builds a resolver per view of cc over the listen sockets
// listen (the running ones, cfg.Sockets), with the blocks' answer-side
// chains (answerChains of cc's blocks). It changes nothing of d but
// creating groups, which the caller owns (closed on error here).
func (d *State) newViews(cfg *config.Config, cc *config.CorefileConfig, listen []netip.AddrPort, chains map[*corefile.Server]*answer.Chain) (vs *viewSet, err error) {
	vs = &viewSet{cc: cc}
	if cc == nil || cc.Views == nil {
		return vs, nil
	}
	made := vs // the error returns set vs to nil
	defer func() {
		if err != nil {
			for _, g := range made.groups {
				_ = g.Close()
			}
		}
	}()
	var zones []string
	for _, s := range cc.Servers {
		for _, z := range s.Zones {
			if !slices.Contains(zones, z) {
				zones = append(zones, z)
			}
		}
	}
	slices.SortStableFunc(zones, func(a, b string) int { return len(b) - len(a) })
	vs.addr = make([]uint8, len(listen))
	for i, a := range listen {
		// Port 0 (tests: any free port) is the address's first view.
		vi := slices.IndexFunc(cc.Views, func(v config.View) bool {
			return slices.ContainsFunc(v.Addrs, func(x netip.AddrPort) bool { return x == a || (a.Port() == 0 && x.Addr() == a.Addr()) })
		})
		if vi < 0 {
			return nil, fmt.Errorf("listen address %s is in no view", a)
		}
		vs.addr[i] = uint8(vi)
	}
	for vi, v := range cc.Views {
		pol, err := resolve.Zones(d.policyDefault, corefileZones(v.ZonePolicies)...)
		if err != nil {
			return nil, err
		}
		vr := &blocks.Routes{Zones: zones, Groups: map[string]*forward.Group{}, Refused: map[string]bool{}}
		for _, z := range v.Refused {
			vr.Refused[z] = true
		}
		for _, zr := range v.Routes {
			g, err := d.routeGroup(zr)
			if err != nil {
				return nil, fmt.Errorf("%s: forward for %s: %w", zr.From, zr.Zone, err)
			}
			vs.groups = append(vs.groups, g)
			vr.Groups[zr.Zone] = g
		}
		t := &viewTable{sp: sharedPolicy{pol: pol.Policies(), zones: zonePolicyZones(v.ZonePolicies),
			answers: blockAnswers(cc.Servers, chains, func(z string) int {
				if p, ok := v.Pick[z]; ok {
					return p
				}
				return -1
			})}, vr: vr}
		for _, z := range d.metricZones {
			if !slices.ContainsFunc(v.Blocks, func(b int) bool { return slices.Contains(cc.Servers[b].Zones, z) }) {
				z = ""
			}
			t.metrics = append(t.metrics, z)
		}
		// The end of the view's chains; the view's table for the
		// directives' own lookups.
		if t.c, err = d.buildChains(cc, v.Pick, d.forwardIn(vi), d.tableIn(vi)); err != nil {
			return nil, err
		}
		vs.groups = append(vs.groups, t.c.Groups()...)
		if vi == 0 {
			vs.chain0 = t.c
		}
		if _, err := d.compileView(vi, t.sp, t.c, t.vr, t.metrics, d.routes); err != nil {
			return nil, err // refused here, before the views are in use
		}
		vs.tables = append(vs.tables, t)
		res, err := d.newResolver(vi)
		if err != nil {
			return nil, err
		}
		vs.res = append(vs.res, res)
	}
	return vs, nil
}

// useViews makes the server answer by vs's resolvers (before Start or
// live; their blocks are the snapshot's: publish first) and returns the
// view set it replaces. The server's resolvers and the snapshot are two
// stores: a query at the swap of the views may be answered by the new
// blocks through the old view's resolver (whose cache entries the change
// drops anyway: apply drops every zone).
func (d *State) useViews(vs *viewSet) (*viewSet, error) {
	res, addr := vs.res, vs.addr
	if res == nil {
		res, addr = []*resolve.Resolver{d.res0}, nil
	}
	res, addr, err := d.withNodeView(res, addr) // -node-listen: node.go
	if err != nil {
		return nil, err
	}
	if err := d.Server.SetViews(res, addr); err != nil {
		return nil, err
	}
	old := d.views
	d.views = vs
	d.viewChain.Store(vs.chain0)
	return old, nil
}

// prepareViews builds the views of a reloaded Corefile whose views differ
// from the running ones: new resolvers, chains and groups, not yet in use
// (commitCorefile swaps them into the server at once; the old groups are
// retired and the whole cache dropped by apply: the view indexes changed
// meaning, and CoreDNS too starts with new caches on reload). A change of
// the listen addresses needs a restart: refused.
func (d *State) prepareViews(n *config.Config, chains map[*corefile.Server]*answer.Chain) (*viewSet, error) {
	if !slices.Equal(n.Sockets(), d.cfg.Sockets()) {
		return nil, fmt.Errorf("the listen addresses change too (%v to %v): restart to apply", d.cfg.Sockets(), n.Sockets())
	}
	return d.newViews(n, n.DropIn.Corefile, d.cfg.Sockets(), chains)
}

// viewsChanged reports whether a reloaded Corefile sees other views than
// the running one (then prepareViews builds them).
func (d *State) viewsChanged(n *config.Config) bool {
	var cur *config.CorefileConfig
	if d.views != nil {
		cur = d.views.cc
	}
	next := n.DropIn.Corefile
	if (cur == nil || cur.Views == nil) && (next == nil || next.Views == nil) {
		return false
	}
	return !reflect.DeepEqual(viewSig(cur), viewSig(next))
}

func viewSig(cc *config.CorefileConfig) any {
	if cc == nil {
		return nil
	}
	var out []any
	for _, v := range cc.Views {
		out = append(out, v.Sig(cc.Servers))
	}
	return out
}

func describeViews(cc *config.CorefileConfig) string {
	if cc == nil || cc.Views == nil {
		return "one view"
	}
	vs := cc.Views
	var parts []string
	for _, v := range vs {
		parts = append(parts, fmt.Sprintf("%v", v.Addrs))
	}
	return fmt.Sprintf("%d views %s", len(vs), strings.Join(parts, " "))
}
