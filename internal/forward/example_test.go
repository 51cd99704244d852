package forward_test

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The server's wiring: cluster zones to kube-dns over pipelined TCP, everything else to the
// node's resolvers over UDP, as routes compiled into the block table (internal/blocks), which
// picks the longest zone on label boundaries. Groups dial lazily, so building them needs no
// network.
func ExampleRoute() {
	kube, err := forward.NewGroup(forward.GroupConfig{
		Name:    "kube-dns",
		Servers: []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53")},
		Proto:   forward.TCP,
		Logger:  slog.Default(),
	}, nil) // nil Observer: no metrics
	if err != nil {
		panic(err)
	}
	defer kube.Close()
	node, err := forward.NewGroup(forward.GroupConfig{
		Name:       "node",
		Servers:    []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:53"), netip.MustParseAddrPort("192.0.2.2:53")},
		Proto:      forward.UDP,
		TryTimeout: 1500 * time.Millisecond,
	}, nil)
	if err != nil {
		panic(err)
	}
	defer node.Close()

	var pol resolve.Policy
	table, err := blocks.CompileView(blocks.Sources{
		Policy: func([]byte) *resolve.Policy { return &pol },
		Shared: []forward.Route{
			{Zone: "cluster.local.", Group: kube},
			{Zone: "in-addr.arpa.", Group: kube},
			{Zone: "ip6.arpa.", Group: kube},
			{Zone: ".", Group: node},
		},
	})
	if err != nil {
		panic(err)
	}
	for _, name := range []string{"kubernetes.default.svc.cluster.local.", "10.0.96.10.in-addr.arpa.", "example.com.", "xcluster.local."} {
		w, _ := wire.AppendNameWire(nil, name)
		fmt.Println(name, "→", table.Lookup(w).Group.Name())
	}
	// Output:
	// kubernetes.default.svc.cluster.local. → kube-dns
	// 10.0.96.10.in-addr.arpa. → kube-dns
	// example.com. → node
	// xcluster.local. → node
}
