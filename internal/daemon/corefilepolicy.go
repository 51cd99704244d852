package daemon

import (
	"reflect"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// corefileZones turns the Corefile blocks' cache policies into the
// resolver's zones (the longest zone wins, as CoreDNS picks the block).
func corefileZones(cfg *config.Config, zps []config.ZonePolicy) []resolve.Zone {
	out := make([]resolve.Zone, 0, len(zps))
	for _, zp := range zps {
		out = append(out, resolve.Zone{Name: zp.Zone, Policy: resolve.Policy{
			TTL:                zp.TTL,
			ServFailTTL:        zp.ServFailTTL,
			StaleWindow:        zp.StaleWindow,
			StaleClientTimeout: zp.StaleClientTimeout,
			StaleRecheck:       cfg.Cache.StaleRecheck,
		}})
	}
	return out
}

// lookupPolicy is the resolver's PolicyFunc: the current one (misses only).
func (d *Daemon) lookupPolicy(name []byte) *resolve.Policy {
	return (*d.policy.Load())(name)
}

// swapPolicies applies a reloaded Corefile's cache policies, and reports
// whether they changed.
func (d *Daemon) swapPolicies(n *config.Config) bool {
	cur, next := d.corefile(), n.DropIn.Corefile
	if cur == nil || next == nil || reflect.DeepEqual(d.reload.cf.zonePolicies, next.ZonePolicies) {
		return false
	}
	f, err := resolve.Zones(d.policyDefault, corefileZones(n, next.ZonePolicies)...)
	if err != nil {
		d.log.Error("Corefile's cache policies not applied; keeping the old ones", "err", err)
		return false
	}
	d.policy.Store(&f)
	d.reload.cf.zonePolicies = next.ZonePolicies
	d.log.Info("Corefile changed; cache policies of the blocks updated", "zones", len(next.ZonePolicies))
	return true
}
