package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// links maps the further forwards of a block with several (CoreDNS runs
// them in turn, each handing on what it does not take): a group each
// (cc.Links), and how each hands on.
func (m *mapping) links(s *corefile.Server) error {
	links, err := m.c.forwardLinks(s, m.isKube)
	if err != nil {
		return err
	}
	if m.cc.Links == nil {
		m.cc.Links = map[*corefile.Server][]ForwardLink{}
	}
	m.cc.Links[s] = links
	all := append([]*corefile.Forward{s.Forward}, s.MoreForwards...)
	for i, g := range all {
		group := "the block's group (above)"
		if i > 0 {
			group = fmt.Sprintf("a group of its own %v", links[i-1].Route.Servers)
			if links[i-1].Kube {
				group = fmt.Sprintf("a group of its own to kube-dns %v over pipelined TCP", links[i-1].Route.Servers)
			}
		}
		how := append(handsOn(g, i == len(all)-1), "the rest is answered here")
		m.mapped(s, "forward %d of %d (%s %v): %s; %s", i+1, len(all), g.From, upstreams(g), group, strings.Join(how, "; "))
	}
	return nil
}

// handsOn says what forward g hands on to the next one (last: it is the
// block's last forward).
func handsOn(g *corefile.Forward, last bool) []string {
	var how []string
	if g.From != "." {
		how = append(how, "names outside "+g.From+" go on to the next forward")
	}
	if len(g.Except) > 0 {
		how = append(how, fmt.Sprintf("names under %v go on to the next forward", g.Except))
	}
	if len(g.Next) > 0 || g.NextOnNodata {
		var rcs []string
		for _, rc := range g.Next {
			rcs = append(rcs, dns.RcodeToString[rc])
		}
		if g.NextOnNodata {
			rcs = append(rcs, "NODATA")
		}
		if last {
			how = append(how, fmt.Sprintf("next %v: the last forward, so returned as it is (as CoreDNS)", rcs))
		} else {
			how = append(how, fmt.Sprintf("answers %v go on to the next forward", rcs))
		}
	}
	return how
}

// mapCacheTTLs sets the shared cache from the blocks: capacities add up
// (the byte budget stays the memory bound); the block serving the cluster
// domain gives the cluster TTL caps, the "." block the others.
func (c *Config) mapCacheTTLs(set map[string]bool, succCap, denCap int) {
	srv := c.DropIn.Corefile.Servers
	setDur := func(flag string, dst *time.Duration, v time.Duration) {
		if set[flag] {
			if *dst != v {
				c.note("-%s %v wins over the Corefile's %v", flag, *dst, v)
			}
			return
		}
		*dst = v
	}
	setInt := func(flag string, dst *int, v int) {
		if set[flag] {
			if *dst != v {
				c.note("-%s %d wins over the Corefile's %d", flag, *dst, v)
			}
			return
		}
		*dst = v
	}
	setInt("success-capacity", &c.Cache.SuccessCapacity, max(succCap, 1))
	setInt("denial-capacity", &c.Cache.DenialCapacity, max(denCap, 1))
	minTTL := time.Duration(-1)
	for _, s := range srv {
		if ca := s.Cache; ca != nil && (minTTL < 0 || min(ca.SuccessMinTTL, ca.DenialMinTTL) < minTTL) {
			minTTL = min(ca.SuccessMinTTL, ca.DenialMinTTL)
		}
	}
	first := firstBlocks(srv)
	if cl := first.LookupString(c.ClusterDomain); cl != nil && cl.Cache != nil {
		setDur("cluster-success-ttl", &c.Cache.ClusterSuccessTTL, cl.Cache.SuccessTTL)
		setDur("cluster-denial-ttl", &c.Cache.ClusterDenialTTL, cl.Cache.DenialTTL)
	}
	if root, ok := first.Get("."); ok && root.Cache != nil {
		ca := root.Cache
		setDur("success-ttl", &c.Cache.SuccessTTL, ca.SuccessTTL)
		setDur("denial-ttl", &c.Cache.DenialTTL, ca.DenialTTL)
		// SERVFAIL: CoreDNS caches it 5 s by default and allows 5 m; we
		// never cache it past 5 s (an upstream blip must not outlive itself).
		sf := min(ca.ServFail, 5*time.Second)
		if ca.ServFail > sf {
			c.note("cache servfail %v: capped at %v", ca.ServFail, sf)
		}
		setDur("servfail-ttl", &c.Cache.ServFailTTL, sf)
		setDur("serve-stale", &c.Cache.StaleWindow, ca.ServeStale)
		setInt("prefetch", &c.Cache.PrefetchHits, ca.Prefetch)
	}
	if minTTL >= 0 {
		// The floor may not exceed any cap.
		for _, d := range []time.Duration{c.Cache.ClusterSuccessTTL, c.Cache.ClusterDenialTTL, c.Cache.SuccessTTL, c.Cache.DenialTTL} {
			minTTL = min(minTTL, d)
		}
		setDur("min-ttl", &c.Cache.MinTTL, minTTL)
	}
}

// firstBlocks gives a name the block of the longest zone holding it, of a
// zone in several blocks (other binds) the first: the block CoreDNS picks
// for the addresses that see them all.
func firstBlocks(srv []*corefile.Server) *zone.Table[*corefile.Server] {
	b := zone.NewBuilder[*corefile.Server](nil)
	for _, s := range srv {
		for _, z := range s.Zones {
			_ = b.SetFirst(z, s)
		}
	}
	return b.Table()
}
