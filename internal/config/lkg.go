package config

import (
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
)

// FlagZone is the cache policy of one zone without a Corefile.
type FlagZone struct {
	Name string
	TTL  cache.Policy
}

// FlagPolicies are the cache policies of the flags (no Corefile): def for
// names outside every zone, and the zones: the cluster domain's caps, and
// each -last-known-good zone with prefer_positive (its own zone in the
// policy table, with the caps of the domain it is in).
func (c *Config) FlagPolicies() (def cache.Policy, zones []FlagZone) {
	cc := &c.Cache
	def = cache.Policy{SuccessMax: cc.SuccessTTL, DenialMax: cc.DenialTTL, MinTTL: cc.MinTTL}
	cluster := cache.Policy{SuccessMax: cc.ClusterSuccessTTL, DenialMax: cc.ClusterDenialTTL, MinTTL: cc.MinTTL}
	lkg := func(p cache.Policy, zone string) cache.Policy {
		p.PreferPositive, p.LastKnownGood = true, cache.LastKnownGoodCounter(zone)
		return p
	}
	clusterZone := FlagZone{Name: c.ClusterDomain, TTL: cluster}
	if z := c.lastKnownGoodCovers(c.ClusterDomain); z != "" {
		clusterZone.TTL = lkg(cluster, z)
	}
	for _, z := range cc.LastKnownGood {
		switch {
		case z == ".":
			def = lkg(def, ".")
		case z == c.ClusterDomain:
		case inZone(z, c.ClusterDomain):
			zones = append(zones, FlagZone{Name: z, TTL: lkg(cluster, z)})
		default:
			zones = append(zones, FlagZone{Name: z, TTL: lkg(def, z)})
		}
	}
	// A listed zone above the cluster domain has its own entry for the
	// names outside it; the cluster domain, longer, is looked up first and
	// keeps its caps.
	return def, append([]FlagZone{clusterZone}, zones...)
}

// lastKnownGoodCovers returns the -last-known-good zone that holds zone
// (the longest), "" when none.
func (c *Config) lastKnownGoodCovers(zone string) string {
	best := ""
	for _, z := range c.Cache.LastKnownGood {
		if inZone(zone, z) && len(z) > len(best) {
			best = z
		}
	}
	return best
}

// inZone reports whether name (an FQDN) is zone or below it.
func inZone(name, zone string) bool {
	return zone == "." || name == zone || strings.HasSuffix(name, "."+zone)
}
