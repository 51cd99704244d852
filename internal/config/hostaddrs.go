package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// ifaceAddrs lists an interface's addresses, IPv6 link-local ones with
// the interface as their zone (as a socket bound to one needs).
func ifaceAddrs(ifi *net.Interface) ([]netip.Addr, error) {
	as, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", ifi.Name, err)
	}
	var out []netip.Addr
	for _, a := range as {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is6() && ip.IsLinkLocalUnicast() {
			ip = ip.WithZone(ifi.Name)
		}
		out = append(out, ip)
	}
	return out, nil
}

// bindInterface is corefile.Options.Interface on this host: an existing
// interface's addresses; -interfacename, which -setupinterface creates at
// start, stands for -localip (with the addresses it has already).
func (c *Config) bindInterface(name string) ([]netip.Addr, bool) {
	pending := name == c.InterfaceName && c.SetupInterface && !c.LocalMode
	var out []netip.Addr
	ifi, err := net.InterfaceByName(name)
	if err == nil {
		out, err = ifaceAddrs(ifi)
	}
	if err != nil && !pending {
		return nil, false
	}
	if pending {
		for _, a := range c.LocalIPs {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, true
}

// foundOnHost says whether a bind address of s came from an interface name
// other than the one -setupinterface creates (whose addresses are -localip).
func (c *Config) foundOnHost(s *corefile.Server, a netip.Addr) bool {
	for name, addrs := range s.BindIfaces {
		if slices.Contains(addrs, a) && !(name == c.InterfaceName && c.SetupInterface) {
			return true
		}
	}
	return false
}

// hostAddrs lists the addresses of this host's (network namespace's)
// interfaces that are up, without IPv6 link-local ones. Interfaces that
// are down are left out: kube-proxy's IPVS mode puts every ClusterIP on
// kube-ipvs0, a dummy link it never sets up.
func hostAddrs() []netip.Addr {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for i := range ifs {
		if ifs[i].Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := ifaceAddrs(&ifs[i])
		for _, ip := range addrs {
			if ip.Zone() == "" && !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	return out
}

// serves reports whether a query to a reaches one of the listen addresses
// own: a is one of them, or one is the wildcard (bind 0.0.0.0) and a is an
// address of this host. A forward there loops.
func serves(own []netip.Addr, a netip.Addr) bool {
	if contains(own, a) {
		return true
	}
	if slices.ContainsFunc(own, netip.Addr.IsUnspecified) {
		return contains(hostAddrs(), a.Unmap())
	}
	return false
}

// Ours reports whether a query to ap reaches one of our own DNS listen
// sockets (Sockets; the wildcard's on any address of this host): a forward
// there, or a kube-dns endpoint there, loops back into us.
func (c *Config) Ours(ap netip.AddrPort) bool {
	for _, s := range c.Sockets() {
		if s.Port() == ap.Port() && serves([]netip.Addr{s.Addr()}, ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

// ErrCannotListen is CheckListen's error: an address the daemon would
// listen on is not on this host and nothing will put it there.
var ErrCannotListen = errors.New("cannot listen")

// CheckListen checks, for -check-config, that every address the start
// listens on (DNS, health, metrics) can be bound here: it is an address of
// this host (the kernel's word: a socket is bound to it, port 0, and
// closed), or -setupinterface puts it on the interface at start.
func (c *Config) CheckListen() error {
	created := c.InterfaceIPs
	if created == nil {
		created = c.LocalIPs
	}
	var missing []string
	check := func(what string, a netip.Addr) {
		if a.IsUnspecified() || (c.SetupInterface && !c.LocalMode && slices.Contains(created, a)) {
			return
		}
		if err := bindable(a); err != nil {
			missing = append(missing, fmt.Sprintf("%s %s (%v)", what, a, err))
		}
	}
	for _, a := range c.OwnAddrs() {
		check("dns", a)
	}
	for what, hp := range map[string]string{"health": c.HealthAddr, "metrics": c.MetricsAddr} {
		if h, _, err := net.SplitHostPort(hp); err == nil {
			if a, err := netip.ParseAddr(h); err == nil {
				check(what, a)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	why := "-setupinterface=false: nothing creates them"
	if c.SetupInterface {
		why = fmt.Sprintf("-setupinterface creates only %v on %s", created, c.InterfaceName)
	}
	return fmt.Errorf("%w: not addresses of this host: %s; %s", ErrCannotListen, strings.Join(missing, ", "), why)
}

// bindable binds a UDP socket to a, port 0, and closes it.
func bindable(a netip.Addr) error {
	var family int
	var sa unix.Sockaddr
	if a = a.Unmap(); a.Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: a.As4()}
	} else {
		sa6 := &unix.SockaddrInet6{Addr: a.As16()}
		if z := a.Zone(); z != "" {
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				return err
			}
			sa6.ZoneId = uint32(ifi.Index)
		}
		family, sa = unix.AF_INET6, sa6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, sa)
}
