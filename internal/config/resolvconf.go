package config

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// systemdStub is the address of systemd-resolved's local stub. A node whose
// resolv.conf points there would make us forward to a resolver that only
// answers on the node's loopback, and which may itself forward to us; its
// real upstreams are in SystemdResolvConf.
var systemdStub = netip.MustParseAddr("127.0.0.53")

// SystemdResolvConf lists systemd-resolved's real upstream servers.
var SystemdResolvConf = "/run/systemd/resolve/resolv.conf"

// LoadResolvConf returns the nameservers of a resolv.conf, in file order,
// on port 53. It follows systemd-resolved's stub to SystemdResolvConf and
// drops any server that is one of our own listen addresses on our port (a
// forwarding loop). An empty result is an error that says why.
func LoadResolvConf(path string, own []netip.Addr, ownPort int) ([]netip.AddrPort, error) {
	var bad []string
	servers, err := readNameservers(path, &bad)
	if err != nil {
		return nil, err
	}
	for _, s := range servers {
		if s == systemdStub {
			alt, err := readNameservers(SystemdResolvConf, &bad)
			if err != nil {
				return nil, fmt.Errorf("%s points at the systemd-resolved stub %s, and its upstream list: %w", path, systemdStub, err)
			}
			path, servers = SystemdResolvConf, alt
			break
		}
	}
	var out []netip.AddrPort
	var dropped []string
	for _, s := range servers {
		if ownPort == 53 && serves(own, s) {
			dropped = append(dropped, s.String())
			continue
		}
		out = append(out, netip.AddrPortFrom(s, 53))
	}
	if len(out) == 0 {
		if len(dropped) > 0 {
			return nil, fmt.Errorf("%s lists only our own addresses (%s): forwarding there would loop", path, strings.Join(dropped, ", "))
		}
		if len(bad) > 0 {
			return nil, fmt.Errorf("%s lists no usable nameserver (not IP addresses: %s)", path, strings.Join(bad, ", "))
		}
		return nil, fmt.Errorf("%s lists no nameserver", path)
	}
	return out, nil
}

func readNameservers(path string, bad *[]string) ([]netip.Addr, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			// One bad line must not take the node's DNS down: skip it
			// (the caller fails only if nothing usable is left).
			*bad = append(*bad, fmt.Sprintf("%s:%d %q", path, line, f[1]))
			continue
		}
		a = a.Unmap()
		if !contains(out, a) {
			out = append(out, a)
		}
	}
	return out, sc.Err()
}

func contains(list []netip.Addr, a netip.Addr) bool {
	for _, b := range list {
		if a == b {
			return true
		}
	}
	return false
}
