// Package daemon wires the parts together in the order that keeps a node's
// DNS working: interface, listeners, a health query through every listen
// address, rules, readiness; and on the way out not ready at once, lame
// duck, drain, teardown, within a hard deadline.
//
// It also owns the handover between twins, two instances serving the same
// addresses during a rolling update (handover.go, cachehandover.go): they
// meet in the state directory (internal/statedir), the new one serves the
// old one's very sockets and takes the old one's cache, and the one that
// exits while its twin serves leaves link and rules in place. probe.go
// holds the control socket's health answer and the exec probe's client
// (the health check itself is internal/server's).
//
// It decides no name's fate itself and holds no configuration beyond
// what it wires: the groups, block tables, resolvers and their reload are
// internal/running's (built here by running.New, started and stopped with
// the daemon); which block serves a name internal/blocks'; the transport
// internal/server's, resolution internal/resolve's, the upstreams
// internal/forward's, autopath's hook internal/autopath's.
// cmd/nodelocaldns only parses flags, handles signals and calls Run.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/nodelocaldns/nodelocaldns/internal/autopath"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/endpoints"
	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/metrics"
	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
	"github.com/nodelocaldns/nodelocaldns/internal/nodestatus"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
	"github.com/nodelocaldns/nodelocaldns/internal/running"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/statedir"
)

// Daemon is one running nodelocaldns.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	Metrics *metrics.Metrics
	Cache   *cache.Cache
	Server  *server.Server
	run     *running.State // groups, block tables, resolvers, reload
	net     *netsetup.Setup

	metricsAddr net.Addr
	ready       atomic.Bool
	stopping    atomic.Bool
	stopHTTP    context.CancelFunc
	stopNet     context.CancelFunc
	// clients maps the node's addresses to one client (nodeaddrs.go);
	// stopAddrs ends their refresh.
	clients   *fair.Clients
	stopAddrs context.CancelFunc
	bg        sync.WaitGroup
	opt       Options
	clock     clock.Clock // opt.Clock, never nil

	// Lifecycle with twins (internal/statedir, handover.go).
	reg      *statedir.Registry // nil without -state-dir
	control  controlListeners   // control sockets: handover, exec probes
	ctlWG    sync.WaitGroup
	handedTo atomic.Pointer[string] // the twin we gave our sockets to
	started  time.Time              // when we joined, real time: twins are ordered by it
	// The cache snapshot (cachesnapshot.go): its writer, nil when off;
	// whether the cache came from a twin (then no snapshot is loaded).
	snap         *snapshots
	cacheAdopted bool

	// -autopath (autopath.go): nil when off.
	PodWatch     *podwatch.Watch
	stopPodWatch context.CancelFunc
	autopath     *autopath.Hook

	// kube-dns' endpoints (kubeendpoints.go): nil without the API server.
	KubeEndpoints *endpoints.Watch
	kubeEP        *kubeEndpoints
	stopKubeEP    context.CancelFunc

	// The fallback (fallback.go): nil without it (-fallback-after=0, no rules).
	fallback     *fallback
	stopFallback context.CancelFunc

	// The readiness on the Node (nodestatus.go): nil when off.
	status     *nodestatus.Reporter
	stopStatus context.CancelFunc
	statusDone chan struct{}
	statusMu   sync.Mutex // the health check's Set against the shutdown's
}

// Options are what tests and main may change beyond the Config.
type Options struct {
	// Clock is the daemon's time: cache TTLs, the lame duck, the retiring
	// of replaced upstream groups. clock.Real when nil.
	Clock clock.Clock
	// InstanceIDForTest overrides the id in the state directory (the PID
	// namespace's inode and the PID), so tests can run twins in one process.
	InstanceIDForTest string
	// OnReady runs once Start has made the daemon ready (main writes
	// -pidfile there, as CoreDNS writes it once serving).
	OnReady func()
	// KubeConfig reaches the API server for -autopath instead of the
	// in-cluster credentials (tests), and for following kube-dns' endpoints.
	KubeConfig *rest.Config
	// KubeNamespace is the pod's namespace, where -upstreamsvc's Service is; the service
	// account's namespace file when "".
	KubeNamespace string
	// Env reads the environment ($KUBERNETES_SERVICE_HOST, $POD_NAME,
	// $POD_NAMESPACE: the exit's teardown decision); os.Getenv when nil.
	Env func(string) string
}

// New builds every part from cfg without touching the node or the network.
func New(cfg *config.Config, log *slog.Logger, opt Options) (*Daemon, error) {
	opt.Clock = clock.Or(opt.Clock)
	d := &Daemon{cfg: cfg, log: log, clock: opt.Clock, clients: fair.NewClients(nodeAddrs())}
	d.Cache = cache.New(cache.Config{
		SuccessCapacity: cfg.Cache.SuccessCapacity,
		DenialCapacity:  cfg.Cache.DenialCapacity,
		MaxBytes:        cfg.Cache.MaxBytes,
		PrefetchHits:    cfg.Cache.PrefetchHits,
	})
	var srv *server.Server
	d.Metrics = metrics.New(func() server.Counters { return srv.Snapshot() }, d.Cache)

	// The running configuration: groups, block tables, resolvers (internal/running).
	run, err := running.New(cfg, running.Env{Log: log, Clock: opt.Clock, Metrics: d.Metrics, Cache: d.Cache})
	if err != nil {
		return nil, err
	}
	d.run = run
	d.Metrics.SetHandlerStats(run.Stats) // trace's and dnstap's counters, the running configuration's
	cdBlocks := running.CoreDNSBlocks(cfg)
	d.autopath, err = newAutopath(d, run.Resolver())
	if err != nil {
		run.Close()
		return nil, err
	}
	ap := d.serverAutopath()
	sockAddrs, sockPorts := sockets(cfg)
	srv, err = server.New(server.Config{
		Addrs:            sockAddrs,
		Port:             cfg.Port,
		Ports:            sockPorts, // blocks on other ports: one socket per address and port
		UDPSockets:       cfg.UDPSockets,
		Resolver:         run.Resolver(),
		Clock:            opt.Clock,
		MaxUDPSize:       uint16(cfg.MaxUDPSize),
		MaxClientUDPSize: uint16(cfg.MaxClientUDPSize),
		MaxTCPConns:      cfg.MaxTCPConns,
		TCPIdleTimeout:   cfg.TCPIdleTimeout,
		TCPReadTimeout:   cfg.DropIn.TCPReadTimeout, // the Corefile's timeouts; 0: the server's default
		TCPWriteTimeout:  cfg.DropIn.TCPWriteTimeout,
		TCPMaxQueries:    cfg.DropIn.TCPMaxQueries,
		Logger:           log.With("component", "server"),
		QueryLog:         queryLog(cfg, log),
		CoreDNSZones:     running.CoreDNSZones(cdBlocks), // a query counts under its block's (resolve.Block.Metric)
		Autopath:         ap,
		Clients:          d.clients,
	})
	if err != nil {
		run.Close()
		return nil, err
	}
	d.Server = srv
	if err := run.Attach(srv); err != nil {
		run.Close()
		return nil, err
	}
	d.Metrics.CoreDNS(metrics.CoreDNSConfig{
		Blocks: cdBlocks, Servers: srv.CDServers, Snapshot: srv.CDSnapshot,
		Cache: d.Cache, CacheZones: metrics.CacheZonesLabel(cdBlocks), CacheBlocks: run.CacheBlocks,
	})

	if cfg.SetupInterface || cfg.SetupIPTables {
		d.net, err = netsetup.New(netConfig(cfg, log, d.Metrics))
		if err != nil {
			run.Close()
			return nil, err
		}
	}
	d.opt = opt
	d.fallback = newFallback(d)
	return d, nil
}

// sockets are the addresses the server listens on and the port of each.
func sockets(cfg *config.Config) (addrs []netip.Addr, ports []int) {
	for _, ap := range cfg.Sockets() {
		addrs = append(addrs, ap.Addr())
		ports = append(ports, int(ap.Port()))
	}
	return addrs, ports
}

// netConfig is the node plumbing for cfg: the interface's addresses (a
// Corefile's bind 0.0.0.0 or bind IFACE also listens on addresses the host
// has, which are not), the rules' ports, the fallback.
func netConfig(cfg *config.Config, log *slog.Logger, obs netsetup.Observer) netsetup.Config {
	ifAddrs := cfg.InterfaceIPs
	if ifAddrs == nil {
		ifAddrs = cfg.LocalIPs
	}
	// The wildcard (bind 0.0.0.0) is no interface address: the interface
	// and the rules are -localip's (config puts them in InterfaceIPs).
	ifAddrs = slices.DeleteFunc(slices.Clone(ifAddrs), netip.Addr.IsUnspecified)
	return netsetup.Config{
		InterfaceName:  cfg.InterfaceName,
		Addrs:          ifAddrs,
		Port:           cfg.Port,
		ExtraPorts:     cfg.ExtraPorts(),
		HealthPort:     cfg.HealthPort,
		SetupInterface: cfg.SetupInterface,
		SetupIPTables:  cfg.SetupIPTables,
		Backend:        cfg.IPTablesMode,
		SyncInterval:   cfg.SyncInterval,
		FallbackAfter:  cfg.FallbackAfter,
		WildcardOnly:   wildcardOnly(cfg, ifAddrs),
		Logger:         log.With("component", "netsetup"),
		Observer:       obs,
	}
}

// Cleanup removes what instances with cfg left on this node (rules of any
// version, the fallback's chains, the link's addresses, the link if one
// of them made it): `nodelocaldns -cleanup`, after an uninstall the
// exiting daemon could not tell from a restart. It refuses while an
// instance serves the same addresses.
func Cleanup(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if !cfg.SetupInterface && !cfg.SetupIPTables {
		return errors.New("-cleanup: nothing to remove with -setupinterface=false and -setupiptables=false")
	}
	var own netsetup.Ownership
	if cfg.StateDir != "" {
		id, err := statedir.InstanceID()
		if err != nil {
			return err
		}
		reg, err := statedir.Open(cfg.StateDir, id+"-cleanup", cfg.LocalIPs, cfg.Port)
		if err != nil {
			return err
		}
		unlock, err := reg.LockGroup(ctx)
		if err != nil {
			return err
		}
		defer unlock()
		if twins := reg.Twins(); len(twins) > 0 {
			return fmt.Errorf("-cleanup: an instance serves these addresses (pid %s): stop it first", statedir.PID(twins[0]))
		}
		own = reg.InheritedOwnership(log)
		defer reg.ForgetOwnership()
	}
	s, err := netsetup.New(netConfig(cfg, log, nil))
	if err != nil {
		return err
	}
	return s.RemoveAll(ctx, own)
}

// Start brings the daemon up in the order that keeps the node's DNS
// working: join the twins (the control socket, the state directory),
// interface, listeners (the twin's own sockets when one serves the same
// addresses: see handover.go), rules, a health query through every listen
// address, HTTP, readiness. On error what was set up is undone
// (unless -skipteardown, or a twin serves the same addresses).
func (d *Daemon) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), ShutdownBudget)
			defer cancel()
			_ = d.shutdown(sctx, 0)
		}
	}()
	var twins []string
	if d.cfg.StateDir != "" {
		// Held until Start returns: a twin that exits meanwhile waits to
		// decide about teardown until we are up (and then sees us).
		unlock, t, err := d.join(ctx)
		switch {
		case errors.Is(err, errNoStateDir):
			// Serving matters more than handover: run as without
			// -state-dir. Exec probes fail, which makes it visible.
			d.log.Error("state directory unusable: no handover to or from a twin, no exec probes, teardown on every exit", "err", err)
		case err != nil:
			return err
		default:
			defer unlock()
			twins = t
		}
	}
	d.startNodeStatus(len(twins) > 0) // nodestatus.go: not ready, unless a twin serves
	if d.net != nil && d.cfg.SetupInterface {
		if err := d.net.EnsureLink(ctx); err != nil {
			return fmt.Errorf("set up interface: %w", err)
		}
	}
	if len(twins) > 0 {
		d.adoptSockets(ctx, twins)
	}
	d.startSnapshots() // the cache from the snapshot, unless a twin's came
	if err := listenAs(d.cfg.SocketUID, d.Server.Listen); err != nil {
		return err
	}
	d.Server.Serve()
	d.stopAddrs = d.background(d.watchNodeAddrs)
	d.rulesAndGate(ctx)
	if err := d.health(ctx); err != nil {
		return fmt.Errorf("health query through the listener: %w", err)
	}
	if d.reg != nil && d.net != nil {
		if err := d.reg.RecordOwnership(d.net.Ownership()); err != nil {
			d.log.Error("cannot record what we added to the link: the last instance to exit may leave it", "err", err)
		}
	}
	if d.net != nil {
		d.stopNet = d.background(d.net.Run)
	}
	addr, err := d.serveHTTP()
	if err != nil {
		return err
	}
	d.startKubeEndpoints() // before the reload goroutine, which hands it a replaced kube-dns group
	d.startFallback()
	d.run.Start()
	if err := d.startPodWatch(); err != nil {
		// DNS never depends on the API server: serve without autopath.
		d.log.Error("autopath off", "err", err)
	}
	d.ready.Store(true)
	d.nodeStatusServing()
	d.log.Info("serving",
		"listen", joinAddrs(d.cfg.Sockets()),
		"kube_dns", kubeDNSString(d.cfg),
		"nameservers", fmt.Sprint(d.cfg.Nameservers),
		"metrics", addr.String(),
		"health", d.cfg.HealthAddr,
		"twins", len(twins))
	if d.opt.OnReady != nil {
		d.opt.OnReady()
	}
	return nil
}

// rulesAndGate puts the rules in and opens the gate, before the health
// query: in iptables mode one address is the kube-dns ClusterIP, and while
// our NOTRACK rules do not hold kube-proxy's DNAT sends the query for it to
// a kube-dns pod, whose answer is not ours (seen in the e2e cluster: every
// start failed with an i/o timeout). A failed check exits, and the exit
// closes the gate (and removes the rules where it tears down).
func (d *Daemon) rulesAndGate(ctx context.Context) {
	if d.net != nil && d.cfg.SetupIPTables {
		if err := d.net.EnsureRules(ctx); err != nil {
			// The listener works without the rules (only conntrack is
			// not skipped); keep serving and let the reconciler retry.
			d.log.Error("iptables rules not installed; retrying every sync interval", "err", err)
		}
	}
	if d.fallback != nil {
		d.fallback.beat(ctx)
	}
}

// serveHTTP starts the HTTP listeners: metrics (with health and ready),
// the Corefile's health when it has its own address, pprof, node-cache's
// own metrics endpoint; it returns the metrics listener's address.
func (d *Daemon) serveHTTP() (net.Addr, error) {
	hctx, cancel := context.WithCancel(context.Background())
	d.stopHTTP = cancel
	addr, err := d.Metrics.Serve(hctx, metrics.HTTPConfig{
		Addr:   d.cfg.MetricsAddr,
		Health: d.health,
		Ready:  d.readyProbe,
		Log:    d.log,
	})
	if err != nil {
		return nil, err
	}
	d.metricsAddr = addr
	if d.cfg.HealthAddr != "" && d.cfg.HealthAddr != d.cfg.MetricsAddr {
		_, err := d.Metrics.Serve(hctx, metrics.HTTPConfig{Addr: d.cfg.HealthAddr, Health: d.health, Ready: d.readyProbe, HealthOnly: true, Log: d.log})
		if err != nil {
			return nil, err
		}
	}
	if a := d.cfg.PProf; a != "" {
		// Not fatal either: a profile is for debugging.
		if _, err := d.Metrics.ServePProf(hctx, a, d.log); err != nil {
			d.log.Error("pprof not served", "addr", a, "err", err)
		} else if d.cfg.PProfBlock != 0 {
			runtime.SetBlockProfileRate(d.cfg.PProfBlock) // the Corefile's pprof { block }, as CoreDNS sets it
		}
	}
	if a := d.cfg.DropIn.NodeCacheMetricsAddr; a != "" { // drop-in: node-cache's own endpoint
		// Not fatal: DNS and the Corefile's endpoint matter more.
		if _, err := d.Metrics.Serve(hctx, metrics.HTTPConfig{Addr: a, Health: d.health, Ready: d.readyProbe, Log: d.log}); err != nil {
			d.log.Error("node-cache's metrics endpoint (-metrics-listen-address) not served", "addr", a, "err", err)
		}
	}
	return addr, nil
}

// join registers this instance in the state directory under the group
// lock, and returns the live twins (youngest first) and the unlock.
func (d *Daemon) join(ctx context.Context) (unlock func(), twins []string, err error) {
	id := d.opt.InstanceIDForTest
	if id == "" {
		if id, err = statedir.InstanceID(); err != nil {
			return nil, nil, err
		}
	}
	reg, err := statedir.Open(d.cfg.StateDir, id, d.cfg.LocalIPs, d.cfg.Port)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errNoStateDir, err)
	}
	lctx, cancel := context.WithTimeout(ctx, startLockWait)
	defer cancel()
	if unlock, err = reg.LockGroup(lctx); err != nil {
		if ctx.Err() != nil {
			return nil, nil, err
		}
		// Held all that time: by a twin that hangs, or by anyone who can
		// write the state directory (a flock proves nothing). Serving
		// matters more than the order of starts.
		d.log.Error("starting without the group lock", "err", err)
		unlock = func() {}
	}
	ln, err := reg.ListenControl()
	if err != nil {
		unlock()
		return nil, nil, err
	}
	d.started = time.Now()
	if err := reg.Register(map[string]any{"pid": os.Getpid(), "started": d.clock.Now().UTC(), "listen": joinAddrs(d.cfg.Sockets())}); err != nil {
		_ = ln.Close()
		unlock()
		return nil, nil, err
	}
	d.reg = reg
	d.serveControl(ln, false)
	if old, err := reg.ListenLegacy(); err == nil {
		d.serveControl(old, true) // for a rollback to a version before issue 41
	} else {
		d.log.Warn("no control socket file for older versions: a rollback to one hands no sockets over", "err", err)
	}
	return unlock, reg.Twins(), nil
}

// background runs run in a goroutine the daemon waits for at shutdown
// (bg), until the returned cancel.
func (d *Daemon) background(run func(ctx context.Context)) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		run(ctx)
	}()
	return cancel
}

// queryLog is the query log's logger, nil when -querylog is off.
func queryLog(cfg *config.Config, log *slog.Logger) *slog.Logger {
	if !cfg.QueryLog {
		return nil
	}
	return log.With("component", "querylog")
}

// errNoStateDir: the state directory cannot be used.
var errNoStateDir = errors.New("state directory")

// adoptSockets asks the twins, youngest first, for their listening
// sockets. Without them Listen opens new ones, which also works, but what
// the twin's sockets hold when it exits is then lost.
func (d *Daemon) adoptSockets(ctx context.Context, twins []string) {
	for _, t := range twins {
		files, err := d.requestHandover(ctx, t)
		if err != nil {
			d.log.Warn("no socket handover from a twin", "twin", t, "err", err)
			continue
		}
		udp, tcp, err := d.Server.Adopt(files)
		if err != nil {
			d.log.Warn("some handed-over sockets were unusable", "twin", t, "err", err)
		}
		d.log.Info("serving a twin's listening sockets", "twin", t, "udp", udp, "tcp", tcp)
		d.adoptCache(t)
		return
	}
	d.log.Warn("opening our own sockets next to the twin's; queries queued in its sockets when it exits are lost")
}

// MetricsAddr is the bound address of the HTTP server (after Start).
func (d *Daemon) MetricsAddr() net.Addr { return d.metricsAddr }

func (d *Daemon) readyProbe(context.Context) error {
	if d.stopping.Load() {
		return errors.New("shutting down")
	}
	if !d.ready.Load() {
		return errors.New("starting")
	}
	return nil
}

// Run starts the daemon, serves until ctx is done, then shuts down: lame
// duck, drain, teardown, all within grace (-lameduck plus ShutdownBudget).
func (d *Daemon) Run(ctx context.Context, grace time.Duration) error {
	if err := d.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	d.log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return d.shutdown(sctx, d.cfg.LameDuck)
}

// Shutdown budget after the lame duck. The pod's
// terminationGracePeriodSeconds must exceed -lameduck plus ShutdownBudget
// (5 s + 12 s by default, against Kubernetes' default of 30 s).
const (
	// drainDeadline bounds stopping the loops, draining TCP connections
	// (a connection that has not sent its first query gets the 2 s read
	// timeout) and answering the misses in flight.
	drainDeadline = 3 * time.Second
	// exitLockWait bounds waiting for a starting twin before deciding
	// about teardown; past it we decide anyway (a starting twin has
	// registered before it takes long, so it is seen).
	exitLockWait = 2 * time.Second
	// teardownDeadline: rules and link removal take well under a second; 5 s
	// covers a contended xtables lock and stays far inside the pod's grace.
	teardownDeadline = 5 * time.Second
	// ShutdownBudget is what shutdown may take after the lame duck.
	ShutdownBudget = drainDeadline + exitLockWait + teardownDeadline + 2*time.Second
	// WatchdogLeeway is how far past grace (-lameduck plus ShutdownBudget)
	// the shutdown may run before main's watchdog exits the process; the
	// pod's terminationGracePeriodSeconds must exceed all three.
	WatchdogLeeway = time.Second
)

// startLockWait bounds waiting for a twin that is starting or tearing
// down before we start; past it we start without the group lock (a var
// for tests).
var startLockWait = 20 * time.Second

// shutdown: readiness fails at once; the daemon answers for lameDuck
// (skipped when the twin we handed our sockets to is alive: it reads them
// already); then, unless a twin serves the same addresses, the gate closes
// (the kernel sends the next queries to kube-dns), what is queued is
// answered, the serving loops stop, TCP drains, misses are answered and the
// sockets close; and link and rules go, or stay for the next instance
// (decideExit). Everything is bounded by ctx.
func (d *Daemon) shutdown(ctx context.Context, lameDuck time.Duration) error {
	d.stopping.Store(true)
	d.ready.Store(false)
	d.nodeStatusStopping(lameDuck)
	exit := make(chan exitDecision, 1)
	go func() { exit <- d.decideExit(ctx) }() // may ask the API server: during the lame duck
	if lameDuck > 0 {
		if t := d.handedTo.Load(); t != nil && d.reg != nil && d.reg.Alive(*t) {
			d.log.Info("no lame duck: the twin holding our sockets serves them", "twin", *t)
		} else {
			d.log.Info("lame duck: answering queries, not ready", "for", lameDuck)
			tm := d.clock.NewTimer(lameDuck)
			select {
			case <-tm.C():
			case <-ctx.Done():
				tm.Stop()
			}
		}
	}
	var errs []error
	for _, stop := range []context.CancelFunc{d.stopNet, d.stopAddrs, d.stopPodWatch, d.stopKubeEP, d.stopFallback} {
		if stop != nil {
			stop()
		}
	}
	d.bg.Wait()
	if d.control != nil {
		_ = d.control.Close()
		d.ctlWG.Wait()
	}
	finish, err := d.releaseNode(ctx, exit)
	if err != nil {
		errs = append(errs, fmt.Errorf("teardown: %w", err))
	}
	dctx, cancel := context.WithTimeout(ctx, drainDeadline)
	if err := d.Server.Shutdown(dctx); err != nil {
		// Not a failure: a client kept its connection busy; it retries.
		d.log.Warn("drain cut short; remaining TCP connections closed", "err", err)
	}
	cancel()
	if err := finish(); err != nil {
		errs = append(errs, fmt.Errorf("teardown: %w", err))
	}
	d.stopSnapshots(ctx.Done()) // the last one, with what the drain answered
	if d.stopHTTP != nil {
		d.stopHTTP()
	}
	// A reload in progress must not hold the exit past the deadline; the
	// rules are gone already.
	stopped := make(chan struct{})
	go func() {
		d.run.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		d.run.Close() // after Stop: no reload may change the groups after
	case <-ctx.Done():
		d.log.Warn("a configuration reload did not stop in time; exiting without it")
	}
	d.stopNodeStatus(ctx)
	return errors.Join(errs...)
}

// releaseNode decides, before the sockets drain, what happens to link and
// rules, under the group lock (a twin cannot start in between; held until
// finish). A twin serving the same addresses keeps them (our ownership of
// the link goes to it). Otherwise, with the fallback, the gate closes and
// the loops read on for gateDrain: what the kernel gave our sockets is
// answered, the next queries go to kube-dns; finish, after the drain, then
// removes link and rules or leaves them (decideExit). Without the
// fallback the rules go first, as before (closed sockets under
// unconditional rules refused queries), and finish does the rest.
func (d *Daemon) releaseNode(ctx context.Context, exit <-chan exitDecision) (finish func() error, err error) {
	unlock := func() {}
	if d.reg != nil {
		lctx, cancel := context.WithTimeout(ctx, exitLockWait)
		u, err := d.reg.LockGroup(lctx)
		cancel()
		if err != nil {
			d.log.Warn("deciding about teardown without the group lock", "err", err)
		} else {
			unlock = u
		}
		if twins := d.reg.Twins(); len(twins) > 0 {
			defer d.reg.Unregister()
			defer unlock()
			d.leaveToTwins(twins)
			return func() error { return nil }, nil
		}
	}
	done := func() {
		unlock()
		if d.reg != nil {
			d.reg.Unregister()
		}
	}
	if d.net == nil {
		done()
		return func() error { return nil }, nil
	}
	if d.fallback == nil {
		// The stock rules NOTRACK whether a socket exists or not: they go
		// before the sockets close.
		dec := <-exit
		var err error
		if dec.teardown {
			err = d.removeAll(ctx)
		}
		done()
		return func() error { return nil }, err
	}
	if err := d.net.CloseGate(); err != nil {
		d.log.Warn("fallback: gate not closed: queries keep coming until it ages out", "err", err, "within", d.cfg.FallbackAfter)
	}
	d.fallback.serving.Set(0)
	tm := d.clock.NewTimer(gateDrain)
	select {
	case <-tm.C():
	case <-ctx.Done():
		tm.Stop()
	}
	return func() error {
		defer done()
		dec := <-exit
		if !dec.teardown {
			d.log.Info("leaving link, addresses and rules: the fallback sends queries to kube-dns until the next instance adopts them", "why", dec.why)
			return nil
		}
		d.log.Info("removing link, addresses and rules", "why", dec.why)
		return d.removeAll(ctx)
	}, nil
}

// leaveToTwins records what we added to the link for the twins and leaves
// link and rules to them.
func (d *Daemon) leaveToTwins(twins []string) {
	if d.net != nil {
		if err := d.reg.RecordOwnership(d.net.Ownership()); err != nil {
			d.log.Error("cannot record what we added to the link: the last instance to exit may leave it", "err", err)
		}
	}
	pids := make([]string, len(twins))
	for i, t := range twins {
		pids[i] = statedir.PID(t)
	}
	d.log.Info("a twin serves the same addresses: leaving link and rules to it", "twin_pids", strings.Join(pids, ","))
}

// removeAll removes link, addresses and rules: ours, and what earlier
// instances recorded they added.
func (d *Daemon) removeAll(ctx context.Context) error {
	if d.reg != nil {
		d.net.Inherit(d.reg.InheritedOwnership(d.log))
	}
	if err := d.teardown(ctx); err != nil {
		return err
	}
	if d.reg != nil {
		d.reg.ForgetOwnership()
	}
	return nil
}

func (d *Daemon) teardown(ctx context.Context) error {
	tctx, cancel := context.WithTimeout(ctx, teardownDeadline)
	defer cancel()
	return d.net.Teardown(tctx)
}

func joinAddrs(aps []netip.AddrPort) string {
	s := make([]string, len(aps))
	for i, a := range aps {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

func kubeDNSString(c *config.Config) string {
	if c.LocalMode {
		return "none (local mode)"
	}
	return c.KubeDNS.String() + " from " + c.KubeDNSSource
}
