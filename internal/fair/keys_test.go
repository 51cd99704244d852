package fair

import (
	"net/netip"
	"testing"
)

// TestClientsKeys: loopback (all of 127/8, ::1, mapped or not) and the
// node's addresses (zones ignored) are the node by source port; any other
// address is itself; a nil mapping maps nothing.
func TestClientsKeys(t *testing.T) {
	c := NewClients([]netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.0.0.5"),
		netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("10.0.0.5")})
	for _, tc := range []struct {
		a    string
		port uint16
		want netip.Addr
	}{
		{"127.0.0.1", 53000, NodeKey(53000)},
		{"127.42.7.9", 1, NodeKey(1)},
		{"::1", 2, NodeKey(2)},
		{"::ffff:127.0.0.1", 3, NodeKey(3)},
		{"169.254.20.10", 4, NodeKey(4)},
		{"10.0.0.5", 5, NodeKey(5)},
		{"fe80::1", 6, NodeKey(6)},
		{"fe80::1%veth9", 7, NodeKey(7)},
		{"10.0.0.6", 8, netip.MustParseAddr("10.0.0.6")},
		{"10.244.1.7", 9, netip.MustParseAddr("10.244.1.7")},
		{"fd00::7", 10, netip.MustParseAddr("fd00::7")},
	} {
		if got := c.Key(netip.MustParseAddr(tc.a), tc.port); got != tc.want {
			t.Errorf("%s port %d: %v, want %v", tc.a, tc.port, got, tc.want)
		}
	}
	c.SetNode(nil)
	if got := c.Key(netip.MustParseAddr("10.0.0.5"), 5); got != netip.MustParseAddr("10.0.0.5") {
		t.Errorf("after SetNode(nil) the old address is still the node: %v", got)
	}
	var none *Clients
	if got := none.Key(netip.MustParseAddr("127.0.0.1"), 9); got != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("nil mapping: %v", got)
	}
}

func TestNodeKeys(t *testing.T) {
	for _, k := range []netip.Addr{Node, NodeKey(1), NodeKey(65535)} {
		if !IsNode(k) || Owner(k) != Node {
			t.Errorf("%v: IsNode %v Owner %v", k, IsNode(k), Owner(k))
		}
	}
	for _, k := range []netip.Addr{Prefetch, {}, netip.MustParseAddr("100::1:0:0:0"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::1")} {
		if IsNode(k) || Owner(k) != k {
			t.Errorf("%v: IsNode %v Owner %v", k, IsNode(k), Owner(k))
		}
	}
	if Prefetch == Node || NodeKey(1) == NodeKey(2) {
		t.Fatal("keys collide")
	}
}
