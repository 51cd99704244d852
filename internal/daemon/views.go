package daemon

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Views (config.View): when the Corefile's blocks seen from one listen
// address answer otherwise than those seen from another, each view gets
// its own resolver over the shared cache (the view index is part of the
// cache key, wire.Query.View, so the byte budget and capacities stay one
// bound for all), its own policy table, its own fetch chain and its own
// groups for the zones it forwards elsewhere than the shared route table.
// The server picks the resolver by the socket a query arrived on. With one
// view (Views nil) none of this exists and the daemon runs as before.
//
// One resolver per view rather than a view argument through resolve:
// resolve.PolicyFunc and FetchFunc stay per name, and the hit path is the
// same code with one more byte in the key. Each view's resolver admits up
// to -max-inflight distinct questions; the groups bound what reaches an
// upstream.

// viewRoutes is one view's forwarding beyond the chain.
type viewRoutes struct {
	zones   []string                  // every zone of the Corefile, longest first
	groups  map[string]*forward.Group // zones forwarded elsewhere than the shared table
	refused map[string]bool           // zones no block of the view serves
}

// newViews builds a resolver per view and says which view each listen
// address (cfg.LocalIPs) belongs to.
func (d *Daemon) newViews(cfg *config.Config, cc *config.CorefileConfig) ([]*resolve.Resolver, []uint8, error) {
	var zones []string
	for _, s := range cc.Servers {
		for _, z := range s.Zones {
			if !slices.Contains(zones, z) {
				zones = append(zones, z)
			}
		}
	}
	slices.SortStableFunc(zones, func(a, b string) int { return len(b) - len(a) })
	var out []*resolve.Resolver
	addrViews := make([]uint8, len(cfg.LocalIPs))
	for vi, v := range cc.Views {
		for i, a := range cfg.LocalIPs {
			if slices.Contains(v.Addrs, a) {
				addrViews[i] = uint8(vi)
			}
		}
		pol, err := resolve.Zones(d.policyDefault, corefileZones(cfg, v.ZonePolicies)...)
		if err != nil {
			return nil, nil, err
		}
		vr := &viewRoutes{zones: zones, groups: map[string]*forward.Group{}, refused: map[string]bool{}}
		for _, z := range v.Refused {
			vr.refused[z] = true
		}
		for _, zr := range v.Routes {
			g, err := d.routeGroup(zr)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: forward for %s: %w", zr.From, zr.Zone, err)
			}
			d.viewGroups = append(d.viewGroups, g)
			vr.groups[zr.Zone] = g
		}
		next := vr.fetch(d.forward)
		c, err := d.buildChains(cc.Servers, v.Pick, next)
		if err != nil {
			return nil, nil, err
		}
		if vi == 0 {
			d.chain.Store(c) // DirectiveStats: the first view's directives
		}
		res, err := resolve.New(resolve.Config{
			Cache: d.Cache,
			Fetch: func(ctx context.Context, qname string, query []byte) ([]byte, error) {
				return c.fetch(ctx, qname, query, next)
			},
			Policy:       pol,
			Clock:        d.clock,
			FetchTimeout: cfg.ForwardTimeout,
			UDPSize:      uint16(cfg.MaxUDPSize),
			MaxFlights:   cfg.MaxInflight,
		})
		if err != nil {
			return nil, nil, err
		}
		out = append(out, res)
	}
	d.views = cc
	return out, addrViews, nil
}

// fetch forwards qname as the view's block for it would: to the view's own
// group when the block forwards elsewhere than the shared table, REFUSED
// when no block of the view serves it (as CoreDNS answers), else through
// the shared route table (shared).
func (vr *viewRoutes) fetch(shared resolve.FetchFunc) resolve.FetchFunc {
	return func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		for _, z := range vr.zones {
			if z != "." && qname != z && !strings.HasSuffix(qname, "."+z) {
				continue
			}
			if vr.refused[z] {
				return refusedAnswer(query)
			}
			if g := vr.groups[z]; g != nil {
				return g.Exchange(ctx, query)
			}
			break
		}
		return shared(ctx, qname, query)
	}
}

// refusedAnswer is the REFUSED response to query (its question and OPT
// echoed), what CoreDNS answers a name no block of the server serves.
func refusedAnswer(query []byte) ([]byte, error) {
	if len(query) < wire.HeaderLen {
		return nil, fmt.Errorf("views: short query")
	}
	b := append([]byte(nil), query...)
	b[2] |= 0x80                         // QR
	b[3] = b[3]&0x70 | wire.RcodeRefused // no RA, rcode REFUSED
	return b, nil
}

// viewsChanged reports whether a reloaded Corefile sees other views than
// the running one: the daemon does not rebuild resolvers and listeners'
// views in place, so such a change is refused (logged once and counted by
// the caller) and the running configuration kept.
func (d *Daemon) viewsChanged(n *config.Config) (string, bool) {
	cur, next := d.views, n.DropIn.Corefile
	var curViews, nextViews []config.View
	if cur != nil {
		curViews = cur.Views
	}
	if next != nil {
		nextViews = next.Views
	}
	if curViews == nil && nextViews == nil {
		return "", false
	}
	if reflect.DeepEqual(viewSig(cur), viewSig(next)) {
		return "", false
	}
	return fmt.Sprintf("the blocks seen from the listen addresses (views) change from %s to %s; restart to apply", describeViews(curViews), describeViews(nextViews)), true
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

func describeViews(vs []config.View) string {
	if vs == nil {
		return "one view"
	}
	var parts []string
	for _, v := range vs {
		parts = append(parts, fmt.Sprintf("%v", v.Addrs))
	}
	return fmt.Sprintf("%d views %s", len(vs), strings.Join(parts, " "))
}
