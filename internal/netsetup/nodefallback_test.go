package netsetup

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestNodeListenerFallsBackToTheNodeResolvers: the node listener's address
// (-node-listen) has a fallback of its own (Fallback.Node): while the gate
// is closed a query from the host to it goes to the node's resolver, one
// to the pods' address to kube-dns; with the gate open both reach our
// sockets. Its chain never names kube-dns, which may forward to it.
func TestNodeListenerFallsBackToTheNodeResolvers(t *testing.T) {
	for _, backend := range []string{BackendLegacy, BackendNFT} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) { testNodeListenerFallback(t, backend) })
		})
	}
}

func testNodeListenerFallback(t *testing.T, backend string) {
	const port = 53
	node := netip.MustParseAddr("169.254.20.11")
	addrs := []netip.Addr{testV4, node}
	kubeDNS, resolver := netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("10.99.0.3")
	adoptableLink(t, defaultInterfaceName)
	sh(t, "ip", "link", "set", defaultInterfaceName, "up")
	for _, a := range []netip.Addr{kubeDNS, resolver} {
		sh(t, "ip", "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo", "nodad")
	}
	s, err := New(Config{
		Addrs: addrs, Port: port, SetupInterface: true, SetupIPTables: true,
		Backend: backend, SyncInterval: time.Hour, LockWait: 2 * time.Second, FallbackAfter: 2 * time.Second,
		Logger: testLogger(t), Observer: &recorder{},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.EnsureLink(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		serveAnswer(t, a, port, "192.0.2.1") // the cache
	}
	serveAnswer(t, kubeDNS, port, "192.0.2.2")
	serveAnswer(t, resolver, port, "192.0.2.3") // the node's resolver
	if err := s.EnsureRules(ctx); err != nil {
		t.Fatal(err)
	}
	kd := []netip.AddrPort{netip.AddrPortFrom(kubeDNS, port)}
	fb := Fallback{UDP: kd, TCP: kd, Node: map[netip.Addr][]netip.AddrPort{node: {netip.AddrPortFrom(resolver, port)}}}
	if err := s.SetFallback(ctx, fb); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, binary(backend, ipv4), "-t", "nat", "-S", fallbackChain(node)); strings.Contains(got, kubeDNS.String()) || !strings.Contains(got, resolver.String()) {
		t.Errorf("the node listener's chain:\n%s", got)
	}
	if got := s.FallbackTargets()[node]; !strings.Contains(got, "the node's resolvers") {
		t.Errorf("FallbackTargets()[%s] = %q", node, got)
	}
	ask := func(want map[netip.Addr]string) {
		t.Helper()
		for a, w := range want {
			for _, tcp := range []bool{false, true} {
				if got := dig(t, a, port, tcp); got != w {
					t.Errorf("dig @%s tcp=%v = %q, want %s", a, tcp, got, w)
				}
			}
		}
	}
	ask(map[netip.Addr]string{testV4: "192.0.2.2", node: "192.0.2.3"}) // gate closed
	if err := s.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	ask(map[netip.Addr]string{testV4: "192.0.2.1", node: "192.0.2.1"}) // serving
	if err := s.CloseGate(); err != nil {
		t.Fatal(err)
	}
	ask(map[netip.Addr]string{testV4: "192.0.2.2", node: "192.0.2.3"})
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Teardown(tctx); err != nil {
		t.Fatal(err)
	}
}
