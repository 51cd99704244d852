package daemon

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// The node's addresses (issue 37): a query from loopback or from an
// address of the node's own interfaces comes from the node itself (a
// hostNetwork pod, the kubelet, an agent), which the server counts as one
// client, by source port (fair.Clients): a hostNetwork pod can send from
// any of these, so they are all one client, not a thousand. Pods send
// from their own addresses, which are on no interface of the node (a
// pod's veth has none on the node's side, a bridge has the gateway's).

// nodeAddrsEvery is how often the node's addresses are read again: an
// address added later (a Service's ClusterIP on kube-ipvs0 in kube-proxy's
// IPVS mode) is a client of its own until then.
const nodeAddrsEvery = 30 * time.Second

// nodeAddrs lists the addresses of every interface of the node's network
// namespace, up or down: kube-ipvs0, which holds every ClusterIP in IPVS
// mode, is down, and its addresses are the node's all the same.
func nodeAddrs() []netip.Addr {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for i := range ifs {
		as, err := ifs[i].Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	return out
}

// watchNodeAddrs reads the node's addresses into the server's client
// mapping every nodeAddrsEvery until ctx ends.
func (d *Daemon) watchNodeAddrs(ctx context.Context) {
	t := time.NewTicker(nodeAddrsEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.clients.SetNode(nodeAddrs())
		}
	}
}
