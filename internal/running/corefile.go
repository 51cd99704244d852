package running

import (
	"bytes"
	"fmt"
	"net/netip"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
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

// freeAfterCorefile is the Corefile size past which a reload returns the
// parse's garbage to the OS at once (a real Corefile is a few KiB).
const freeAfterCorefile = 256 << 10

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
	skipped      map[string]bool                  // the skipped entries logged (skipped.go)
}

func (d *State) corefile() *config.CorefileConfig { return d.cfg.DropIn.Corefile }

// initCorefile records the Corefile's routes at start.
func (d *State) initCorefile() {
	cc := d.corefile()
	if cc == nil {
		return
	}
	r := &d.reload
	r.cf.seen, _ = corefile.ReadFile(cc.Source())
	d.reportSkipped(cc)
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
//
// An edit applies entirely or not at all: prepareCorefile builds every new
// part (views, cache policies, directive chains, groups) while the old
// ones serve, and only when all are built does commitCorefile swap them
// in. A failure anywhere closes what was built, keeps the running
// configuration whole, is logged and counted (coredns_reload_failed_total
// and a "configmap" setup error, once per distinct error), and the next
// change of the file is tried afresh.
func (d *State) readCorefile() bool {
	cc := d.corefile()
	r := &d.reload
	data, err := corefile.ReadFile(cc.Source()) // bounded: a huge file is refused, not read whole
	if err == nil && bytes.Equal(data, r.cf.seen) {
		return false
	}
	if len(data) > freeAfterCorefile {
		// Parsing a large Corefile leaves its tokens and blocks behind as
		// garbage (up to ~100 bytes of heap per byte of a hostile file):
		// given back to the OS now, not kept resident until the runtime
		// gets to it.
		defer debug.FreeOSMemory()
	}
	var n *config.Config
	if err == nil {
		r.cf.seen = data // applied or failed, this content is done with
		n, err = cc.Reload()
	}
	if err != nil {
		d.corefileFailed(cc, "Corefile invalid; keeping the last good configuration", err)
		return false
	}
	e, err := d.prepareCorefile(n)
	if err == nil {
		err = d.commitCorefile(n, e)
	}
	if err != nil {
		// Nothing of this edit is applied: half of it would answer with
		// new policies and old directives, or some addresses with the
		// old blocks and some with the new.
		d.corefileFailed(cc, "Corefile change not applied; keeping the last good configuration", err)
		return false
	}
	r.cf.err = ""
	d.reportSkipped(n.DropIn.Corefile)
	return true // apply publishes the edit, with the routes, in one store
}

// corefileFailed logs and counts a rejected Corefile edit, once per
// distinct error.
func (d *State) corefileFailed(cc *config.CorefileConfig, msg string, err error) {
	r := &d.reload
	if err.Error() == r.cf.err {
		return
	}
	r.cf.err = err.Error()
	d.Metrics.SetupError("configmap") // node-cache counts Corefile errors under this kind too
	d.Metrics.ReloadFailed()
	d.log.Error(msg, "file", cc.Source(), "err", err)
}

// corefileEdit is a Corefile edit built but not yet in use.
type corefileEdit struct {
	views  *viewSet      // nil: the views did not change
	policy *sharedPolicy // the shared view's policies and answer-side handlers
	// policyChanged: the cache policies differ from the running ones.
	policyChanged bool
	// answers are the blocks' answer-side chains; round the shared
	// resources they asked for.
	answers    map[*corefile.Server]*answer.Chain
	round      *round
	chain      *blocks.Chains // nil: no chain to replace
	chainZones []string       // zones whose directives changed
	kube       *forward.Group // nil: kube-dns' address did not change
	routes     map[string]config.ZoneRoute
	groups     map[string]*forward.Group // new groups of the zone routes that changed
	changed    bool                      // set by commitCorefile: a route changed
}

// abandon closes the groups e built, and the shared resources only its
// handlers asked for.
func (d *State) abandon(e *corefileEdit) {
	if e.views != nil {
		for _, g := range e.views.groups {
			_ = g.Close()
		}
	}
	if e.kube != nil {
		_ = e.kube.Close()
	}
	for _, g := range e.groups {
		_ = g.Close()
	}
	for _, g := range e.chain.Groups() {
		_ = g.Close()
	}
	if e.round != nil {
		d.res.keepOnly(d.round)
	}
}

// prepareCorefile builds what the reloaded configuration n needs and the
// running one lacks. It changes nothing that serves; on error it closes
// what it built.
func (d *State) prepareCorefile(n *config.Config) (e *corefileEdit, err error) {
	r := &d.reload
	e = &corefileEdit{routes: map[string]config.ZoneRoute{}, groups: map[string]*forward.Group{}}
	defer func() {
		if err != nil {
			d.abandon(e)
			e = nil
		}
	}()
	if cc := n.DropIn.Corefile; cc != nil {
		e.round = &round{}
		if e.answers, err = d.answerChains(cc.Servers, e.round); err != nil {
			return e, err
		}
	}
	if d.viewsChanged(n) { // views.go: which blocks each address sees
		if e.views, err = d.prepareViews(n, e.answers); err != nil {
			return e, fmt.Errorf("views: %w", err)
		}
	}
	if e.policy, e.policyChanged, err = d.preparePolicies(n, e.answers); err != nil { // the blocks' cache settings
		return e, err
	}
	if e.chain, e.chainZones, err = d.prepareChain(n); err != nil { // chain.go: template, hosts, rewrite, dns64
		return e, err
	}
	if e.policy != nil || e.chain != nil {
		sp, c := d.sharedPol, d.chain.Load()
		if e.policy != nil {
			sp = *e.policy
		}
		if e.chain != nil {
			c = e.chain
		}
		if _, err = d.compileView(-1, sp, c, nil, nil, d.routes); err != nil { // refused here, before anything is in use
			return e, fmt.Errorf("blocks: %w", err)
		}
	}
	if h := d.reloadFault.Load(); h != nil {
		if err = (*h)(); err != nil {
			return e, err
		}
	}
	if r.kube != nil && n.KubeDNS != d.kubeAddr() {
		if e.kube, err = d.kubeGroup(n.KubeDNS, n.DropIn.KubeDNSAlso); err != nil {
			return e, fmt.Errorf("kube-dns group: %w", err)
		}
	}
	for _, zr := range n.DropIn.Routes {
		e.routes[zr.Zone] = zr
	}
	for _, zone := range sortedKeys(e.routes) {
		zr := e.routes[zone]
		if _, ok := r.cf.static[zone]; ok && slices.Equal(r.cf.servers[zone], zr.Servers) && r.cf.tcp[zone] == zr.ForceTCP && r.cf.opts[zone] == zr.Opts {
			continue
		}
		g, err := d.routeGroup(zr)
		if err != nil {
			return e, fmt.Errorf("%s: forward for %s: %w", zr.From, zone, err)
		}
		e.groups[zone] = g
	}
	return e, nil
}

// commitCorefile puts a prepared edit's sources in place; apply (which
// readCorefile's caller runs next) compiles them with the routes and
// publishes the result in one store. It cannot fail.
func (d *State) commitCorefile(n *config.Config, e *corefileEdit) error {
	cc := d.corefile()
	r := &d.reload
	if e.views != nil {
		old := d.views
		d.views, r.viewsPending = e.views, true // the server takes them once they are published (apply)
		if old != nil {
			r.retireLater = append(r.retireLater, old.groups...)
		}
		r.changedZones = append(r.changedZones, ".")
		e.changed = true
		d.log.Info("Corefile changed the views; applied", "views", describeViews(e.views.cc))
	}
	if diff := restartFields(d.cfg, n); len(diff) > 0 {
		if s := strings.Join(diff, ", "); s != r.cf.restart {
			r.cf.restart = s
			d.log.Warn("Corefile changed settings that apply at the next restart; routes are updated now", "file", cc.Source(), "settings", s)
		}
	}
	if e.policy != nil {
		d.sharedPol = *e.policy
		if e.policyChanged {
			r.cf.zonePolicies = n.DropIn.Corefile.ZonePolicies
			d.log.Info("Corefile changed; the blocks' cache policies updated", "zones", len(r.cf.zonePolicies))
		}
	}
	if e.round != nil {
		// The new Corefile's handlers serve from the next publish: the
		// resources only the old ones asked for close now (a query still
		// holding one finds it closed: a tap drops what it is sent).
		d.answers, d.round = e.answers, e.round
		d.res.keepOnly(d.round)
	}
	if e.views != nil || e.policyChanged {
		cb := coreDNSCacheBlocks(n) // the tags of the new policies and views name n's blocks
		d.cacheBlocks.Store(&cb)
	}
	if e.chain != nil {
		if old := d.chain.Load().Groups(); len(old) > 0 {
			// The old blocks' further forwards: closed once the queries
			// sent to them are done (apply retires them).
			r.retireLater, e.changed = append(r.retireLater, old...), true
		}
		d.chain.Store(e.chain)
		if d.Server != nil {
			d.Server.SetRecordAskers(blocks.UsesRemote(n.DropIn.Corefile.Servers))
		}
		if len(e.chainZones) > 0 {
			r.changedZones, e.changed = append(r.changedZones, e.chainZones...), true
		}
	}
	if !slices.Equal(n.DropIn.KubeDNSZones, r.cf.kubeZones) {
		r.cf.kubeZones, e.changed = n.DropIn.KubeDNSZones, true
	}
	if e.kube != nil {
		r.retireLater = append(r.retireLater, r.kube)
		r.kube, r.kubeAt, e.changed = e.kube, n.KubeDNS, true
		if d.kubeHook != nil {
			d.kubeHook(e.kube, n.KubeDNS) // kube-dns' pods, when it is the Service followed
		}
	}
	if n.ResolvConf == "" && !slices.Equal(n.Nameservers, r.resolv) {
		r.resolv, e.changed = n.Nameservers, true
	}
	for zone, g := range e.groups {
		zr := e.routes[zone]
		if old, ok := r.cf.static[zone]; ok {
			r.retireLater = append(r.retireLater, old.g)
		}
		r.cf.static[zone], r.cf.servers[zone], r.cf.tcp[zone], r.cf.opts[zone] = staticRoute{zone: zone, g: g}, zr.Servers, zr.ForceTCP, zr.Opts
		r.changedZones = append(r.changedZones, zone)
		e.changed = true
	}
	for zone, old := range r.cf.static {
		if _, ok := e.routes[zone]; !ok {
			r.retireLater = append(r.retireLater, old.g)
			delete(r.cf.static, zone)
			delete(r.cf.servers, zone)
			delete(r.cf.tcp, zone)
			delete(r.cf.opts, zone)
			r.changedZones = append(r.changedZones, zone)
			e.changed = true
		}
	}
	if e.changed {
		r.static = r.static[:0]
		for _, z := range sortedKeys(r.cf.static) {
			r.static = append(r.static, r.cf.static[z])
		}
		d.log.Info("Corefile changed; routes updated", "file", cc.Source(), "kube_dns_zones", fmt.Sprint(r.cf.kubeZones), "zone_routes", len(r.static))
	}
	return nil
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
	cmp("listen sockets (blocks on other ports)", a.Sockets(), b.Sockets())
	// The blocks' cache policies apply live (preparePolicies); the sizes and
	// the recheck interval do not.
	cmp("cache sizes", [4]int64{int64(a.Cache.SuccessCapacity), int64(a.Cache.DenialCapacity), a.Cache.MaxBytes, int64(a.Cache.StaleRecheck)},
		[4]int64{int64(b.Cache.SuccessCapacity), int64(b.Cache.DenialCapacity), b.Cache.MaxBytes, int64(b.Cache.StaleRecheck)})
	cmp("the cluster domain's other kube-dns servers", a.DropIn.KubeDNSAlso, b.DropIn.KubeDNSAlso)
	cmp("forward options of the kube-dns and . blocks", [2]any{a.DropIn.KubeForward, a.DropIn.NodeForward}, [2]any{b.DropIn.KubeForward, b.DropIn.NodeForward})
	if a.DropIn.Corefile != nil && b.DropIn.Corefile != nil {
		cmp("the . block's literal targets (upstreamNameservers apply or not)", a.DropIn.Corefile.RootLiteral, b.DropIn.Corefile.RootLiteral)
	}
	cmp("health address", a.HealthAddr, b.HealthAddr)
	cmp("metrics address (prometheus)", a.MetricsAddr, b.MetricsAddr)
	cmp("-querylog", a.QueryLog, b.QueryLog) // the Corefile's log applies live (the block table)
	cmp("pprof", a.PProf, b.PProf)
	cmp("bufsize", a.MaxUDPSize, b.MaxUDPSize)
	cmp("lameduck", a.LameDuck, b.LameDuck)
	cmp("timeouts", [3]time.Duration{a.TCPIdleTimeout, a.DropIn.TCPReadTimeout, a.DropIn.TCPWriteTimeout}, [3]time.Duration{b.TCPIdleTimeout, b.DropIn.TCPReadTimeout, b.DropIn.TCPWriteTimeout})
	cmp("timeouts maxtcpqueries", a.DropIn.TCPMaxQueries, b.DropIn.TCPMaxQueries)
	cmp("resolv.conf path", a.ResolvConf, b.ResolvConf)
	return out
}

func (d *State) routeGroup(zr config.ZoneRoute) (*forward.Group, error) {
	cfg := forward.GroupConfig{Name: "corefile:" + zr.Zone, Servers: zr.Servers, Proto: forward.UDP, Logger: d.log.With("group", "corefile:"+zr.Zone)}
	if zr.ForceTCP {
		cfg.Proto, cfg.PoolSize = forward.TCP, d.cfg.TCPPoolSize
	}
	if err := withOptions(&cfg, &zr.Opts); err != nil {
		return nil, err
	}
	return forward.NewGroup(cfg, d.Metrics)
}

// kubeGroup is the kube-dns group: addr, then also (the cluster domain
// forward's other servers).
func (d *State) kubeGroup(addr netip.AddrPort, also []netip.AddrPort) (*forward.Group, error) {
	cfg := forward.GroupConfig{
		Name:        "kube-dns",
		Servers:     append([]netip.AddrPort{addr}, also...),
		Proto:       forward.TCP,
		PoolSize:    d.cfg.TCPPoolSize,
		MaxInflight: d.cfg.MaxInflight,
		Logger:      d.log.With("group", "kube-dns"),
	}
	if err := withOptions(&cfg, d.cfg.DropIn.KubeForward); err != nil {
		return nil, err
	}
	return forward.NewGroup(cfg, d.Metrics)
}

// kubeAddr is the kube-dns address routed to now.
func (d *State) kubeAddr() netip.AddrPort {
	if d.reload.kubeAt.IsValid() {
		return d.reload.kubeAt
	}
	return d.cfg.KubeDNS
}
