package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// A block's further forwards are links of their own (ForwardLink): their
// FROM, servers and options, kube-dns ones over TCP; the first stays the
// block's group. A forward's plain targets beside tls:// ones are its
// TLS group's plain servers; a resolv.conf beside tls:// is refused.
func TestForwardLinksAndMixedTransports(t *testing.T) {
	c, err := corefileConfig(t, `.:53 {
    forward . 10.0.0.1 tls://10.0.0.9 {
        next NXDOMAIN
        tls_servername dns.example
    }
    forward example.net 10.0.0.2 {
        force_tcp
        next NXDOMAIN
    }
    forward . 10.96.0.10
}
`)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.DropIn.Corefile
	links := cc.Links[cc.Servers[0]]
	if len(links) != 2 {
		t.Fatalf("links %+v", links)
	}
	if l := links[0]; l.Route.Zone != "example.net." || !slices.Equal(l.Route.Servers, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:53")}) || !l.Route.ForceTCP || l.Kube {
		t.Errorf("second forward %+v", l)
	}
	if l := links[1]; l.Route.Zone != "." || !l.Kube || !l.Route.ForceTCP {
		t.Errorf("third forward (kube-dns) %+v", l)
	}
	o := c.DropIn.NodeForward
	if o == nil || !o.TLS || o.Plain != "10.0.0.1:53" || !o.PlainServers()[netip.MustParseAddrPort("10.0.0.1:53")] || len(o.PlainServers()) != 1 {
		t.Fatalf("the . group's options %+v", o)
	}
	if !strings.Contains(strings.Join(cc.Mapping, "\n"), "forward 3 of 3") {
		t.Errorf("mapping:\n%s", strings.Join(cc.Mapping, "\n"))
	}
	if _, err := corefileConfig(t, ".:53 {\n    forward . tls://10.0.0.9 /etc/resolv.conf\n}\n"); err == nil || !strings.Contains(err.Error(), "resolv.conf beside tls://") {
		t.Errorf("a resolv.conf beside tls://: %v", err)
	}
}
