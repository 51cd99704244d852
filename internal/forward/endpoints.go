package forward

import (
	"fmt"
	"net/netip"
)

// Remover is an Observer that also hears when an upstream leaves its group for good
// (SetEndpoints), so it can forget that upstream's series: a group following kube-dns' pods
// sees new pod addresses for as long as it runs, and its label set must not grow with them.
type Remover interface {
	// Removed: upstream left group; its last connection is closed. It is not reported again
	// unless it comes back.
	Removed(group, upstream string)
}

// SetEndpoints replaces the endpoints of a TCP group: servers asked before GroupConfig.Servers,
// each query starting at the next endpoint in turn, so queries spread evenly over them; the
// configured servers (kube-dns' ClusterIP) are then only the fallback, asked when every endpoint
// failed, and alone while there is no endpoint. An endpoint kept keeps its connections and its
// health; a new one starts healthy and connects on its first query; a removed one takes no new
// query (a walk that began before moves on past it, uncounted), and its connections close as
// soon as their queries are answered or given up, so nothing in flight fails because of it.
// Duplicates, addresses that are one of the configured servers, and addresses no server can
// have (unspecified, multicast, broadcast: internal/endpoints drops and counts them, and the
// loops it can tell, before they come here) are ignored.
func (g *Group) SetEndpoints(eps []netip.AddrPort) error {
	if g.cfg.Proto != TCP {
		return fmt.Errorf("group %s: endpoints need a TCP group", g.name)
	}
	for _, a := range eps {
		if !a.IsValid() || a.Port() == 0 {
			return fmt.Errorf("group %s: invalid endpoint %q", g.name, a)
		}
	}
	g.mu.Lock()
	if g.ctx.Err() != nil {
		g.mu.Unlock()
		return fmt.Errorf("group %s: %w", g.name, ErrClosed)
	}
	old := map[netip.AddrPort]*upstream{}
	if cur := g.eps.Load(); cur != nil {
		for _, u := range *cur {
			old[u.addr] = u
		}
	}
	static := map[netip.AddrPort]bool{}
	for _, u := range g.ups {
		static[u.addr] = true
	}
	next := make([]*upstream, 0, len(eps))
	seen := map[netip.AddrPort]bool{}
	var added []*upstream
	for _, a := range eps {
		a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
		if seen[a] || static[a] || noServer(a.Addr()) {
			continue
		}
		seen[a] = true
		u := old[a]
		if u == nil {
			u = &upstream{addr: a, name: a.String()}
			u.tcp = newTCPPool(a, &g.cfg, g.clk, g.obs, g.log)
			added = append(added, u)
		}
		delete(old, a)
		next = append(next, u)
	}
	g.eps.Store(&next)
	for _, u := range added {
		g.obs.Health(g.name, u.name, true)
	}
	for _, u := range old {
		u.gone.Store(true)
		g.retired = append(g.retired, u)
	}
	g.mu.Unlock()
	for _, u := range old {
		u.tcp.retire(func() { g.removed(u) })
	}
	return nil
}

// limitedBroadcast is 255.255.255.255.
var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// noServer reports whether no server can have address a.
func noServer(a netip.Addr) bool {
	return a.IsUnspecified() || a.IsMulticast() || a == limitedBroadcast
}

// removed forgets u once its last connection closed.
func (g *Group) removed(u *upstream) {
	g.mu.Lock()
	for i, r := range g.retired {
		if r == u {
			g.retired = append(g.retired[:i], g.retired[i+1:]...)
			break
		}
	}
	back := false // followed again meanwhile, by a new upstream of the same name
	if cur := g.eps.Load(); cur != nil {
		for _, e := range *cur {
			back = back || e.addr == u.addr
		}
	}
	g.mu.Unlock()
	if r, ok := g.obs.(Remover); ok && !back {
		r.Removed(g.name, u.name)
	}
}

// Endpoints are the endpoints in use, in the order SetEndpoints gave them, with their health.
func (g *Group) Endpoints() []EndpointState {
	cur := g.eps.Load()
	if cur == nil {
		return nil
	}
	out := make([]EndpointState, 0, len(*cur))
	for _, u := range *cur {
		out = append(out, EndpointState{Addr: u.addr, Healthy: !u.down.Load()})
	}
	return out
}

// EndpointState is one endpoint of a group.
type EndpointState struct {
	Addr    netip.AddrPort
	Healthy bool
}
