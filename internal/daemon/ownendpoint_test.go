package daemon

import (
	"net/netip"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// TestOwnEndpoint: a kube-dns endpoint is ours on one of our listen
// sockets, and on any port of an address we listen on by name; another
// address of the host on another port than the wildcard's is not (a
// hostNetwork kube-dns pod's).
func TestOwnEndpoint(t *testing.T) {
	named := &Daemon{cfg: &config.Config{LocalIPs: []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10")}, Port: 53}}
	wild := &Daemon{cfg: &config.Config{LocalIPs: []netip.Addr{netip.IPv4Unspecified()}, Port: 53}}
	for _, tc := range []struct {
		d    *Daemon
		ap   string
		want bool
	}{
		{named, "10.96.0.10:53", true},
		{named, "10.96.0.10:5353", true},
		{named, "169.254.20.10:1053", true},
		{named, "10.244.0.2:53", false},
		{wild, "127.0.0.1:53", true},
		{wild, "127.0.0.1:5353", false},
		{wild, "10.244.0.2:53", false},
	} {
		if got := tc.d.ownEndpoint(netip.MustParseAddrPort(tc.ap)); got != tc.want {
			t.Errorf("%v listening, endpoint %s: ours %v, want %v", tc.d.cfg.LocalIPs, tc.ap, got, tc.want)
		}
	}
}
