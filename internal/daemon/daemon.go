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

	// -autopath (autopath.go): nil when off.
	PodWatch     *podwatch.Watch
	stopPodWatch context.CancelFunc
	autopath     *autopath.Hook

	// kube-dns' endpoints (kubeendpoints.go): nil without the API server.
	KubeEndpoints *endpoints.Watch
	kubeEP        *kubeEndpoints
	stopKubeEP    context.CancelFunc
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
	var ap server.Autopath
	if d.autopath != nil {
		ap = d.autopath // a nil *autopath.Hook would not be a nil interface
	}
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
		// The interface's addresses: a Corefile's bind 0.0.0.0 or bind
		// IFACE also listens on addresses the host has, which are not.
		ifAddrs := cfg.InterfaceIPs
		if ifAddrs == nil {
			ifAddrs = cfg.LocalIPs
		}
		// The wildcard (bind 0.0.0.0) is no interface address: the
		// interface and the rules are -localip's (config puts them in
		// InterfaceIPs).
		ifAddrs = slices.DeleteFunc(slices.Clone(ifAddrs), netip.Addr.IsUnspecified)
		d.net, err = netsetup.New(netsetup.Config{
			InterfaceName:  cfg.InterfaceName,
			Addrs:          ifAddrs,
			Port:           cfg.Port,
			ExtraPorts:     cfg.ExtraPorts(),
			HealthPort:     cfg.HealthPort,
			SetupInterface: cfg.SetupInterface,
			SetupIPTables:  cfg.SetupIPTables,
			Backend:        cfg.IPTablesMode,
			SyncInterval:   cfg.SyncInterval,
			Logger:         log.With("component", "netsetup"),
			Observer:       d.Metrics,
		})
		if err != nil {
			run.Close()
			return nil, err
		}
	}
	d.opt = opt
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
	if d.net != nil && d.cfg.SetupInterface {
		if err := d.net.EnsureLink(ctx); err != nil {
			return fmt.Errorf("set up interface: %w", err)
		}
	}
	if len(twins) > 0 {
		d.adoptSockets(ctx, twins)
	}
	if err := listenAs(d.cfg.SocketUID, d.Server.Listen); err != nil {
		return err
	}
	d.Server.Serve()
	d.stopAddrs = d.background(d.watchNodeAddrs)
	// Rules before the health query: in iptables mode one address is the
	// kube-dns ClusterIP, and until our NOTRACK rules exist kube-proxy's
	// DNAT sends the query for it to a kube-dns pod, whose answer is not
	// ours (seen in the e2e cluster: every start failed with an i/o
	// timeout). A failed check exits, and the exit removes the rules.
	if d.net != nil && d.cfg.SetupIPTables {
		if err := d.net.EnsureRules(ctx); err != nil {
			// The listener works without the rules (only conntrack is
			// not skipped); keep serving and let the reconciler retry.
			d.log.Error("iptables rules not installed; retrying every sync interval", "err", err)
		}
	}
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
	d.run.Start()
	if err := d.startPodWatch(); err != nil {
		// DNS never depends on the API server: serve without autopath.
		d.log.Error("autopath off", "err", err)
	}
	d.ready.Store(true)
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
// already); the serving loops stop, TCP drains, misses are answered and the
// sockets close; then rules and link are torn down unless a twin serves
// the same addresses or -skipteardown. Everything is bounded by ctx.
func (d *Daemon) shutdown(ctx context.Context, lameDuck time.Duration) error {
	d.stopping.Store(true)
	d.ready.Store(false)
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
	// The rules and the address go first (unless a twin keeps them), then
	// the sockets: closed first, they left half a second in which the
	// address was there and nobody listened, and a pod's query got a port
	// unreachable, which glibc fails at once (2 lookups per pod in make
	// e2e's rollback to the stock node-local-dns); without the rules a
	// query goes to kube-dns through kube-proxy, or is lost and retried.
	if d.stopNet != nil {
		d.stopNet()
	}
	if d.stopAddrs != nil {
		d.stopAddrs()
	}
	if d.stopPodWatch != nil {
		d.stopPodWatch()
	}
	if d.stopKubeEP != nil {
		d.stopKubeEP()
	}
	d.bg.Wait()
	if d.control != nil {
		_ = d.control.Close()
		d.ctlWG.Wait()
	}
	if err := d.releaseNode(ctx); err != nil {
		errs = append(errs, fmt.Errorf("teardown: %w", err))
	}
	dctx, cancel := context.WithTimeout(ctx, drainDeadline)
	if err := d.Server.Shutdown(dctx); err != nil {
		// Not a failure: a client kept its connection busy; it retries.
		d.log.Warn("drain cut short; remaining TCP connections closed", "err", err)
	}
	cancel()
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
	return errors.Join(errs...)
}

// releaseNode tears down rules and link, unless a twin serves the same
// addresses (it keeps them, and our ownership of the link goes to it) or
// -skipteardown. The decision is taken under the group lock, so a twin
// cannot start in between.
func (d *Daemon) releaseNode(ctx context.Context) error {
	if d.reg == nil {
		if d.net == nil || d.cfg.SkipTeardown {
			return nil
		}
		return d.teardown(ctx)
	}
	defer d.reg.Unregister()
	lctx, cancel := context.WithTimeout(ctx, exitLockWait)
	unlock, err := d.reg.LockGroup(lctx)
	cancel()
	if err != nil {
		d.log.Warn("deciding about teardown without the group lock", "err", err)
	} else {
		defer unlock()
	}
	if twins := d.reg.Twins(); len(twins) > 0 {
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
		return nil
	}
	if d.net == nil || d.cfg.SkipTeardown {
		return nil
	}
	d.net.Inherit(d.reg.InheritedOwnership(d.log))
	if err := d.teardown(ctx); err != nil {
		return err
	}
	d.reg.ForgetOwnership()
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
