package running

import (
	"fmt"
	"reflect"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// corefileZones are the Corefile blocks' cache policies as the resolver's
// zones (the longest zone wins, as CoreDNS picks the block): config made
// them resolve.Policy already.
func corefileZones(zps []config.ZonePolicy) []resolve.Zone {
	out := make([]resolve.Zone, 0, len(zps))
	for _, zp := range zps {
		out = append(out, resolve.Zone{Name: zp.Zone, Policy: zp.Policy})
	}
	return out
}

// zonePolicyZones are the zones of zps.
func zonePolicyZones(zps []config.ZonePolicy) []string {
	out := make([]string, len(zps))
	for i, zp := range zps {
		out[i] = zp.Zone
	}
	return out
}

// preparePolicies builds the shared view's policy lookup and its blocks'
// answer-side handlers of a reloaded Corefile (the handlers' shared
// resources asked for in rd); nil when not in Corefile mode. changed says
// whether the cache policies differ from the running ones.
func (d *State) preparePolicies(n *config.Config, chains map[*corefile.Server]*answer.Chain) (sp *sharedPolicy, changed bool, err error) {
	cur, next := d.corefile(), n.DropIn.Corefile
	if cur == nil || next == nil {
		return nil, false, nil
	}
	p := d.sharedPol
	p.answers = blockAnswers(next.Servers, chains, firstBlock(next.Servers))
	if reflect.DeepEqual(d.reload.cf.zonePolicies, next.ZonePolicies) {
		return &p, false, nil
	}
	f, err := resolve.Zones(d.policyDefault, corefileZones(next.ZonePolicies)...)
	if err != nil {
		return nil, false, fmt.Errorf("cache policies: %w", err)
	}
	p.pol, p.zones = f.Policies(), zonePolicyZones(next.ZonePolicies)
	return &p, true, nil
}

// stubConflict refuses a kube-dns ConfigMap whose stub domain duplicates a
// Corefile block: node-cache would append a second block for the zone and
// CoreDNS's reload would fail on it, keeping the last good configuration;
// so do we (the caller logs it once and counts it).
func (d *State) stubConflict(k config.KubeDNSConfigMap) error {
	cc := d.corefile()
	if cc == nil {
		return nil
	}
	for _, z := range k.Zones() {
		if at := cc.StubConflict(z); at != "" {
			return fmt.Errorf("stubDomains %s duplicates the Corefile block at %s (CoreDNS refuses the same zone twice: stock's reload fails the same way)", z, at)
		}
	}
	return nil
}

// rewriteCorefile writes -conf again after a ConfigMap change, as
// node-cache does, when it is rendered from a template and writable.
func (d *State) rewriteCorefile() {
	cc := d.corefile()
	if cc == nil {
		return
	}
	if _, err := cc.Rewrite(d.cfg); err != nil && err.Error() != d.reload.cf.rewriteErr {
		d.reload.cf.rewriteErr = err.Error()
		d.log.Warn("the rendered Corefile was not rewritten; running from memory (node-cache logs the same and goes on)", "file", cc.Path, "err", err)
	}
}

// withOptions applies a Corefile forward's options to a group's config
// (nil: not in Corefile mode, or no such block).
func withOptions(cfg *forward.GroupConfig, o *config.ForwardOptions) error {
	if o == nil {
		return nil
	}
	if o.TLS {
		t, err := o.TLSConfig()
		if err != nil {
			return err
		}
		cfg.TLS, cfg.Proto = t, forward.TCP
		cfg.Plain, cfg.PlainTCP = o.PlainServers(), o.TCP // plain targets beside tls:// ones
		if cfg.PoolSize == 0 {
			cfg.PoolSize = forward.DefaultPoolSize
		}
	}
	cfg.MaxFails, cfg.ProbeInterval, cfg.Spread, cfg.FailFast = o.MaxFails, o.ProbeInterval, o.Spread, o.FailFast
	cfg.ProbeName, cfg.RefuseOverload, cfg.ServerNames = o.ProbeName, o.Refuse, o.ServerNames()
	cfg.FailoverRcodes, cfg.MaxTries = o.Failover, o.MaxTries
	if o.MaxInflight > 0 {
		cfg.MaxInflight = o.MaxInflight
	}
	if o.IdleTimeout > 0 {
		cfg.IdleTimeout = o.IdleTimeout
	}
	return nil
}
