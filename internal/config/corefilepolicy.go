package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// ZonePolicy is the cache policy of the names of one Corefile block's zone
// (the resolver gives a question the policy of its longest matching zone,
// as CoreDNS picks the block): the one policy type, resolve.Policy, from
// the block's cache directive (corefile.Cache) to the entries it builds,
// with the zone and the block it comes from.
type ZonePolicy struct {
	Zone  string
	Block string // file:line of the block
	// Policy is the zone's. Its StaleRecheck is serve_stale's
	// FAILURE_RECHECK, negative for none (`0` or not given: CoreDNS's
	// default, every stale answer may start a refresh), or
	// -stale-recheck's when it is given explicitly.
	resolve.Policy
}

// immediateStale is the wait of a client whose answer is stale under
// `serve_stale DURATION immediate` (CoreDNS's default): none, the stale
// answer at once and the refresh behind, as CoreDNS (resolve.Policy's
// negative StaleClientTimeout). It used to be a millisecond, to let a
// refresh already in flight win; on loopback a refresh is often that fast,
// and the client then got the refresh where CoreDNS sends the stale answer
// (TestServeStalePolicyParityWithCoreDNS).
const immediateStale time.Duration = -1

// maxServFailTTL: we never cache SERVFAIL past 5 s (an upstream blip must
// not outlive itself), whatever a block's `servfail` says (CoreDNS allows
// 5 m).
const maxServFailTTL = 5 * time.Second

// zonePolicies builds each block's cache policy from its `cache` directive
// (CoreDNS 1.15's semantics: caps, floors under the caps, every record shown
// the entry's lifetime, servfail, serve_stale, prefetch, disable, keepttl).
// A block without `cache` caches nothing, as in CoreDNS. A flag given
// explicitly wins over every block (noted by mapCacheTTLs). A zone served
// by several blocks (other binds) gets its first block's policy here; the
// views (views.go) give each listen address its own block's.
func (c *Config) zonePolicies(cc *CorefileConfig, set map[string]bool) error {
	first := map[string]bool{}
	cc.ZonePolicies = cc.ZonePolicies[:0]
	for i, s := range cc.Servers {
		for _, z := range s.Zones {
			if first[z] {
				continue
			}
			first[z] = true
			zp, note := c.zonePolicy(uncachedOutside(s, z), z, set)
			zp.TTL.Tag = uint16(i + 1)
			if note != "" {
				c.note("%s", note)
			}
			cc.ZonePolicies = append(cc.ZonePolicies, zp)
		}
	}
	// A cache limited to zones inside a block's zone: those zones get the
	// block's cache policy (the rest of the block's names pass uncached).
	all := make([]int, len(cc.Servers))
	for i := range all {
		all[i] = i
	}
	for i, s := range cc.Servers {
		for _, z := range cacheZones(cc.Servers, all, i) {
			if first[z] {
				continue
			}
			first[z] = true
			zp, _ := c.zonePolicy(uncachedOutside(s, z), z, set)
			zp.TTL.Tag = uint16(i + 1)
			cc.ZonePolicies = append(cc.ZonePolicies, zp)
		}
	}
	return c.buildViews(cc, set)
}

// uncachedOutside is s as it serves its zone z: without its cache when the
// cache is limited to zones that do not hold all of z (CoreDNS's cache
// passes the other names on uncached).
func uncachedOutside(s *corefile.Server, z string) *corefile.Server {
	if s.Cache == nil || s.Cache.Covers(z) {
		return s
	}
	cp := *s
	cp.Cache = nil
	return &cp
}

// cacheZones are the zones inside block si's zones whose names its cache
// treats apart from the rest of its zone, each needing a policy of its
// own: the zones of its cache limit (`cache [TTL] ZONE...`) strictly
// inside one of si's zones that the limit does not cover, and the zones of
// `disable success|denial ZONE...` strictly inside one of si's zones; in
// both cases neither a zone of a block nor inside a block zone longer than
// si's zone holding it (that block answers those names).
func cacheZones(srv []*corefile.Server, blocks []int, si int) []string {
	s := srv[si]
	if s.Cache == nil {
		return nil
	}
	var out []string
	add := func(cz string, limit bool) {
		own := -1 // length of si's longest zone holding cz
		for _, z := range s.Zones {
			if zone.Holds(z, cz) && cz != z && (!limit || !s.Cache.Covers(z)) {
				own = max(own, len(z))
			}
		}
		if own < 0 || slices.Contains(out, cz) {
			return
		}
		for _, b := range blocks {
			for _, w := range srv[b].Zones {
				if zone.Holds(w, cz) && (cz == w || len(w) > own) {
					return // taken
				}
			}
		}
		out = append(out, cz)
	}
	for _, cz := range s.Cache.Zones {
		add(cz, true)
	}
	for _, dz := range s.Cache.DisableSuccessZones {
		add(dz, false)
	}
	for _, dz := range s.Cache.DisableDenialZones {
		add(dz, false)
	}
	return out
}

func (c *Config) zonePolicy(s *corefile.Server, z string, set map[string]bool) (ZonePolicy, string) {
	zp := ZonePolicy{Zone: z, Block: s.Pos.String()}
	ca := s.Cache
	if ca == nil {
		zp.TTL = cache.Policy{SuccessMax: time.Second, DenialMax: time.Second, NoSuccess: true, NoDenial: true, Pass: true}
		zp.StaleRecheck = c.Cache.StaleRecheck
		return zp, ""
	}
	cluster := zone.Holds(c.ClusterDomain, z)
	pick := func(flag string, flagVal, v time.Duration) time.Duration {
		if set[flag] {
			return flagVal
		}
		return v
	}
	sMax, dMax := pick("success-ttl", c.Cache.SuccessTTL, ca.SuccessTTL), pick("denial-ttl", c.Cache.DenialTTL, ca.DenialTTL)
	if cluster {
		sMax, dMax = pick("cluster-success-ttl", c.Cache.ClusterSuccessTTL, ca.SuccessTTL), pick("cluster-denial-ttl", c.Cache.ClusterDenialTTL, ca.DenialTTL)
	}
	sMin, dMin := pick("min-ttl", c.Cache.MinTTL, ca.SuccessMinTTL), pick("min-ttl", c.Cache.MinTTL, ca.DenialMinTTL)
	noSuccess, noDenial := ca.DisabledAt(z)
	zp.TTL = cache.Policy{
		SuccessMax: sMax, DenialMax: dMax,
		// CoreDNS: min(max(ttl, MINTTL), TTL): the cap wins over the floor.
		MinTTL: min(sMin, sMax), DenialMinSet: true, DenialMinTTL: min(dMin, dMax),
		NoSuccess: noSuccess, NoDenial: noDenial,
		Uniform: true, DenialNoSOA: true, KeepTTL: ca.KeepTTL,
	}
	if !set["prefetch"] {
		zp.TTL.PrefetchSet, zp.TTL.PrefetchHits, zp.TTL.PrefetchPercent = true, ca.Prefetch, ca.PrefetchPercent
	}
	var note string
	zp.ServFailTTL = pick("servfail-ttl", c.Cache.ServFailTTL, min(ca.ServFail, maxServFailTTL))
	if noDenial && !set["servfail-ttl"] {
		zp.ServFailTTL = 0 // CoreDNS's disable denial keeps SERVFAIL out too
	}
	if ca.ServFail > maxServFailTTL && !set["servfail-ttl"] {
		note = fmt.Sprintf("%s: cache servfail %v: SERVFAIL is cached %v at most", s.Pos, ca.ServFail, maxServFailTTL)
	}
	zp.StaleWindow = pick("serve-stale", c.Cache.StaleWindow, ca.ServeStale)
	wait := immediateStale
	if ca.ServeStaleVerify {
		wait = c.ForwardTimeout // verify: the refresh first, stale only if it fails
	}
	if ca.ServeStaleVerify && ca.ServeStaleVerifyTimeout > 0 {
		wait = ca.ServeStaleVerifyTimeout // verify VERIFY_TIMEOUT: the refresh, or stale after it
	}
	zp.StaleClientTimeout = pick("stale-client-timeout", c.Cache.StaleClientTimeout, wait)
	zp.StaleRecheck = c.Cache.StaleRecheck // -stale-recheck given explicitly
	if !set["stale-recheck"] {
		// FAILURE_RECHECK; CoreDNS's default is 0, none: after a failed
		// refresh the next stale answer may refresh again (one at a time).
		zp.StaleRecheck = ca.ServeStaleRecheck
		if zp.StaleRecheck == 0 {
			zp.StaleRecheck = -1
		}
	}
	if ca.ServeStaleTTLSet {
		zp.TTL.StaleTTL, zp.TTL.StaleTTLSet = uint32(ca.ServeStaleTTL/time.Second), true
	}
	// serve_stale_policy prefer_positive; an explicit -last-known-good wins
	// for the zones it lists (and off for the others).
	prefer, label := ca.PreferPositive, z
	if set["last-known-good"] {
		label = c.lastKnownGoodCovers(z)
		prefer = label != ""
	}
	if prefer && zp.StaleWindow > 0 {
		zp.TTL.PreferPositive, zp.TTL.LastKnownGood = true, cache.LastKnownGoodCounter(label)
	} else if prefer && note == "" {
		note = fmt.Sprintf("%s: -last-known-good %s: zone %s has no serve_stale, so nothing is kept there (the stale window bounds the policy)", s.Pos, label, z)
	}
	return zp, note
}

// String says what a zone's policy does, for -check-config.
func (zp ZonePolicy) String() string {
	t := zp.TTL
	if t.Pass {
		return "not cached, TTLs as the upstream gave them (no cache directive)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "success cap %v floor %v, denial cap %v floor %v", t.SuccessMax, t.MinTTL, t.DenialMax, t.DenialMinTTL)
	if t.NoSuccess {
		b.WriteString(", success not cached")
	}
	if t.NoDenial {
		b.WriteString(", denial not cached")
	}
	fmt.Fprintf(&b, ", SERVFAIL %v", zp.ServFailTTL)
	if zp.StaleWindow > 0 {
		if zp.StaleClientTimeout < 0 {
			fmt.Fprintf(&b, ", serve_stale %v (immediate: the stale answer at once, the refresh behind", zp.StaleWindow)
		} else {
			fmt.Fprintf(&b, ", serve_stale %v (client waits %v for the refresh", zp.StaleWindow, zp.StaleClientTimeout)
		}
		if t.StaleTTLSet {
			fmt.Fprintf(&b, ", stale TTL %ds", t.StaleTTL)
		}
		switch {
		case zp.StaleRecheck < 0:
			b.WriteString(", no failure recheck")
		case zp.StaleRecheck > 0:
			fmt.Fprintf(&b, ", failure recheck %v", zp.StaleRecheck)
		}
		b.WriteString(")")
		if t.PreferPositive {
			b.WriteString(", prefer_positive: the last answer that answers is kept over NXDOMAIN, NODATA, empty or referral refreshes")
		}
	}
	switch {
	case !t.PrefetchSet:
		b.WriteString(", prefetch by -prefetch")
	case t.PrefetchHits > 0:
		fmt.Fprintf(&b, ", prefetch after %d hits with %d%% of the life left", t.PrefetchHits, t.PrefetchPercent)
	}
	if t.KeepTTL {
		b.WriteString(", keepttl")
	}
	b.WriteString(", clients see the entry's lifetime on every record")
	return b.String()
}
