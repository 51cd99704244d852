package config

import (
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/dns64"
)

// checkDNS64 maps dns64 without allow_ipv4 by the family of the listen
// addresses: CoreDNS translates for IPv6 clients only, and a socket bound
// to an IPv4 address has IPv4 clients only. Every address IPv4: no client
// is translated, so the directive is dropped from the block (returned, for
// a note); every address IPv6: translated as written; both: refused, as
// behind our cache one answer serves every client of a question.
func checkDNS64(servers []*corefile.Server, listen []netip.Addr) (dropped []*corefile.Server, err error) {
	v4, v6 := false, false
	for _, a := range listen {
		if a.IsUnspecified() { // the wildcard socket: dual-stack
			v4, v6 = true, true
		} else if a.Unmap().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	for _, s := range servers {
		c, _ := s.Config("dns64").(*dns64.Config)
		if c == nil || c.AllowIPv4 || !v4 {
			continue
		}
		if v6 {
			return nil, usage("%s: dns64 without allow_ipv4, and we listen on IPv4 and IPv6 addresses %v: CoreDNS translates for the IPv6 clients only, but behind our cache one answer serves every client of a question; bind one family, or add allow_ipv4", s.Pos, listen)
		}
		delete(s.Directives, "dns64")
		s.Plugins = slices.DeleteFunc(s.Plugins, func(p corefile.Plugin) bool { return p.Name == "dns64" })
		dropped = append(dropped, s)
	}
	return dropped, nil
}
