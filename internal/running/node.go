package running

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// The node listener (-node-listen, issue 40) is a view of its own: the
// sockets on its addresses (the last of cfg.Sockets) answer through a
// resolver whose block table sends every name, the cluster domain too, to
// the node's resolvers as resolv.conf lists them: the "host" group. It is
// the "." group ("node") while that one asks resolv.conf's servers, and a
// group of its own while the kube-dns ConfigMap's upstreamNameservers
// replace them for the pods. Never kube-dns, never a stub domain: kube-dns
// (CoreDNS, dnsPolicy: Default) forwards to the node's resolv.conf, which
// may be this listener, and a listener that asked kube-dns would close
// the loop. Its cache entries are apart from the pods' (the view index is
// part of the key): the same name may be answered otherwise here.

// nodeVI is the node listener's view in the snapshot (snapshot.node) for
// its resolver's BlockFunc and its forwarder; the server knows it by its
// index (nodeView.index).
const nodeVI = -2

// nodeView is the node listener's resolver; nil without -node-listen. Its
// blocks are the snapshot's (publish compiles them with the others).
type nodeView struct {
	res   *resolve.Resolver
	index uint8 // its view index in the server, after the other views
}

// hostGroup is the node listener's group for the routes apply builds:
// node itself when it asks resolv.conf's servers (resolv), else a group of
// its own for them, kept while they stay the same. It returns the group
// made (to close on failure) and the one it replaces (to retire).
func (d *State) hostGroup(node *forward.Group, servers, resolv []netip.AddrPort) (host, made, replaced *forward.Group, err error) {
	r := &d.reload
	if len(d.cfg.Node.Listen) == 0 {
		return nil, nil, nil, nil
	}
	own := r.host != nil && r.host != r.node // the group apply last made for it
	if slices.Equal(servers, resolv) {
		if own {
			replaced = r.host
		}
		return node, nil, replaced, nil
	}
	if own && slices.Equal(r.hostServers, resolv) {
		return r.host, nil, nil, nil
	}
	g, err := d.udpGroup("host", resolv)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("the node listener's resolvers: %w", err)
	}
	if own {
		replaced = r.host
	}
	return g, g, replaced, nil
}

// compileNodeView compiles the node listener's table over the group
// recompile was given for it (nil without -node-listen): the shared
// view's cache policies, one route.
func (d *State) compileNodeView() (*blocks.View, error) {
	if d.nodeV == nil {
		return nil, nil
	}
	return blocks.CompileView(blocks.Sources{
		Default: d.policyDefault, Policy: d.sharedPol.pol, PolicyZones: d.sharedPol.zones,
		Shared: []forward.Route{{Zone: ".", Group: d.nodeRoute}}, Metrics: d.metricZones,
		Forwarder: forwarder{d: d, vi: nodeVI},
	})
}

// newNodeView makes the node listener's resolver (New, after the other
// views, before the first publish compiles its table).
func (d *State) newNodeView() error {
	if len(d.cfg.Node.Listen) == 0 {
		return nil
	}
	// The views are fixed in flags mode (-node-listen needs it): the
	// shared one, or the Corefile's; the node listener's comes after.
	nv := &nodeView{index: uint8(max(1, len(d.views.res)))}
	res, err := resolve.New(resolve.Config{
		Cache:        d.Cache,
		Fetch:        d.forwardIn(nodeVI), // its one block has a Route: not reached
		Blocks:       d.blocksIn(nodeVI),
		Clock:        d.clock,
		FetchTimeout: d.cfg.ForwardTimeout,
		UDPSize:      uint16(d.cfg.MaxUDPSize),
		MaxFlights:   d.cfg.MaxInflight,
		Logger:       d.log.With("component", "cache", "view", "node"),
	})
	if err != nil {
		return err
	}
	nv.res = res
	d.nodeV = nv
	return nil
}

// withNodeView adds the node listener's resolver to the server's views:
// res and addr are the others' (addr nil: every address sees res[0]); the
// node listener's addresses are the last of the sockets.
func (d *State) withNodeView(res []*resolve.Resolver, addr []uint8) ([]*resolve.Resolver, []uint8, error) {
	if d.nodeV == nil {
		return res, addr, nil
	}
	if int(d.nodeV.index) != len(res) { // the views are fixed in flags mode
		return nil, nil, fmt.Errorf("the node listener's view is number %d, the server has %d others", d.nodeV.index, len(res))
	}
	socks := d.cfg.Sockets()
	if addr == nil {
		addr = make([]uint8, len(socks))
	} else {
		addr = slices.Clone(addr)
	}
	for i := len(socks) - len(d.cfg.Node.Listen); i < len(socks); i++ {
		addr[i] = d.nodeV.index
	}
	return append(slices.Clone(res), d.nodeV.res), addr, nil
}

// NodeView is the server's view index of the node listener's queries, and
// false without -node-listen (autopath leaves that view alone).
func (d *State) NodeView() (uint8, bool) {
	if d.nodeV == nil {
		return 0, false
	}
	return d.nodeV.index, true
}

// NodeGroupFor is the group the node listener forwards name to now
// (tests; nil without -node-listen).
func (d *State) NodeGroupFor(name string) *forward.Group {
	if d.nodeV == nil {
		return nil
	}
	w, _ := wireName(name)
	return d.pub.Load().view(nodeVI).Lookup(w).Group
}

// noteUnusedUpstreams logs, once per list, that the ConfigMap's
// upstreamNameservers are not asked: -external-upstream=kube-dns sends
// the pods' names to kube-dns, and the node listener asks resolv.conf's.
func (d *State) noteUnusedUpstreams(source string, servers []netip.AddrPort) {
	r := &d.reload
	if source != "upstreamNameservers" {
		r.unusedNoted = ""
		return
	}
	if s := fmt.Sprint(servers); s != r.unusedNoted {
		r.unusedNoted = s
		d.log.Warn("the kube-dns ConfigMap's upstreamNameservers are not asked: -external-upstream=kube-dns sends every name to kube-dns (CoreDNS's own forward applies)", "upstreamNameservers", s)
	}
}

// NodeResolvers are resolv.conf's servers as last applied: what the node
// listener asks (and its fallback's targets while no instance serves).
// Safe from any goroutine.
func (d *State) NodeResolvers() []netip.AddrPort {
	if p := d.nodeResolvers.Load(); p != nil {
		return *p
	}
	return nil
}
