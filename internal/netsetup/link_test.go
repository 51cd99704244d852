package netsetup

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestEnsureLinkAdopt adopts a veth renamed to our link name, which already
// holds one of the addresses: the others are added, IPv6 ones without
// duplicate address detection, and teardown removes only those, leaving the
// link and the address it had.
func TestEnsureLinkAdopt(t *testing.T) {
	for _, fam := range testFamilies {
		t.Run(fam.name, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) {
				const name = "nlt-adopted" // a custom name, as -interfacename allows
				adoptableLink(t, name)
				pre := fam.addrs[0]
				sh(t, "ip", "addr", "add", netip.PrefixFrom(pre, pre.BitLen()).String(), "dev", name, "nodad")
				extra := netip.MustParseAddr("169.254.20.11")
				if pre.Is6() {
					extra = netip.MustParseAddr("fd00::11")
				}
				addrs := append([]netip.Addr{extra}, fam.addrs...)

				rec := &recorder{}
				s, err := New(Config{InterfaceName: name, Addrs: addrs, SetupInterface: true, Logger: testLogger(t), Observer: rec})
				if err != nil {
					t.Fatal(err)
				}
				for range 3 {
					if err := s.EnsureLink(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
				if out := sh(t, "ip", "-o", "link", "show", "dev", name); !strings.Contains(out, ",UP") {
					t.Errorf("link not up: %s", out)
				}
				listed := linkAddrs(t, name)
				for _, a := range addrs {
					if !hasAddr(t, name, a) {
						t.Errorf("address %s missing:\n%s", a, listed)
					}
					if strings.Count(listed, " "+netip.PrefixFrom(a, a.BitLen()).String()+" ") != 1 {
						t.Errorf("address %s listed more than once:\n%s", a, listed)
					}
					// Bindable at once: IPv6 addresses are not left tentative.
					pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, 0).String())
					if err != nil {
						t.Errorf("bind %s: %v", a, err)
						continue
					}
					pc.Close()
				}
				if strings.Contains(listed, "tentative") {
					t.Errorf("tentative address:\n%s", listed)
				}

				if err := s.Teardown(t.Context()); err != nil {
					t.Fatal(err)
				}
				sh(t, "ip", "link", "show", "dev", name) // the adopted link stays
				for _, a := range addrs {
					wasThere := a == pre
					if got := hasAddr(t, name, a); got != wasThere {
						t.Errorf("after teardown, address %s present = %v, want %v", a, got, wasThere)
					}
				}
				rec.noErrors(t)
			})
		})
	}
}

// TestEnsureLinkDummy creates the dummy link, repairs its deletion within a
// second, and deletes it at teardown. It needs a kernel with the dummy link
// type.
func TestEnsureLinkDummy(t *testing.T) {
	t.Parallel()
	inNetns(t, nil, func(t *testing.T) {
		if ok, why := dummySupported(t); !ok {
			t.Skip(why)
		}
		sh(t, "ip", "link", "set", "lo", "up")
		rec := &recorder{}
		addrs := []netip.Addr{testV4, testV6}
		s, err := New(Config{Addrs: addrs, SetupInterface: true, SyncInterval: time.Hour, Logger: testLogger(t), Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EnsureLink(t.Context()); err != nil {
			t.Fatal(err)
		}
		if out := sh(t, "ip", "-d", "link", "show", "dev", defaultInterfaceName); !strings.Contains(out, "dummy") {
			t.Errorf("link is not a dummy: %s", out)
		}
		for _, a := range addrs {
			if !hasAddr(t, defaultInterfaceName, a) {
				t.Errorf("address %s missing", a)
			}
		}

		ctx, stop := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		sh(t, "ip", "link", "del", defaultInterfaceName)
		took := eventually(t, time.Second, "deleted link recreated with its addresses", func() bool {
			for _, a := range addrs {
				if !hasAddrQuiet(defaultInterfaceName, a) {
					return false
				}
			}
			return true
		})
		t.Logf("link restored after %v", took)
		stop()
		<-done

		if err := s.Teardown(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := net.InterfaceByName(defaultInterfaceName); err == nil {
			t.Error("the link we created survived teardown")
		}
		rec.noErrors(t)
	})
}

// TestEnsureLinkNoDummy checks the error where the kernel lacks the dummy
// link type: one line, wrapping ErrNoDummy, naming -setupinterface=false,
// counted as interface_add.
func TestEnsureLinkNoDummy(t *testing.T) {
	t.Parallel()
	inNetns(t, nil, func(t *testing.T) {
		if ok, _ := dummySupported(t); ok {
			t.Skip("kernel has the dummy link type; the no-dummy path cannot be reached")
		}
		rec := &recorder{}
		s, err := New(Config{Addrs: []netip.Addr{testV4}, SetupInterface: true, Logger: testLogger(t), Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		err = s.EnsureLink(t.Context())
		if !errors.Is(err, ErrNoDummy) {
			t.Fatalf("EnsureLink = %v, want ErrNoDummy", err)
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, "-setupinterface=false") || !strings.Contains(msg, "dummy") {
			t.Errorf("error is not one clear line naming the way out: %q", msg)
		}
		if n := rec.count(KindInterfaceAdd); n != 1 {
			t.Errorf("interface_add counted %d times, want 1", n)
		}
		if err := s.Teardown(t.Context()); err != nil {
			t.Errorf("Teardown after a failed setup: %v", err)
		}
	})
}

// TestLinkRepair checks that the netlink-driven reconciler (the periodic one
// is an hour away) restores a removed address and a downed link within
// about a second.
func TestLinkRepair(t *testing.T) {
	for _, fam := range testFamilies {
		t.Run(fam.name, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) {
				adoptableLink(t, defaultInterfaceName)
				rec := &recorder{}
				s, err := New(Config{Addrs: fam.addrs, SetupInterface: true, SyncInterval: time.Hour, Logger: testLogger(t), Observer: rec})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.EnsureLink(t.Context()); err != nil {
					t.Fatal(err)
				}
				ctx, stop := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() { defer close(done); s.Run(ctx) }()
				defer func() { stop(); <-done }()

				// Run checks the link once it has subscribed, so a removal
				// racing with the subscription is repaired too.
				for _, a := range fam.addrs {
					sh(t, "ip", "addr", "del", netip.PrefixFrom(a, a.BitLen()).String(), "dev", defaultInterfaceName)
					took := eventually(t, time.Second, "address "+a.String()+" restored", func() bool { return hasAddrQuiet(defaultInterfaceName, a) })
					t.Logf("address %s restored after %v", a, took)
				}
				sh(t, "ip", "link", "set", defaultInterfaceName, "down")
				took := eventually(t, time.Second, "link set up again", func() bool {
					ifc, err := net.InterfaceByName(defaultInterfaceName)
					return err == nil && ifc.Flags&net.FlagUp != 0
				})
				t.Logf("link up again after %v", took)
				for _, a := range fam.addrs {
					eventually(t, time.Second, "address "+a.String()+" present after link down/up", func() bool { return hasAddrQuiet(defaultInterfaceName, a) })
				}
				rec.noErrors(t)
			})
		})
	}
}

// hasAddrQuiet is hasAddr for polling loops: a failure to list is "no".
func hasAddrQuiet(link string, a netip.Addr) bool {
	ifc, err := net.InterfaceByName(link)
	if err != nil {
		return false
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return false
	}
	for _, x := range addrs {
		if n, ok := x.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}
