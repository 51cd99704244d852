package daemon

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/nodelocaldns/nodelocaldns/internal/cluster"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
)

// The daemon's side of the fallback (internal/netsetup's fallback.go,
// docs/design.md "No black hole"): the heartbeat that keeps the gate open
// while every serving loop is alive, the targets of the DNAT chains (kube-dns'
// pods from the API, else from kube-proxy's rules), the counters of what went
// to kube-dns, and on exit whether the rules stay for the next instance.

// kubeDNSService is the Service whose ClusterIP a node cache serves in
// iptables mode (kube-dns' own, in the pod's namespace): its address keeps
// an empty DNAT chain, kube-proxy's rules being its fallback.
const kubeDNSService = "kube-dns"

const (
	// beatsPerWindow: the gate is refreshed this many times per
	// -fallback-after, so a beat or two late (a pause of the process, a
	// loop check that waited) does not close it.
	beatsPerWindow = 4
	// gateDrain is how long the serving loops go on reading after the gate
	// closed on an exit: what was NOTRACKed to our sockets before is
	// answered (it reaches them within microseconds), nothing more comes.
	gateDrain = 200 * time.Millisecond
	// exitCheckTimeout bounds asking the API server, on SIGTERM, whether
	// this pod's DaemonSet is going away; it runs during the lame duck.
	exitCheckTimeout = 2 * time.Second
)

// fallback is the state of the daemon's fallback side.
type fallback struct {
	d    *Daemon
	kick chan struct{} // the endpoints changed: rewrite the chains

	failing  atomic.Bool // the loop check fails (logged once per change)
	mu       sync.Mutex
	api      *cluster.Client
	ns       string       // the pod's namespace
	services []netip.Addr // our addresses that are Service ClusterIPs (API)
	svcKnown bool
	written  *netsetup.Fallback // the targets last written
	// asked: the exit's question (this pod's DaemonSet) was answered once
	// at start, so the rights to ask were granted; losing them at exit is
	// an uninstall (cluster.Revoked).
	asked atomic.Bool

	flows   *prometheus.CounterVec
	serving prometheus.Gauge
	targets *prometheus.GaugeVec
}

// newFallback prepares the fallback side when the rules are ours.
func newFallback(d *Daemon) *fallback {
	if d.net == nil || !d.cfg.SetupIPTables || d.cfg.FallbackAfter == 0 {
		return nil
	}
	f := &fallback{d: d, kick: make(chan struct{}, 1)}
	f.flows = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodelocaldns_fallback_flows_total",
		Help: "New conntrack flows (a UDP query from a new source port, a TCP connection) to a listen address that the kernel sent to kube-dns because no instance of ours served it, read from the fallback rules' counters (which survive us), by address and client (pods: the pod network; host: host-network clients).",
	}, []string{"address", "client"})
	f.serving = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodelocaldns_fallback_gate_open",
		Help: "1 while this instance's heartbeat keeps the gate open (every serving loop alive): the kernel gives it the queries; 0 while they go to kube-dns.",
	})
	f.targets = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodelocaldns_fallback_targets",
		Help: "kube-dns pods an address's fallback DNAT sends its queries to (UDP), the node's resolvers for the node listener's (-node-listen); 0 for a Service ClusterIP (kube-proxy's rules apply) or while none are known (no fallback for it).",
	}, []string{"address"})
	d.Metrics.Registry.MustRegister(f.flows, f.serving, f.targets)
	return f
}

// beat checks the loops and opens the gate (or keeps it open) when they
// pass. It is the start's first beat too: the start-up health query goes
// through the gate.
func (f *fallback) beat(ctx context.Context) {
	every := f.d.cfg.FallbackAfter / beatsPerWindow
	cctx, cancel := context.WithTimeout(ctx, every)
	err := f.d.Server.CheckLoops(cctx)
	cancel()
	if err == nil {
		err = f.d.net.Heartbeat()
	}
	if err == nil {
		f.serving.Set(1)
		if f.failing.Swap(false) {
			f.d.log.Info("fallback: serving loops alive again: queries come to this instance again")
		}
		return
	}
	f.serving.Set(0)
	if !f.failing.Swap(true) {
		f.d.log.Error("fallback: the heartbeat stopped: the kernel sends this node's queries to kube-dns from "+
			f.d.cfg.FallbackAfter.String()+" after the last good one until it passes again", "err", err)
	}
}

// run beats every -fallback-after/4, rewrites the DNAT chains when the
// endpoints change and every -syncinterval, and reads the counters.
func (f *fallback) run(ctx context.Context) {
	beat := time.NewTicker(f.d.cfg.FallbackAfter / beatsPerWindow)
	defer beat.Stop()
	sync := time.NewTicker(f.d.cfg.SyncInterval)
	defer sync.Stop()
	f.updateTargets(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			f.beat(ctx)
		case <-f.kick:
			f.updateTargets(ctx)
		case <-sync.C:
			f.updateTargets(ctx)
			f.count(ctx, false)
		}
	}
}

// changed is the endpoints' notice (kubeEndpoints.set): the chains follow.
func (f *fallback) changed() {
	if f == nil {
		return
	}
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// updateTargets writes the DNAT chains from what is known now: kube-dns'
// ready pods from the API's EndpointSlices, else from kube-proxy's
// iptables rules; nothing known leaves the chains as they are (the previous
// instance's targets serve meanwhile).
func (f *fallback) updateTargets(ctx context.Context) {
	fb, source, ok := f.targetsNow(ctx)
	fb.Node = f.nodeTargets()
	if !ok && (fb.Node == nil || !f.d.cfg.LocalMode) {
		return
	} else if !ok {
		source = "resolv.conf (local mode: the node listener's alone)"
	}
	f.mu.Lock()
	same := f.written != nil && slices.Equal(f.written.UDP, fb.UDP) && slices.Equal(f.written.TCP, fb.TCP) &&
		slices.Equal(f.written.Services, fb.Services) && maps.EqualFunc(f.written.Node, fb.Node, slices.Equal)
	f.mu.Unlock()
	if err := f.d.net.SetFallback(ctx, fb); err != nil {
		f.d.log.Warn("fallback: DNAT chains not written; retrying every sync interval", "err", err)
		return
	}
	f.mu.Lock()
	f.written = &fb
	f.mu.Unlock()
	for _, a := range f.d.net.Addrs() {
		n := 0
		if t, ok := fb.Node[a]; ok {
			n = len(t)
		} else if !slices.Contains(fb.Services, a) {
			for _, ap := range fb.UDP {
				if ap.Addr().Is6() == a.Is6() {
					n++
				}
			}
		}
		f.targets.WithLabelValues(a.String()).Set(float64(n))
	}
	if !same {
		f.d.log.Info("fallback: while no instance serves, queries go to kube-dns", "targets", describeTargets(f.d.net.FallbackTargets()), "from", source)
	}
}

// nodeTargets is the node listener's fallback (-node-listen): the node's
// own resolvers, as the running configuration last read them; never
// kube-dns, which may forward to the node listener.
func (f *fallback) nodeTargets() map[netip.Addr][]netip.AddrPort {
	if len(f.d.cfg.Node.Listen) == 0 {
		return nil
	}
	out := make(map[netip.Addr][]netip.AddrPort, len(f.d.cfg.Node.Listen))
	for _, a := range f.d.cfg.Node.Listen {
		out[a] = f.d.run.NodeResolvers()
	}
	return out
}

// targetsNow is the Fallback to write and where it came from.
func (f *fallback) targetsNow(ctx context.Context) (netsetup.Fallback, string, bool) {
	services := f.serviceIPs(ctx)
	if w := f.d.KubeEndpoints; w != nil && (w.State() == kubewatch.Synced || w.State() == kubewatch.Lost) {
		v := w.View()
		return netsetup.Fallback{UDP: v.UDP, TCP: v.InUse, Services: services}, "the API server (EndpointSlices)", true
	}
	if f.d.cfg.LocalMode {
		return netsetup.Fallback{}, "", false
	}
	kp, err := f.d.net.KubeProxy(ctx, f.d.cfg.KubeDNS)
	if err != nil || len(kp.UDP)+len(kp.TCP) == 0 {
		return netsetup.Fallback{}, "", false
	}
	if !f.servicesKnown() {
		services = kp.Services
	}
	return netsetup.Fallback{UDP: kp.UDP, TCP: kp.TCP, Services: services}, "kube-proxy's iptables rules", true
}

func (f *fallback) servicesKnown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.svcKnown
}

// serviceIPs asks the API server, until it has answered once, which of our
// addresses are Service ClusterIPs.
func (f *fallback) serviceIPs(ctx context.Context) []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.svcKnown || f.api == nil {
		return slices.Clone(f.services)
	}
	cctx, cancel := context.WithTimeout(ctx, exitCheckTimeout)
	defer cancel()
	s, err := f.api.ServiceIPs(cctx, f.ns, kubeDNSService, f.d.net.Addrs())
	if err != nil {
		f.d.log.Info("fallback: cannot ask whether a listen address is kube-dns' ClusterIP (Service "+kubeDNSService+", the manifest's Role); every address gets the DNAT, after kube-proxy's rules", "err", err)
		f.api = nil // asked once: not again
		return nil
	}
	f.services, f.svcKnown = s, true
	return slices.Clone(s)
}

// count reads the fallback rules' counters and reports what came since they
// were last reported (by this instance, or by an earlier one: the state
// directory keeps what was reported). At start it logs one line.
func (f *fallback) count(ctx context.Context, start bool) {
	now, err := f.d.net.FallbackCounts(ctx)
	if err != nil {
		f.d.log.Warn("fallback: counters not read", "err", err)
		return
	}
	var seen map[netip.Addr]netsetup.Count
	if f.d.reg != nil {
		seen = f.d.reg.FallbackSeen()
	}
	var parts []string
	for _, a := range f.d.net.Addrs() {
		c, s := now[a], seen[a]
		pods, host := c.Pods-min(s.Pods, c.Pods), c.Host-min(s.Host, c.Host)
		if s.Pods > c.Pods || s.Host > c.Host { // the rules were made again: counted from 0
			pods, host = c.Pods, c.Host
		}
		f.flows.WithLabelValues(a.String(), "pods").Add(float64(pods))
		f.flows.WithLabelValues(a.String(), "host").Add(float64(host))
		if pods+host > 0 || start {
			parts = append(parts, fmt.Sprintf("%s: %d from pods, %d from the host", a, pods, host))
		}
	}
	if f.d.reg != nil {
		if err := f.d.reg.RecordFallbackSeen(now); err != nil {
			f.d.log.Warn("fallback: counters not recorded in the state directory", "err", err)
		}
	}
	switch {
	case start:
		f.d.log.Info("fallback: while no instance served, kube-dns answered these new flows (a UDP query from a new source port, a TCP connection) since the last instance's report", "flows", strings.Join(parts, "; "))
	case len(parts) > 0:
		f.d.log.Warn("fallback: flows went to kube-dns while this instance ran (its gate was closed)", "flows", strings.Join(parts, "; "))
	}
}

// describeTargets writes FallbackTargets for the log.
func describeTargets(t map[netip.Addr]string) string {
	var parts []string
	for a, v := range t {
		switch v {
		case "kube-proxy":
			v = "kube-proxy's Service rules"
		case "":
			v = "none known (no fallback)"
		}
		parts = append(parts, a.String()+" -> "+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// exitDecision is whether the exit removes link and rules, and why.
type exitDecision struct {
	teardown bool
	why      string
}

// decideExit says, for an exit no twin takes over, whether link, addresses
// and rules go (-teardown, docs/design.md "No black hole"). It may ask the
// API server (bounded by exitCheckTimeout), so shutdown starts it at once.
func (d *Daemon) decideExit(ctx context.Context) exitDecision {
	env := d.opt.Env
	if env == nil {
		env = os.Getenv
	}
	switch {
	case d.cfg.SkipTeardown:
		return exitDecision{false, "-skipteardown"}
	case d.cfg.FallbackAfter == 0 || !d.cfg.SetupIPTables:
		return exitDecision{true, "no fallback rules (-fallback-after=0 or -setupiptables=false): nothing may stay"}
	case d.cfg.Teardown == "always":
		return exitDecision{true, "-teardown=always"}
	case env("KUBERNETES_SERVICE_HOST") == "":
		return exitDecision{true, "not running in a pod ($KUBERNETES_SERVICE_HOST unset): no DaemonSet brings a successor"}
	}
	rc := d.opt.KubeConfig
	if rc == nil {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			return exitDecision{false, "cannot ask the API server whether this is an uninstall (" + err.Error() + "): the fallback stays"}
		}
	}
	c, err := cluster.New(rc)
	if err != nil {
		return exitDecision{false, "cannot ask the API server whether this is an uninstall (" + err.Error() + "): the fallback stays"}
	}
	ns := env("POD_NAMESPACE")
	if ns == "" {
		ns = podNamespace(d.opt.KubeNamespace)
	}
	cctx, cancel := context.WithTimeout(ctx, exitCheckTimeout)
	defer cancel()
	switch owner, err := c.DaemonSet(cctx, ns, env("POD_NAME")); {
	case owner == cluster.Leaving:
		return exitDecision{true, "this pod's DaemonSet is gone or being deleted: an uninstall"}
	case owner == cluster.Staying:
		return exitDecision{false, "this pod's DaemonSet stays: its next pod adopts link and rules; the fallback serves meanwhile"}
	case cluster.Revoked(err) && d.fallback != nil && d.fallback.asked.Load():
		return exitDecision{true, "the API rights this pod had at start are gone (" + err.Error() + "): its manifest is being deleted, an uninstall"}
	default:
		return exitDecision{false, "cannot tell whether this is an uninstall (" + err.Error() + "): the fallback stays; " +
			"after an uninstall remove it with `nodelocaldns -cleanup` and the same flags"}
	}
}

// askOnce asks at start the question the exit will ask (this pod's
// DaemonSet): where it is answered, the rights exist, and an exit that
// finds them gone knows the manifest is being deleted.
func (f *fallback) askOnce(ctx context.Context, c *cluster.Client) {
	env := f.d.opt.Env
	if env == nil {
		env = os.Getenv
	}
	ns := env("POD_NAMESPACE")
	if ns == "" {
		ns = f.ns
	}
	cctx, cancel := context.WithTimeout(ctx, exitCheckTimeout)
	defer cancel()
	if owner, err := c.DaemonSet(cctx, ns, env("POD_NAME")); owner != cluster.Unknown {
		f.asked.Store(true)
	} else {
		f.d.log.Info("fallback: the exit will not be able to tell an uninstall from a rollout: it will leave link and rules (remove them after an uninstall with -cleanup)", "err", err)
	}
}

// podNamespace is the namespace given, else the service account's.
func podNamespace(given string) string {
	if given != "" {
		return given
	}
	b, err := os.ReadFile(config.ServiceAccountDir + "/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// startFallback starts the fallback side once the daemon serves: the API
// client for the Service question, the first count (its log line) and the
// loop.
func (d *Daemon) startFallback() {
	f := d.fallback
	if f == nil {
		return
	}
	if rc := d.opt.KubeConfig; rc != nil || os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		if rc == nil {
			rc, _ = rest.InClusterConfig()
		}
		if rc != nil {
			if c, err := cluster.New(rc); err == nil {
				f.api, f.ns = c, podNamespace(d.opt.KubeNamespace)
				d.bg.Add(1)
				go func() {
					defer d.bg.Done()
					f.askOnce(context.Background(), c)
				}()
			}
		}
	}
	f.count(context.Background(), true)
	ctx, cancel := context.WithCancel(context.Background())
	d.stopFallback = cancel
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		f.run(ctx)
	}()
}

// wildcardOnly are the interface addresses no socket of their own serves
// while a wildcard one does (a Corefile's bind 0.0.0.0 beside -localip):
// their socket match must count the wildcard socket.
func wildcardOnly(cfg *config.Config, ifAddrs []netip.Addr) []netip.Addr {
	socks := cfg.Sockets()
	wild := false
	for _, ap := range socks {
		wild = wild || ap.Addr().IsUnspecified()
	}
	if !wild {
		return nil
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		own := false
		for _, ap := range socks {
			own = own || ap.Addr().Unmap() == a.Unmap()
		}
		if !own {
			out = append(out, a)
		}
	}
	return out
}
