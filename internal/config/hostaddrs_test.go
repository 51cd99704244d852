package config

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
)

// loAddrs are this host's loopback addresses, read as bind lo reads them.
func loAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no lo interface")
	}
	addrs, err := ifaceAddrs(lo)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("lo: %v %v", addrs, err)
	}
	return addrs
}

// bind takes interface names and except, as CoreDNS's bind does: the
// interface's addresses, less except's, on the real lo of this host.
func TestBindInterfaceName(t *testing.T) {
	lo := loAddrs(t)
	c, err := corefileConfig(t, ".:53 {\n    bind lo\n    forward . 192.0.2.53\n}\n", "-setupinterface=false", "-setupiptables=false")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.LocalIPs, lo) {
		t.Errorf("bind lo: listen %v, lo has %v", c.LocalIPs, lo)
	}
	if len(c.InterfaceIPs) != 0 {
		t.Errorf("bind lo: the interface would get %v; lo's addresses are the host's", c.InterfaceIPs)
	}
	if err := c.CheckListen(); err != nil {
		t.Errorf("CheckListen: %v", err)
	}

	c, err = corefileConfig(t, ".:53 {\n    bind lo 169.254.20.10 {\n        except 127.0.0.1\n    }\n    forward . 192.0.2.53\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.DeleteFunc(slices.Clone(lo), func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.1") }), netip.MustParseAddr("169.254.20.10"))
	if !slices.Equal(c.LocalIPs, want) || !slices.Equal(c.InterfaceIPs, []netip.Addr{netip.MustParseAddr("169.254.20.10")}) {
		t.Errorf("bind lo 169.254.20.10 except 127.0.0.1: listen %v interface %v, want %v and [169.254.20.10]", c.LocalIPs, c.InterfaceIPs, want)
	}

	for _, tc := range []struct{ text, want string }{
		{"bind nosuch0", `bind: "nosuch0" is not an IP address or the name of an interface of this host`},
		{"bind lo {\n        except nosuch0\n    }", `"nosuch0" is not an IP address or the name of an interface`},
		{"bind lo {\n        except lo\n    }", "bind: lo except lo leaves no address to listen on"},
		{"bind lo {\n        except\n    }", "except: an address or interface name is required"},
		{"bind lo {\n        only 127.0.0.1\n    }", "option only is not supported"},
		{"bind 10.0.0.0/8", `"10.0.0.0/8" is not a valid IP address or interface name`},
		{"bind fe80::1%lo", "an address with a zone is not supported"},
	} {
		_, err := corefileConfig(t, ".:53 {\n    "+tc.text+"\n    forward . 192.0.2.53\n}\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
}

// -interfacename, which -setupinterface creates at start, stands for
// -localip before it exists.
func TestBindTheInterfaceWeCreate(t *testing.T) {
	c, err := corefileConfig(t, ".:53 {\n    bind nld-none-yet\n    forward . 192.0.2.53\n}\n", "-interfacename", "nld-none-yet")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("169.254.20.10")}
	if !slices.Equal(c.LocalIPs, want) || !slices.Equal(c.InterfaceIPs, want) {
		t.Errorf("listen %v interface %v, want %v", c.LocalIPs, c.InterfaceIPs, want)
	}
	if _, err := corefileConfig(t, ".:53 {\n    bind nld-none-yet\n    forward . 192.0.2.53\n}\n", "-interfacename", "nld-none-yet", "-setupinterface=false"); err == nil {
		t.Error("bind of an interface nothing creates: accepted")
	}
}

// bind 0.0.0.0 is one wildcard listen address, as CoreDNS's socket (the
// LRP mode: a pod's own addresses, now and later); bind :: is the same
// socket; the interface and the rules get -localip only; a resolver at one
// of the host's addresses is our own (a loop), a resolver elsewhere is not.
func TestBindWildcard(t *testing.T) {
	c, err := corefileConfig(t, ".:53 {\n    bind 0.0.0.0\n    forward . 192.0.2.53\n}\n", "-setupinterface=false", "-setupiptables=false")
	if err != nil {
		t.Fatal(err)
	}
	any4 := netip.IPv4Unspecified()
	if !slices.Equal(c.LocalIPs, []netip.Addr{any4}) {
		t.Errorf("bind 0.0.0.0: listen %v, want [0.0.0.0]", c.LocalIPs)
	}
	if err := c.CheckListen(); err != nil {
		t.Errorf("CheckListen: %v", err)
	}
	var out strings.Builder
	Describe(&out, c)
	if !strings.Contains(out.String(), "every address of this host, now and later, one wildcard socket") {
		t.Errorf("-check-config does not say what the wildcard listens on:\n%s", out.String())
	}

	c, err = corefileConfig(t, ".:53 {\n    bind 0.0.0.0\n    forward . 192.0.2.53\n}\nexample.org:53 {\n    bind ::\n    forward . 192.0.2.54\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	ll := netip.MustParseAddr("169.254.20.10")
	if !slices.Equal(c.LocalIPs, []netip.Addr{any4}) || !slices.Equal(c.InterfaceIPs, []netip.Addr{ll}) {
		t.Errorf("bind 0.0.0.0 and ::: listen %v interface %v, want [0.0.0.0] and -localip", c.LocalIPs, c.InterfaceIPs)
	}
	if got := BlocksSeenFrom(c.DropIn.Corefile.Servers, netip.AddrPortFrom(any4, 53)); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("the wildcard socket sees blocks %v, want both (bind 0.0.0.0 and bind ::)", got)
	}
	if c.HealthAddr != "169.254.20.10:8080" || c.MetricsAddr != "169.254.20.10:9253" {
		t.Errorf("bind 0.0.0.0 with -setupinterface: health %s metrics %s, want -localip's", c.HealthAddr, c.MetricsAddr)
	}

	dir := t.TempDir()
	rc := dir + "/resolv.conf"
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.1\nnameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns, err := LoadResolvConf(rc, []netip.Addr{any4}, 53)
	if err != nil || len(ns) != 1 || ns[0].Addr() != netip.MustParseAddr("192.0.2.53") {
		t.Errorf("resolv.conf behind the wildcard: %v %v, want only 192.0.2.53 (127.0.0.1 is ours)", ns, err)
	}
}

// -check-config is valid only when every listen address can be bound:
// the host has it, or -setupinterface creates it.
func TestCheckListen(t *testing.T) {
	text := ".:53 {\n    bind 169.254.20.10\n    forward . 192.0.2.53\n}\n"
	c, err := corefileConfig(t, text)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckListen(); err != nil {
		t.Errorf("-setupinterface creates 169.254.20.10: %v", err)
	}
	c, err = corefileConfig(t, text, "-setupinterface=false", "-setupiptables=false")
	if err != nil {
		t.Fatal(err)
	}
	err = c.CheckListen()
	if !errors.Is(err, ErrCannotListen) || !strings.Contains(err.Error(), "dns 169.254.20.10") || !strings.Contains(err.Error(), "nothing creates them") {
		t.Errorf("-setupinterface=false, 169.254.20.10 on no interface: %v", err)
	}
	// An address of lo's 127/8 that no interface lists is still bindable.
	c, err = corefileConfig(t, ".:53 {\n    bind 127.0.0.2\n    forward . 192.0.2.53\n}\n", "-setupinterface=false", "-setupiptables=false")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckListen(); err != nil {
		t.Errorf("127.0.0.2: %v", err)
	}
	// The health address counts too (the LRP mode's health on the
	// link-local address, which the pod has not).
	c, err = corefileConfig(t, ".:53 {\n    bind 127.0.0.2\n    health 169.254.20.10:8080\n    forward . 192.0.2.53\n}\n", "-setupinterface=false", "-setupiptables=false")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckListen(); err == nil || !strings.Contains(err.Error(), "health 169.254.20.10") {
		t.Errorf("health on a missing address: %v", err)
	}
}
