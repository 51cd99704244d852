package config

import (
	"net/netip"
	"strings"
	"testing"
)

// TestOurs: an address and port reaches us when it is one of our listen
// sockets, or any address of this host on the wildcard's port.
func TestOurs(t *testing.T) {
	c := &Config{LocalIPs: []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10")}, Port: 53}
	for ap, want := range map[string]bool{"169.254.20.10:53": true, "10.96.0.10:53": true, "10.96.0.10:5353": false, "10.244.0.2:53": false} {
		if got := c.Ours(netip.MustParseAddrPort(ap)); got != want {
			t.Errorf("%s: ours %v, want %v", ap, got, want)
		}
	}
	wild := &Config{LocalIPs: []netip.Addr{netip.IPv4Unspecified()}, Port: 53}
	if !wild.Ours(netip.MustParseAddrPort("127.0.0.1:53")) || wild.Ours(netip.MustParseAddrPort("127.0.0.1:54")) {
		t.Error("the wildcard: every address of this host on its port, no other port")
	}
}

// TestCorefileForwardToOurselvesRefused (issue 41): a forward whose target
// is one of our own listen sockets, in any block, is refused with its
// block's position: every query it took would come back to us. The same address on
// another port is someone else's.
func TestCorefileForwardToOurselvesRefused(t *testing.T) {
	for _, tc := range []struct{ corefile, want string }{
		{".:5353 {\n    forward . 169.254.20.10:5353\n}\n", "Corefile:1: forward . 169.254.20.10:5353: one of our own listen sockets"},
		{"example.org:5353 {\n    forward . 169.254.20.10:5353\n}\n.:5353 {\n    forward . 192.0.2.53\n}\n", "Corefile:1: forward . 169.254.20.10:5353: one of our own listen sockets"},
		{".:5353 {\n    forward . 192.0.2.53\n    forward example.net 169.254.20.10:5353\n}\n", "Corefile:1: forward example.net. 169.254.20.10:5353: one of our own listen sockets"},
	} {
		_, err := corefileConfig(t, tc.corefile, "-setupinterface=false", "-setupiptables=false")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.corefile, err, tc.want)
		}
	}
	if _, err := corefileConfig(t, ".:5353 {\n    forward . 169.254.20.10:53\n}\n", "-setupinterface=false", "-setupiptables=false"); err != nil {
		t.Errorf("our address on another port: %v", err)
	}
}

// TestDnstapToOurselvesRefused: a dnstap collector that is one of our own
// DNS listen sockets is refused: its frames would come back as queries.
func TestDnstapToOurselvesRefused(t *testing.T) {
	_, err := corefileConfig(t, ".:5353 {\n    dnstap tcp://169.254.20.10:5353\n    forward . 192.0.2.53\n}\n", "-setupinterface=false", "-setupiptables=false")
	if err == nil || !strings.Contains(err.Error(), "dnstap tcp://169.254.20.10:5353: one of our own DNS listen sockets") {
		t.Errorf("dnstap to ourselves: %v", err)
	}
	if _, err := corefileConfig(t, ".:5353 {\n    dnstap tcp://169.254.20.10:6000\n    forward . 192.0.2.53\n}\n", "-setupinterface=false", "-setupiptables=false"); err != nil {
		t.Errorf("a collector on our address, another port: %v", err)
	}
}
