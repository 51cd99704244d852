// Package daemon wires the parts together in the order that keeps a node's
// DNS working: interface, listeners, a self-query through the listener,
// rules, readiness; and the reverse on the way out.
//
// It holds no DNS logic of its own; cmd/nodelocaldns only parses flags,
// handles signals and calls Run.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/metrics"
	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Reverse zones answered by kube-dns (pod and service PTR records).
var reverseZones = []string{"in-addr.arpa.", "ip6.arpa."}

// Daemon is one running nodelocaldns.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	Metrics *metrics.Metrics
	Cache   *cache.Cache
	Server  *server.Server
	Router  *forward.Router
	groups  []*forward.Group
	net     *netsetup.Setup

	metricsAddr net.Addr
	ready       atomic.Bool
	stopping    atomic.Bool
	stopHTTP    context.CancelFunc
	stopNet     context.CancelFunc
	pprof       bool
	bg          sync.WaitGroup
}

// Options are what tests and main may change beyond the Config.
type Options struct {
	Now   func() time.Time // clock for TTLs; time.Now by default
	PProf bool
}

// New builds every part from cfg without touching the node or the network.
func New(cfg *config.Config, log *slog.Logger, opt Options) (*Daemon, error) {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	d := &Daemon{cfg: cfg, log: log}
	d.Cache = cache.New(cache.Config{
		SuccessCapacity: cfg.Cache.SuccessCapacity,
		DenialCapacity:  cfg.Cache.DenialCapacity,
		MaxBytes:        cfg.Cache.MaxBytes,
	})
	var srv *server.Server
	d.Metrics = metrics.New(func() server.Counters { return srv.Snapshot() }, d.Cache)

	node, err := forward.NewGroup(forward.GroupConfig{
		Name:    "node",
		Servers: cfg.Nameservers,
		Proto:   forward.UDP,
		Logger:  log.With("group", "node"),
	}, d.Metrics)
	if err != nil {
		return nil, fmt.Errorf("node resolvers: %w", err)
	}
	d.groups = append(d.groups, node)
	routes := []forward.Route{{Zone: ".", Group: node}}
	if !cfg.LocalMode {
		kube, err := forward.NewGroup(forward.GroupConfig{
			Name:     "kube-dns",
			Servers:  []netip.AddrPort{cfg.KubeDNS},
			Proto:    forward.TCP,
			PoolSize: cfg.TCPPoolSize,
			Logger:   log.With("group", "kube-dns"),
		}, d.Metrics)
		if err != nil {
			d.closeGroups()
			return nil, fmt.Errorf("kube-dns: %w", err)
		}
		d.groups = append(d.groups, kube)
		for _, z := range append([]string{cfg.ClusterDomain}, reverseZones...) {
			routes = append(routes, forward.Route{Zone: z, Group: kube})
		}
	}
	d.Router = forward.NewRouter(routes)

	srv, err = server.New(server.Config{
		Addrs:       cfg.LocalIPs,
		Port:        cfg.Port,
		UDPSockets:  cfg.UDPSockets,
		Cache:       d.Cache,
		Forward:     d.forward,
		ClusterZone: cfg.ClusterDomain,
		ClusterPolicy: cache.Policy{
			SuccessMax: cfg.Cache.ClusterSuccessTTL, DenialMax: cfg.Cache.ClusterDenialTTL, MinTTL: cfg.Cache.MinTTL,
		},
		DefaultPolicy: cache.Policy{
			SuccessMax: cfg.Cache.SuccessTTL, DenialMax: cfg.Cache.DenialTTL, MinTTL: cfg.Cache.MinTTL,
		},
		ServFailTTL:    cfg.Cache.ServFailTTL,
		MaxUDPSize:     uint16(cfg.MaxUDPSize),
		ForwardTimeout: cfg.ForwardTimeout,
		MaxInflight:    cfg.MaxInflight,
		MaxTCPConns:    cfg.MaxTCPConns,
		TCPIdleTimeout: cfg.TCPIdleTimeout,
		Now:            opt.Now,
		Logger:         log.With("component", "server"),
	})
	if err != nil {
		d.closeGroups()
		return nil, err
	}
	d.Server = srv

	if cfg.SetupInterface || cfg.SetupIPTables {
		d.net, err = netsetup.New(netsetup.Config{
			InterfaceName:  cfg.InterfaceName,
			Addrs:          cfg.LocalIPs,
			Port:           cfg.Port,
			HealthPort:     cfg.HealthPort,
			SetupInterface: cfg.SetupInterface,
			SetupIPTables:  cfg.SetupIPTables,
			Backend:        cfg.IPTablesMode,
			SyncInterval:   cfg.SyncInterval,
			Logger:         log.With("component", "netsetup"),
			Observer:       d.Metrics,
		})
		if err != nil {
			d.closeGroups()
			return nil, err
		}
	}
	d.pprof = opt.PProf
	return d, nil
}

// forward routes a miss to the group for its zone.
func (d *Daemon) forward(ctx context.Context, qname string, query []byte) ([]byte, error) {
	g := d.Router.Lookup(qname)
	if g == nil {
		return nil, errors.New("no route for " + qname)
	}
	return g.Exchange(ctx, query)
}

// Start brings the daemon up: interface, listeners, a self-query through a
// listener, rules, metrics and readiness. On error what was set up is
// undone (unless -skipteardown).
func (d *Daemon) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			d.shutdown(context.Background(), 0)
		}
	}()
	if d.net != nil && d.cfg.SetupInterface {
		if err := d.net.EnsureLink(ctx); err != nil {
			return fmt.Errorf("set up interface: %w", err)
		}
	}
	if err := d.Server.Listen(); err != nil {
		return err
	}
	d.Server.Serve()
	if err := d.selfQuery(ctx); err != nil {
		return fmt.Errorf("self-query through the listener: %w", err)
	}
	if d.net != nil && d.cfg.SetupIPTables {
		if err := d.net.EnsureRules(ctx); err != nil {
			// The listener works without the rules (only conntrack is
			// not skipped); keep serving and let the reconciler retry.
			d.log.Error("iptables rules not installed; retrying every sync interval", "err", err)
		}
	}
	if d.net != nil {
		rctx, cancel := context.WithCancel(context.Background())
		d.stopNet = cancel
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			d.net.Run(rctx)
		}()
	}
	hctx, cancel := context.WithCancel(context.Background())
	d.stopHTTP = cancel
	addr, err := d.Metrics.Serve(hctx, metrics.HTTPConfig{
		Addr:   d.cfg.MetricsAddr,
		Health: d.selfQuery,
		Ready:  d.readyProbe,
		PProf:  d.pprof,
	})
	if err != nil {
		return err
	}
	d.metricsAddr = addr
	d.ready.Store(true)
	d.log.Info("serving",
		"listen", joinAddrs(d.cfg.LocalIPs, d.cfg.Port),
		"kube_dns", kubeDNSString(d.cfg),
		"nameservers", fmt.Sprint(d.cfg.Nameservers),
		"metrics", addr.String())
	return nil
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

// selfQuery asks the first listener for the health name, which the server
// answers itself: it proves the socket is read and answered without
// depending on any upstream.
func (d *Daemon) selfQuery(ctx context.Context) error {
	ap := d.Server.Addr()
	if !ap.IsValid() {
		return errors.New("not listening")
	}
	deadline := time.Now().Add(time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	c, err := net.Dial("udp", ap.String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	q := server.HealthQuery(uint16(time.Now().UnixNano()))
	if _, err := c.Write(q); err != nil {
		return err
	}
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("no answer from %s: %w", ap, err)
		}
		if n >= wire.HeaderLen && wire.ID(buf) == wire.ID(q) {
			if rc := wire.Rcode(buf[:n]); rc != wire.RcodeSuccess {
				return fmt.Errorf("health query answered rcode %d", rc)
			}
			return nil
		}
	}
}

// Run starts the daemon, serves until ctx is done, then shuts down within
// the grace period.
func (d *Daemon) Run(ctx context.Context, grace time.Duration) error {
	if err := d.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	d.log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return d.shutdown(sctx, grace)
}

// shutdown stops serving and tears down rules and link (rules first).
func (d *Daemon) shutdown(ctx context.Context, _ time.Duration) error {
	d.stopping.Store(true)
	d.ready.Store(false)
	var errs []error
	if err := d.Server.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("drain: %w", err))
	}
	if d.stopNet != nil {
		d.stopNet()
	}
	d.bg.Wait()
	if d.net != nil && !d.cfg.SkipTeardown {
		tctx, cancel := context.WithTimeout(context.Background(), teardownDeadline)
		if err := d.net.Teardown(tctx); err != nil {
			errs = append(errs, fmt.Errorf("teardown: %w", err))
		}
		cancel()
	}
	if d.stopHTTP != nil {
		d.stopHTTP()
	}
	d.closeGroups()
	return errors.Join(errs...)
}

// teardownDeadline: rules and link removal take well under a second; 5 s
// covers a contended xtables lock and stays far inside the pod's grace.
const teardownDeadline = 5 * time.Second

func (d *Daemon) closeGroups() {
	for _, g := range d.groups {
		_ = g.Close()
	}
}

func joinAddrs(ips []netip.Addr, port int) string {
	s := make([]string, len(ips))
	for i, a := range ips {
		s[i] = netip.AddrPortFrom(a, uint16(port)).String()
	}
	return strings.Join(s, ",")
}

func kubeDNSString(c *config.Config) string {
	if c.LocalMode {
		return "none (local mode)"
	}
	return c.KubeDNS.String() + " from " + c.KubeDNSSource
}
