package daemon

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
)

// The Corefile (Corefile mode, config.DropIn.Corefile) is watched with the
// kube-dns ConfigMap and resolv.conf. A change is rendered, parsed and
// mapped again (config.CorefileConfig.Reload); what it says about routing
// (the kube-dns address and zones, the zone routes, the "." servers when
// the Corefile names them) is applied at once by apply, like a ConfigMap
// change. What the running daemon cannot change in place (listen
// addresses, port, cache sizes and TTLs, health and metrics addresses, ...)
// is logged once as needing a restart. An invalid Corefile keeps the last
// good configuration, logged once and counted as a "configmap" setup error
// (as node-cache counts it).

// corefileState is the reloader's view of the Corefile.
type corefileState struct {
	seen      []byte // last content read of the watched file
	err       string // last error logged
	restart   string // last "needs a restart" logged
	kubeZones []string
	static    map[string]staticRoute // by zone
	servers   map[string][]netip.AddrPort
	tcp       map[string]bool
	// zonePolicies are the blocks' cache policies applied (corefilepolicy.go).
	zonePolicies []config.ZonePolicy
	rewriteErr   string                           // last failure to rewrite -conf logged
	opts         map[string]config.ForwardOptions // by zone: the route's forward options
}

func (d *Daemon) corefile() *config.CorefileConfig { return d.cfg.DropIn.Corefile }

// initCorefile records the Corefile's routes at start.
func (d *Daemon) initCorefile() {
	cc := d.corefile()
	if cc == nil {
		return
	}
	r := &d.reload
	r.cf.seen, _ = os.ReadFile(cc.Source())
	r.cf.kubeZones = d.cfg.DropIn.KubeDNSZones
	r.cf.zonePolicies = cc.ZonePolicies
	r.cf.static, r.cf.servers, r.cf.tcp = map[string]staticRoute{}, map[string][]netip.AddrPort{}, map[string]bool{}
	for _, sr := range r.static {
		r.cf.static[sr.zone] = sr
	}
	r.cf.opts = map[string]config.ForwardOptions{}
	for _, zr := range d.cfg.DropIn.Routes {
		r.cf.servers[zr.Zone], r.cf.tcp[zr.Zone], r.cf.opts[zr.Zone] = zr.Servers, zr.ForceTCP, zr.Opts
	}
}

// readCorefile reports whether the Corefile changed what apply routes.
func (d *Daemon) readCorefile() bool {
	cc := d.corefile()
	r := &d.reload
	data, err := os.ReadFile(cc.Source())
	if err == nil && bytes.Equal(data, r.cf.seen) {
		return false
	}
	var n *config.Config
	if err == nil {
		r.cf.seen = data
		n, err = cc.Reload()
	}
	if err != nil {
		if err.Error() != r.cf.err {
			r.cf.err = err.Error()
			d.Metrics.SetupError("configmap") // node-cache counts Corefile errors under this kind too
			d.Metrics.ReloadFailed()
			d.log.Error("Corefile invalid; keeping the last good configuration", "file", cc.Source(), "err", err)
		}
		return false
	}
	r.cf.err = ""
	changed := false
	if d.viewsChanged(n) { // views.go: which blocks each address sees
		if err := d.reloadViews(n); err != nil {
			// Nothing of this edit is applied: half of it would answer
			// some addresses with the old blocks and some with the new.
			if err.Error() != r.cf.err {
				r.cf.err = err.Error()
				d.Metrics.SetupError("configmap") // as an invalid Corefile
				d.Metrics.ReloadFailed()
				d.log.Error("Corefile change of the views refused; keeping the last good configuration", "file", cc.Source(), "err", err)
			}
			return false
		}
		changed = true
	}
	if diff := restartFields(d.cfg, n); len(diff) > 0 {
		if s := strings.Join(diff, ", "); s != r.cf.restart {
			r.cf.restart = s
			d.log.Warn("Corefile changed settings that apply at the next restart; routes are updated now", "file", cc.Source(), "settings", s)
		}
	}
	d.swapPolicies(n)                               // the blocks' cache settings: applied now, no route change
	if zones, err := d.reloadChain(n); err != nil { // chain.go: template, hosts, rewrite, dns64
		d.log.Error("Corefile directives not rebuilt; keeping the old ones", "file", cc.Source(), "err", err)
	} else if len(zones) > 0 {
		r.changedZones, changed = append(r.changedZones, zones...), true
	}
	if !slices.Equal(n.DropIn.KubeDNSZones, r.cf.kubeZones) {
		r.cf.kubeZones, changed = n.DropIn.KubeDNSZones, true
	}
	if r.kube != nil && n.KubeDNS != d.kubeAddr() {
		if g, err := d.kubeGroup(n.KubeDNS); err != nil {
			d.log.Error("kube-dns group not rebuilt; keeping the old one", "err", err)
		} else {
			r.retireLater = append(r.retireLater, r.kube)
			r.kube, r.kubeAt, changed = g, n.KubeDNS, true
		}
	}
	if n.ResolvConf == "" && !slices.Equal(n.Nameservers, r.resolv) {
		r.resolv, changed = n.Nameservers, true
	}
	want := map[string]config.ZoneRoute{}
	for _, zr := range n.DropIn.Routes {
		want[zr.Zone] = zr
	}
	for zone, zr := range want {
		if old, ok := r.cf.static[zone]; ok && slices.Equal(r.cf.servers[zone], zr.Servers) && r.cf.tcp[zone] == zr.ForceTCP && r.cf.opts[zone] == zr.Opts {
			_ = old
			continue
		}
		g, err := d.routeGroup(zr)
		if err != nil {
			d.log.Error("zone route not rebuilt; keeping the old one", "zone", zone, "err", err)
			continue
		}
		if old, ok := r.cf.static[zone]; ok {
			r.retireLater = append(r.retireLater, old.g)
		}
		r.cf.static[zone], r.cf.servers[zone], r.cf.tcp[zone], r.cf.opts[zone] = staticRoute{zone: zone, g: g}, zr.Servers, zr.ForceTCP, zr.Opts
		r.changedZones = append(r.changedZones, zone)
		changed = true
	}
	for zone, old := range r.cf.static {
		if _, ok := want[zone]; !ok {
			r.retireLater = append(r.retireLater, old.g)
			delete(r.cf.static, zone)
			delete(r.cf.servers, zone)
			delete(r.cf.tcp, zone)
			delete(r.cf.opts, zone)
			r.changedZones = append(r.changedZones, zone)
			changed = true
		}
	}
	if changed {
		r.static = r.static[:0]
		for _, z := range sortedKeys(r.cf.static) {
			r.static = append(r.static, r.cf.static[z])
		}
		d.log.Info("Corefile changed; routes updated", "file", cc.Source(), "kube_dns_zones", fmt.Sprint(r.cf.kubeZones), "zone_routes", len(r.static))
	}
	return changed
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// restartFields names the settings that differ between the running
// configuration and a reloaded one and that only a restart applies.
func restartFields(a, b *config.Config) []string {
	var out []string
	cmp := func(name string, x, y any) {
		if !reflect.DeepEqual(x, y) {
			out = append(out, name)
		}
	}
	cmp("listen addresses (bind)", a.LocalIPs, b.LocalIPs)
	cmp("port", a.Port, b.Port)
	// The blocks' cache policies apply live (swapPolicies); the sizes and
	// the recheck interval do not.
	cmp("cache sizes", [4]int64{int64(a.Cache.SuccessCapacity), int64(a.Cache.DenialCapacity), a.Cache.MaxBytes, int64(a.Cache.StaleRecheck)},
		[4]int64{int64(b.Cache.SuccessCapacity), int64(b.Cache.DenialCapacity), b.Cache.MaxBytes, int64(b.Cache.StaleRecheck)})
	cmp("forward options of the kube-dns and . blocks", [2]any{a.DropIn.KubeForward, a.DropIn.NodeForward}, [2]any{b.DropIn.KubeForward, b.DropIn.NodeForward})
	if a.DropIn.Corefile != nil && b.DropIn.Corefile != nil {
		cmp("the . block's literal targets (upstreamNameservers apply or not)", a.DropIn.Corefile.RootLiteral, b.DropIn.Corefile.RootLiteral)
	}
	cmp("health address", a.HealthAddr, b.HealthAddr)
	cmp("metrics address (prometheus)", a.MetricsAddr, b.MetricsAddr)
	cmp("log", a.QueryLog, b.QueryLog)
	cmp("pprof", a.PProf, b.PProf)
	cmp("bufsize", a.MaxUDPSize, b.MaxUDPSize)
	cmp("lameduck", a.LameDuck, b.LameDuck)
	cmp("resolv.conf path", a.ResolvConf, b.ResolvConf)
	return out
}

func (d *Daemon) routeGroup(zr config.ZoneRoute) (*forward.Group, error) {
	cfg := forward.GroupConfig{Name: "corefile:" + zr.Zone, Servers: zr.Servers, Proto: forward.UDP, Logger: d.log.With("group", "corefile:"+zr.Zone)}
	if zr.ForceTCP {
		cfg.Proto, cfg.PoolSize = forward.TCP, d.cfg.TCPPoolSize
	}
	withOptions(&cfg, &zr.Opts)
	return forward.NewGroup(cfg, d.Metrics)
}

func (d *Daemon) kubeGroup(addr netip.AddrPort) (*forward.Group, error) {
	cfg := forward.GroupConfig{
		Name:        "kube-dns",
		Servers:     []netip.AddrPort{addr},
		Proto:       forward.TCP,
		PoolSize:    d.cfg.TCPPoolSize,
		MaxInflight: d.cfg.MaxInflight,
		Logger:      d.log.With("group", "kube-dns"),
	}
	withOptions(&cfg, d.cfg.DropIn.KubeForward)
	return forward.NewGroup(cfg, d.Metrics)
}

// kubeAddr is the kube-dns address routed to now.
func (d *Daemon) kubeAddr() netip.AddrPort {
	if d.reload.kubeAt.IsValid() {
		return d.reload.kubeAt
	}
	return d.cfg.KubeDNS
}
