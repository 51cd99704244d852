package config

import (
	"net/netip"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// fetchSide says how the directives that answer behind the cache are run
// (internal/daemon/chain.go), for -check-config.
var fetchSide = map[string]string{
	"template": "answered on the fetch side of the cache, in plugin.cfg order (internal/template); its answers are cached",
	"hosts":    "answered on the fetch side of the cache, in plugin.cfg order (internal/hosts); the file is checked every reload interval on a miss",
	"rewrite":  "on the fetch side of the cache, in plugin.cfg order (internal/rewrite); the cache keys the client's name",
	"dns64":    "on the fetch side of the cache, in plugin.cfg order (internal/dns64); one answer serves every client of the question",
}

// checkDNS64 refuses dns64 without allow_ipv4 when the daemon listens on
// an IPv4 address: CoreDNS leaves an IPv4 client's answer alone, but
// behind our cache one answer serves every client of a question.
func checkDNS64(servers []*corefile.Server, listen []netip.Addr) error {
	for _, s := range servers {
		if s.DNS64 == nil || s.DNS64.AllowIPv4 {
			continue
		}
		for _, a := range listen {
			if a.Unmap().Is4() {
				return usage("%s: dns64 without allow_ipv4, and we listen on %s: CoreDNS leaves IPv4 clients' answers alone, but behind our cache one answer serves every client of a question; bind IPv6 addresses only, or add allow_ipv4", s.Pos, a)
			}
		}
	}
	return nil
}
