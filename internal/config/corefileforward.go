package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// ForwardOptions are a Corefile forward's options as our forward groups
// take them (forward.GroupConfig); zero values keep our defaults.
type ForwardOptions struct {
	MaxFails      int           // consecutive failures marking a server down; <0: never (max_fails 0)
	ProbeInterval time.Duration // health_check: first wait before probing a down server
	Spread        bool          // policy random|round_robin: queries start at each server in turn
	MaxInflight   int           // max_concurrent: queries in flight in the group (0: -max-inflight)
	IdleTimeout   time.Duration // expire: a TCP connection idle this long is closed
	// TCP is force_tcp: the group asks over TCP (read by the node group,
	// which is UDP otherwise; a zone route reads ZoneRoute.ForceTCP, the
	// kube-dns group is always TCP).
	TCP bool
	// FailFast: SERVFAIL at once when every server is down
	// (failfast_all_unhealthy_upstreams).
	FailFast bool
}

// forwardOptions maps f's options. policy random and round_robin both
// spread queries over the servers in turn (round robin: the same spread,
// deterministic); sequential is our order with failover. force_tcp picks
// TCP (TCP); prefer_udp is our UDP groups' way already (UDP, TCP when an
// answer is truncated).
func forwardOptions(f *corefile.Forward, maxInflight int) ForwardOptions {
	o := ForwardOptions{
		MaxFails:      f.MaxFails,
		ProbeInterval: f.HealthCheck,
		Spread:        f.Policy != "sequential",
		MaxInflight:   f.MaxConcurrent,
		IdleTimeout:   f.Expire,
		TCP:           f.ForceTCP,
		FailFast:      f.FailFast,
	}
	if o.MaxFails == 0 {
		o.MaxFails = -1 // CoreDNS: 0 never marks a server down
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = maxInflight
	}
	return o
}

func (o ForwardOptions) String() string {
	fails := fmt.Sprint(o.MaxFails)
	if o.MaxFails < 0 {
		fails = "never down"
	}
	tcp := ""
	if o.TCP {
		tcp = ", force_tcp"
	}
	if o.FailFast {
		tcp += ", failfast_all_unhealthy_upstreams"
	}
	return fmt.Sprintf("max_fails %s, probe every %v, %s, at most %d in flight, TCP idle %v%s",
		fails, o.ProbeInterval, map[bool]string{true: "queries spread over the servers in turn", false: "servers asked in order (sequential)"}[o.Spread], o.MaxInflight, o.IdleTimeout, tcp)
}

// checkExcept accepts `except` only where it changes nothing: every
// excepted zone has a block of its own (CoreDNS picks that block for its
// names, so they never reach this forward). Elsewhere CoreDNS would pass the
// names on to no next plugin (SERVFAIL); we do not route that way, so it is
// refused rather than ignored.
func checkExcept(s *corefile.Server, f *corefile.Forward, all []*corefile.Server) error {
	for _, z := range f.Except {
		own := false
		for _, o := range all {
			for _, oz := range o.Zones {
				if (z == oz || strings.HasSuffix(z, "."+oz)) && len(oz) > longestZoneOf(s, z) {
					own = true
				}
			}
		}
		if !own {
			return usage("%s: forward except %s: names under %s without a block of their own are not supported (CoreDNS answers them SERVFAIL); add a block for %s or drop the except", s.Pos, z, z, z)
		}
	}
	return nil
}

// longestZoneOf is the length of s's longest zone holding name.
func longestZoneOf(s *corefile.Server, name string) int {
	n := -1
	for _, z := range s.Zones {
		if z == "." || name == z || strings.HasSuffix(name, "."+z) {
			n = max(n, len(z))
		}
	}
	return n
}
