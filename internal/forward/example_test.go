package forward_test

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
)

// The server's wiring: cluster zones to kube-dns over pipelined TCP, everything else to the
// node's resolvers over UDP. Groups dial lazily, so building them needs no network.
func ExampleRouter() {
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

	r := forward.NewRouter([]forward.Route{
		{Zone: "cluster.local.", Group: kube},
		{Zone: "in-addr.arpa.", Group: kube},
		{Zone: "ip6.arpa.", Group: kube},
		{Zone: ".", Group: node},
	})
	for _, name := range []string{"kubernetes.default.svc.cluster.local.", "10.0.96.10.in-addr.arpa.", "example.com.", "xcluster.local."} {
		fmt.Println(name, "→", r.Lookup(name).Name())
	}
	// Output:
	// kubernetes.default.svc.cluster.local. → kube-dns
	// 10.0.96.10.in-addr.arpa. → kube-dns
	// example.com. → node
	// xcluster.local. → node
}
