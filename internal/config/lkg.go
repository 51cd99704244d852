package config

import (
	"github.com/nodelocaldns/nodelocaldns/internal/cache"

	"github.com/nodelocaldns/nodelocaldns/internal/zone"
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
		case zone.Holds(c.ClusterDomain, z):
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

// lastKnownGoodCovers returns the -last-known-good zone that holds z
// (the longest), "" when none.
func (c *Config) lastKnownGoodCovers(z string) string {
	return zone.Longest(c.Cache.LastKnownGood, z)
}
