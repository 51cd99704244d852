package running

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The routes come from three sources: the flags (kube-dns for the cluster
// domain and the reverse zones, fixed for the daemon's life), the node's
// resolv.conf (the "." group, "node") and the kube-dns ConfigMap
// (upstreamNameservers replace resolv.conf's list; each stub domain gets a
// "stub:<zone>" group). The last two are watched (config.Watcher) and
// re-read on every wake-up; a change builds the groups that differ,
// compiles them into every view's block table (blocks.go), swaps the
// tables and retires the groups routed away from.
//
// Nothing is dropped on a change:
//   - a query that looked up an old group before the swap keeps it: the
//     group is closed only after RetireGrace, when every query sent to it
//     has timed out or been answered, and exchange asks the new group again
//     when the route changed under a query;
//   - cache entries of zones whose upstreams did not change stay; entries
//     of a stub zone that was added, removed or pointed elsewhere are
//     dropped at the swap, again after settleDrop (an answer from the old
//     group that was on its way into the cache) and once more when the old
//     groups are closed. A change of the "." servers drops nothing: those
//     entries are everything else and expire within the TTL caps.
//
// An invalid ConfigMap (at start or later) is logged once, counted as a
// "configmap" setup error and ignored: the last good one stays (at start:
// none). Refusing to start would turn a typo in a ConfigMap into a crash
// loop on every node, the stock node-cache's failure; the node's DNS keeps
// working without stub domains. An empty or invalid resolv.conf keeps the
// last good list likewise (it is checked strictly once, by config.Parse).

// settleDrop is the second drop of a changed zone's entries: an answer the
// old group gave just before the swap may reach the cache just after the
// first drop; half a second is ample for that and short against the 2 s a
// change may take.
const settleDrop = 500 * time.Millisecond

// RetireGrace is how long a replaced group stays open: longer than
// -forward-timeout, which bounds every query sent to it.
func (d *State) RetireGrace() time.Duration { return d.cfg.ForwardTimeout + time.Second }

// reloader holds the routing state. It is owned by New until Start and by
// the watch goroutine after (one writer, no lock); retirements only close
// their own groups and drop cache entries.
type reloader struct {
	kube        *forward.Group // nil in local mode
	node        *forward.Group
	nodeServers []netip.AddrPort
	host        *forward.Group // -node-listen's: node, or a group of its own (node.go)
	hostServers []netip.AddrPort
	unusedNoted string               // the upstreamNameservers last logged as unused (node.go)
	stubs       map[string]stubGroup // by zone
	static      []staticRoute        // the Corefile's zone routes (corefile.go)
	cf          corefileState        // the Corefile as last applied (corefile.go)
	kubeAt      netip.AddrPort       // kube-dns address after a Corefile change; zero: cfg.KubeDNS
	// Groups and zones a Corefile change replaced: apply retires them.
	retireLater  []*forward.Group
	changedZones []string
	// viewsPending: a Corefile change built new views (State.views);
	// publish hands their resolvers to the server.
	viewsPending bool

	resolv    []netip.AddrPort // last good resolv.conf list
	resolvErr string           // last resolv.conf error logged
	cm        config.KubeDNSConfigMap
	cmSeen    config.ConfigMapData // last ConfigMap content read, valid or not
	cmSeenOK  bool
	cmErr     string // last ConfigMap error logged and counted

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup // the watch goroutine and retirements
}

type staticRoute struct {
	zone string
	g    *forward.Group
}

type stubGroup struct {
	g       *forward.Group
	servers []netip.AddrPort
}

// buildRoutes makes the groups and the route table from the flags, resolv.conf
// (as config.Parse read it) and the ConfigMap. Only a group that cannot be
// built fails it; a bad ConfigMap does not.
func (d *State) buildRoutes() error {
	r := &d.reload
	r.stop = make(chan struct{})
	r.resolv = d.cfg.Nameservers
	if !d.cfg.LocalMode {
		// A group can carry every flight the resolver admits: one bound,
		// -max-inflight, not 1024 here and 1000 there (kubeGroup).
		kube, err := d.kubeGroup(d.cfg.KubeDNS, d.cfg.DropIn.KubeDNSAlso)
		if err != nil {
			return fmt.Errorf("kube-dns: %w", err)
		}
		r.kube = kube
		d.groups = []*forward.Group{kube}
	}
	for _, zr := range d.cfg.DropIn.Routes { // drop-in: the Corefile's forward blocks
		g, err := d.routeGroup(zr)
		if err != nil {
			d.Close()
			return fmt.Errorf("%s: forward for %s: %w", zr.From, zr.Zone, err)
		}
		r.static = append(r.static, staticRoute{zone: zr.Zone, g: g})
		d.groups = append(d.groups, g)
	}
	d.initCorefile()
	if d.cfg.KubeDNSConfigMap != "" {
		d.readConfigMap(true)
	}
	if err := d.apply(); err != nil {
		d.Close()
		return err
	}
	return nil
}

// startReload starts watching resolv.conf and the ConfigMap directory.
func (d *State) startReload() {
	var paths []string
	if d.cfg.ResolvConf != "" {
		paths = append(paths, d.cfg.ResolvConf, config.SystemdResolvConf)
	}
	if d.cfg.KubeDNSConfigMap != "" {
		paths = append(paths, d.cfg.KubeDNSConfigMap)
	}
	if cc := d.corefile(); cc != nil {
		paths = append(paths, cc.Source())
	}
	if len(paths) == 0 {
		return
	}
	r := &d.reload
	w := config.NewWatcher(config.WatchConfig{Paths: paths, Logger: d.log.With("component", "watch")})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer w.Close()
		for {
			select {
			case <-r.stop:
				return
			case <-w.C:
				d.reread()
			}
		}
	}()
}

// stopReload stops watching and closes retired groups now. The live groups
// are in d.groups for closeGroups.
func (d *State) stopReload() {
	r := &d.reload
	if r.stop == nil {
		return
	}
	r.stopOnce.Do(func() { close(r.stop) })
	r.wg.Wait()
}

// reread re-reads both sources and applies a change.
func (d *State) reread() {
	changed := false
	if d.cfg.ResolvConf != "" && d.readResolvConf() {
		changed = true
	}
	if d.cfg.KubeDNSConfigMap != "" && d.readConfigMap(false) {
		changed = true
	}
	if d.corefile() != nil && d.readCorefile() {
		changed = true
	}
	if changed {
		if err := d.apply(); err != nil {
			d.log.Error("routes not updated; keeping the old ones", "err", err)
		}
	}
}

// readResolvConf reports whether resolv.conf now lists other good servers.
func (d *State) readResolvConf() bool {
	r := &d.reload
	ns, err := config.LoadResolvConf(d.cfg.ResolvConf, d.cfg.OwnAddrs(), d.cfg.Port)
	if err != nil {
		if err.Error() != r.resolvErr {
			r.resolvErr = err.Error()
			d.Metrics.ResolvConfError()
			d.log.Error("resolv.conf unusable; keeping the last good nameservers", "file", d.cfg.ResolvConf, "nameservers", fmt.Sprint(r.resolv), "err", err)
		}
		return false
	}
	r.resolvErr = ""
	if slices.Equal(ns, r.resolv) {
		return false
	}
	d.log.Info("resolv.conf changed", "file", d.cfg.ResolvConf, "nameservers", fmt.Sprint(ns))
	r.resolv = ns
	return true
}

// readConfigMap reports whether the ConfigMap now says something else and
// is valid. Each distinct invalid content (or read error) is logged and
// counted once.
func (d *State) readConfigMap(startup bool) bool {
	r := &d.reload
	data, err := config.ReadConfigMapDir(d.cfg.KubeDNSConfigMap)
	if err == nil {
		if r.cmSeenOK && data.Equal(r.cmSeen) {
			return false
		}
		r.cmSeen, r.cmSeenOK = data, true
		var k config.KubeDNSConfigMap
		if k, err = d.cfg.ParseKubeDNSConfigMap(data); err == nil {
			err = d.stubConflict(k) // Corefile mode: as stock's failed reload
		}
		if err == nil {
			r.cmErr = ""
			d.rewriteCorefile()
			if equalConfigMap(k, r.cm) {
				return false
			}
			r.cm = k
			return true
		}
	} else {
		r.cmSeenOK = false
		if err.Error() == r.cmErr {
			return false
		}
	}
	r.cmErr = err.Error()
	d.Metrics.SetupError("configmap")
	if startup {
		d.log.Error("kube-dns ConfigMap invalid; starting without it", "dir", d.cfg.KubeDNSConfigMap, "err", err)
	} else {
		d.log.Error("kube-dns ConfigMap invalid; keeping the last good one", "dir", d.cfg.KubeDNSConfigMap, "config", r.cm.String(), "err", err)
	}
	return false
}

func equalConfigMap(a, b config.KubeDNSConfigMap) bool {
	if !slices.Equal(a.UpstreamNameservers, b.UpstreamNameservers) || len(a.StubDomains) != len(b.StubDomains) {
		return false
	}
	for z, s := range a.StubDomains {
		if t, ok := b.StubDomains[z]; !ok || !slices.Equal(s, t) {
			return false
		}
	}
	return true
}

// apply builds the groups that differ from the live ones, swaps the route
// table, and retires what it replaced.
func (d *State) apply() error {
	r := &d.reload
	servers, source := r.resolv, "resolv.conf"
	if len(r.cm.UpstreamNameservers) > 0 && (d.corefile() == nil || !d.corefile().RootLiteral) {
		servers, source = r.cm.UpstreamNameservers, "upstreamNameservers"
	}
	retired := r.retireLater
	changedZones := r.changedZones
	r.retireLater, r.changedZones = nil, nil
	var created []*forward.Group
	fail := func(err error) error {
		for _, g := range created {
			_ = g.Close()
		}
		return err
	}
	node := r.node
	if node == nil || !slices.Equal(r.nodeServers, servers) {
		g, err := d.udpGroup("node", servers)
		if err != nil {
			return fail(fmt.Errorf("node resolvers: %w", err))
		}
		created = append(created, g)
		if node != nil {
			retired = append(retired, node)
		}
		node = g
	}
	host, hostMade, hostOld, err := d.hostGroup(node, servers, r.resolv) // node.go: -node-listen's
	if err != nil {
		return fail(err)
	}
	created, retired = appendGroup(created, hostMade), appendGroup(retired, hostOld)
	stubs := make(map[string]stubGroup, len(r.cm.StubDomains))
	for _, zone := range r.cm.Zones() {
		want := r.cm.StubDomains[zone]
		if old, ok := r.stubs[zone]; ok && slices.Equal(old.servers, want) {
			stubs[zone] = old
			continue
		}
		g, err := d.udpGroup("stub:"+zone, want)
		if err != nil {
			return fail(fmt.Errorf("stub domain %s: %w", zone, err))
		}
		created = append(created, g)
		stubs[zone] = stubGroup{g: g, servers: want}
		changedZones = append(changedZones, zone)
	}
	for zone, old := range r.stubs {
		if cur, ok := stubs[zone]; !ok || cur.g != old.g {
			retired = append(retired, old.g)
			if !ok {
				changedZones = append(changedZones, zone)
			}
		}
	}

	if d.cfg.Node.ExternalToKubeDNS && r.kube != nil { // -external-upstream=kube-dns
		d.noteUnusedUpstreams(source, servers)
	}
	routes, live := d.routeTable(node, host, stubs)
	if err := d.recompile(routes, host); err != nil {
		return fail(fmt.Errorf("block tables: %w", err))
	}
	r.node, r.nodeServers, r.stubs, r.host, r.hostServers = node, servers, stubs, host, r.resolv
	d.nodeResolvers.Store(&r.hostServers)
	d.groups = live

	dropped := d.dropZones(changedZones)
	if len(retired) > 0 || len(changedZones) > 0 {
		d.retire(retired, changedZones)
	}
	if len(created) > 0 || len(retired) > 0 {
		d.log.Info("routes updated", "nameservers", fmt.Sprint(servers), "from", source,
			"stub_domains", fmt.Sprint(stubList(stubs)), "changed_zones", fmt.Sprint(changedZones), "cache_entries_dropped", dropped)
	}
	return nil
}

// routeTable is the shared route table over the groups apply chose: "."
// (the node's resolvers, or kube-dns with -external-upstream=kube-dns),
// kube-dns' zones, the Corefile's zone routes and the stub domains; and
// the groups live with it.
func (d *State) routeTable(node, host *forward.Group, stubs map[string]stubGroup) (routes []forward.Route, live []*forward.Group) {
	r := &d.reload
	routes = []forward.Route{{Zone: ".", Group: node}}
	if d.cfg.Node.ExternalToKubeDNS && r.kube != nil {
		routes[0].Group = r.kube
	}
	live = []*forward.Group{node}
	if host != nil && host != node {
		live = append(live, host)
	}
	if r.kube != nil {
		live = append(live, r.kube)
		zones := append([]string{d.cfg.ClusterDomain}, reverseZones...)
		if d.corefile() != nil { // drop-in: the Corefile's blocks that forward to kube-dns
			zones = r.cf.kubeZones
		}
		for _, z := range zones {
			routes = append(routes, forward.Route{Zone: z, Group: r.kube})
		}
	}
	for _, sr := range r.static { // drop-in: the Corefile's other forward blocks
		routes = append(routes, forward.Route{Zone: sr.zone, Group: sr.g})
		live = append(live, sr.g)
	}
	for _, zone := range r.cm.Zones() {
		routes = append(routes, forward.Route{Zone: zone, Group: stubs[zone].g})
		live = append(live, stubs[zone].g)
	}
	return routes, live
}

// recompile makes routes the shared route table (lower-case FQDN zones),
// host the node listener's group (nil without -node-listen), and publishes
// every view's blocks over them; before New has the rest of the sources
// it only records them. On error nothing changes.
func (d *State) recompile(routes []forward.Route, host *forward.Group) error {
	for i := range routes { // lower-case FQDNs, as the blocks' zones
		if z := strings.ToLower(routes[i].Zone); strings.HasSuffix(z, ".") {
			routes[i].Zone = z
		} else {
			routes[i].Zone = z + "."
		}
	}
	old, oldHost := d.routes, d.nodeRoute
	d.routes, d.nodeRoute = routes, host
	if d.res0 == nil {
		return nil // New publishes once it has every source
	}
	if err := d.publish(); err != nil {
		d.routes, d.nodeRoute = old, oldHost
		return err
	}
	return nil
}

// publish compiles every view's blocks from their sources (the shared
// view's policies, handlers and chains; each view's own) over the route
// table, and the node listener's over its group, and publishes them with one store: the snapshot every view's
// resolver finds a query's block in. Views a Corefile edit replaced go to
// the server after (useViews). On error nothing changes.
func (d *State) publish() error {
	p := &snapshot{}
	var err error
	if p.shared, err = d.compileView(-1, d.sharedPol, d.chain.Load(), nil, nil, d.routes); err != nil {
		return err
	}
	if d.views != nil {
		for i, t := range d.views.tables {
			v, err := d.compileView(i, t.sp, t.c, t.vr, t.metrics, d.routes)
			if err != nil {
				return err
			}
			p.views = append(p.views, v)
		}
	}
	if p.node, err = d.compileNodeView(); err != nil {
		return fmt.Errorf("the node listener's table: %w", err)
	}
	d.pub.Store(p)
	if d.reload.viewsPending && d.Server != nil {
		d.reload.viewsPending = false
		if _, err := d.useViews(d.views); err != nil {
			// Checked when the views were built (one view per address,
			// at most MaxViews): not reached.
			d.log.Error("views not applied", "err", err)
		}
	}
	return nil
}

func (d *State) udpGroup(name string, servers []netip.AddrPort) (*forward.Group, error) {
	cfg := forward.GroupConfig{
		Name:        name,
		Servers:     servers,
		Proto:       forward.UDP,
		MaxInflight: d.cfg.MaxInflight, // as the kube-dns group
		Logger:      d.log.With("group", name),
	}
	if o := d.cfg.DropIn.NodeForward; name == "node" && o != nil {
		if o.TCP {
			cfg.Proto, cfg.PoolSize = forward.TCP, d.cfg.TCPPoolSize
		}
		if err := withOptions(&cfg, o); err != nil { // the Corefile's "." block
			return nil, err
		}
	}
	return forward.NewGroup(cfg, d.Metrics)
}

// retire closes groups after RetireGrace and drops the changed zones'
// entries after settleDrop and again then. stopReload cuts the waits short.
func (d *State) retire(groups []*forward.Group, zones []string) {
	r := &d.reload
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if d.wait(settleDrop) {
			d.dropZones(zones)
			d.wait(d.RetireGrace() - settleDrop)
		}
		for _, g := range groups {
			_ = g.Close()
		}
		d.dropZones(zones)
	}()
}

// wait sleeps for t and reports false when stopReload cut it short.
func (d *State) wait(t time.Duration) bool {
	tm := d.clock.NewTimer(t)
	defer tm.Stop()
	select {
	case <-tm.C():
		return true
	case <-d.reload.stop:
		return false
	}
}

// dropZones removes the cache entries at and below zones.
func (d *State) dropZones(zones []string) int {
	n := 0
	for _, z := range zones {
		if zw, ok := wire.AppendNameWire(nil, z); ok {
			n += d.Cache.DropZone(zw)
		}
	}
	return n
}

// appendGroup appends g unless it is nil.
func appendGroup(list []*forward.Group, g *forward.Group) []*forward.Group {
	if g == nil {
		return list
	}
	return append(list, g)
}

func stubList(stubs map[string]stubGroup) []string {
	out := make([]string, 0, len(stubs))
	for z, s := range stubs {
		out = append(out, fmt.Sprintf("%s%v", z, s.servers))
	}
	slices.Sort(out)
	return out
}
