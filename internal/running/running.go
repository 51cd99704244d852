// Package running is the configuration the daemon serves by, compiled and
// kept current while it runs: the forward groups and their routes (the
// flags' kube-dns and resolv.conf, the kube-dns ConfigMap's stub domains,
// the Corefile's forward blocks), each view's block table (internal/blocks:
// cache policy, directive chain, forward group, refusal, per zone), the
// resolvers that serve by those tables, and the reload of all of it when
// resolv.conf, the ConfigMap or the Corefile changes (reload.go,
// corefile.go: an edit applies whole or not at all).
//
// It decides no name's fate on the hot path itself: a query's block is
// looked up once, when it arrives, in its view's internal/blocks table
// (the resolver's BlockFunc), and the block carries the rest. It
// opens no listening socket (internal/server does, and is handed the
// resolvers with Attach) and knows nothing of the node, twins or HTTP
// (internal/daemon's lifecycle).
//
// One writer: New until the daemon starts, then the watch goroutine Start
// runs; the serving loops read only the tables, through one pointer: a
// reload publishes one snapshot (its views, routes and tables) in one
// store (publish), so no query sees half of an edit.
package running

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sync/atomic"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/metrics"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Reverse zones answered by kube-dns (pod and service PTR records).
var reverseZones = []string{"in-addr.arpa.", "ip6.arpa."}

// Env is what the running configuration uses besides the Config.
type Env struct {
	Log     *slog.Logger
	Clock   clock.Clock // clock.Real when nil
	Metrics *metrics.Metrics
	Cache   *cache.Cache
	// QueryLogOut gets the Corefile's log lines (os.Stdout when nil, as
	// CoreDNS writes them).
	QueryLogOut io.Writer
}

// State is the running configuration of one daemon.
type State struct {
	cfg     *config.Config
	log     *slog.Logger
	clock   clock.Clock
	Metrics *metrics.Metrics
	Cache   *cache.Cache
	Server  *server.Server   // set by Attach
	groups  []*forward.Group // live groups, kept by reload.go
	reload  reloader
	// routes is the shared route table (reload.go's apply), compiled into
	// every view's blocks; metricZones the CoreDNS metric zones (the
	// server's CoreDNSZones), fixed at start. Owned like reload's state.
	routes      []forward.Route
	metricZones []string

	// pub is the snapshot serving now (blocks.go): every view's blocks,
	// published whole with one store by publish. lookups counts the
	// lookups in it (tests: CountLookupsForTest).
	pub     atomic.Pointer[snapshot]
	lookups atomic.Pointer[atomic.Int64]
	// The shared view's sources (blocks.go), owned like reload's state.
	sharedPol     sharedPolicy
	policyDefault resolve.Policy
	// The Corefile's fetch-side directives (chain.go): nil without them.
	chain     atomic.Pointer[blocks.Chains]
	chainNext resolve.FetchFunc
	// The Corefile's views (views.go), owned like reload's state; res0 is
	// the resolver of the one-view case (the shared view), also
	// autopath's.
	views     *viewSet
	viewChain atomic.Pointer[blocks.Chains]
	res0      *resolve.Resolver
	// nodeV is -node-listen's resolver (node.go), nil without it;
	// nodeRoute its group, compiled into its table (owned like routes).
	nodeV         *nodeView
	nodeRoute     *forward.Group
	nodeResolvers atomic.Pointer[[]netip.AddrPort] // resolv.conf's servers as applied
	// The blocks the cache tags name now (coredns.go), swapped with the
	// policies.
	cacheBlocks atomic.Pointer[[]metrics.CacheBlock]
	// The answer-side handlers of the Corefile serving (blocks.go): its
	// blocks' chains, the shared resources they asked for (round), all
	// resources open (res), and where log lines go (Env.QueryLogOut).
	answers     map[*corefile.Server]*answer.Chain
	round       *round
	res         resources
	queryLogOut io.Writer
	// reloadFault, when set (tests), fails a Corefile edit half-way through
	// its rebuild: after views, policies and chains are built, before the
	// groups (corefile.go).
	reloadFault atomic.Pointer[func() error]
	// kubeHook, when set (SetKubeGroupHook, before Start), is told of each
	// kube-dns group a Corefile edit puts in place of the last.
	kubeHook func(g *forward.Group, addr netip.AddrPort)
}

// KubeGroup is the kube-dns group (nil: none). The reload goroutine owns
// it: call before Start, or where no Corefile edit can replace it (tests).
func (d *State) KubeGroup() *forward.Group { return d.reload.kube }

// SetKubeGroupHook sets the function told of each kube-dns group that
// replaces the last, with its address (the daemon hands it kube-dns' pods:
// internal/endpoints). Call before Start.
func (d *State) SetKubeGroupHook(f func(g *forward.Group, addr netip.AddrPort)) { d.kubeHook = f }

// New builds the groups, the block tables and the resolvers from cfg. It
// opens upstream sockets only (the groups'); on error it closes them.
func New(cfg *config.Config, env Env) (d *State, err error) {
	d = &State{cfg: cfg, log: env.Log, clock: clock.Or(env.Clock), Metrics: env.Metrics, Cache: env.Cache, queryLogOut: env.QueryLogOut}
	if d.queryLogOut == nil {
		d.queryLogOut = os.Stdout
	}
	// Groups and routes: kube-dns, resolv.conf, the kube-dns ConfigMap (reload.go).
	if err := d.buildRoutes(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.Close()
			d = nil
		}
	}()
	if err := d.initPolicies(); err != nil {
		return nil, err
	}
	cb := coreDNSCacheBlocks(cfg)
	d.cacheBlocks.Store(&cb)
	for _, z := range CoreDNSZones(CoreDNSBlocks(cfg)) {
		d.metricZones = append(d.metricZones, z.Name)
	}
	if err := d.initChain(d.forwardIn(-1)); err != nil {
		return nil, err
	}
	d.res0, err = d.newResolver(-1)
	if err != nil {
		return nil, err
	}
	// Blocks seen from some addresses answer otherwise (views.go).
	if d.views, err = d.newViews(cfg, cfg.DropIn.Corefile, cfg.Sockets(), d.answers); err != nil {
		return nil, err
	}
	if err := d.newNodeView(); err != nil { // node.go: -node-listen's
		return nil, err
	}
	return d, d.publish()
}

// initPolicies builds the shared view's cache policies and answer-side
// handlers: the flags' (the cluster domain's caps, -last-known-good's
// zones) or each Corefile block's.
func (d *State) initPolicies() error {
	cfg := d.cfg
	pol := func(ttl cache.Policy) resolve.Policy {
		return resolve.Policy{
			TTL:                ttl,
			ServFailTTL:        cfg.Cache.ServFailTTL,
			StaleWindow:        cfg.Cache.StaleWindow,
			StaleClientTimeout: cfg.Cache.StaleClientTimeout,
			StaleRecheck:       cfg.Cache.StaleRecheck,
		}
	}
	defTTL, flagZones := cfg.FlagPolicies()
	var zones []resolve.Zone
	for _, z := range flagZones {
		zones = append(zones, resolve.Zone{Name: z.Name, Policy: pol(z.TTL)})
	}
	if cc := cfg.DropIn.Corefile; cc != nil && len(cc.ZonePolicies) > 0 {
		zones = corefileZones(cc.ZonePolicies) // each block's cache settings for its zones
	}
	d.policyDefault = pol(defTTL)
	policy, err := resolve.Zones(d.policyDefault, zones...)
	if err != nil {
		return err
	}
	d.sharedPol = sharedPolicy{pol: policy.Policies()}
	for _, z := range zones {
		d.sharedPol.zones = append(d.sharedPol.zones, z.Name)
	}
	if cc := cfg.DropIn.Corefile; cc != nil {
		d.round = &round{}
		if d.answers, err = d.answerChains(cc.Servers, d.round); err != nil {
			return err
		}
		d.sharedPol.answers = blockAnswers(cc.Servers, d.answers, firstBlock(cc.Servers))
	}
	return nil
}

// newResolver is the resolver of view vi (-1: the shared view), finding
// its blocks in the snapshot published now.
func (d *State) newResolver(vi int) (*resolve.Resolver, error) {
	return resolve.New(resolve.Config{
		Cache:        d.Cache,
		Fetch:        d.forwardIn(vi), // blocks without a forwarder: none (every block fetches by its Route)
		Blocks:       d.blocksIn(vi),
		Clock:        d.clock,
		FetchTimeout: d.cfg.ForwardTimeout,
		UDPSize:      uint16(d.cfg.MaxUDPSize),
		MaxFlights:   d.cfg.MaxInflight,
		Logger:       d.log.With("component", "cache"),
	})
}

// Stats is the answer-side handlers' counters and bounds of key (trace's,
// dnstap's: answer.Env.Stats), kept for the State's life; nil when no
// handler made them. The metrics read them (metrics.SetHandlerStats).
func (d *State) Stats(key string) any { return d.res.stat(key) }

// Resolver is the shared view's resolver (the one view's, and autopath's).
func (d *State) Resolver() *resolve.Resolver { return d.res0 }

// Attach makes srv answer by the views (before it serves).
func (d *State) Attach(srv *server.Server) error {
	d.Server = srv
	if _, err := d.useViews(d.views); err != nil {
		return err
	}
	if cc := d.cfg.DropIn.Corefile; cc != nil {
		srv.SetRecordAskers(blocks.UsesRemote(cc.Servers)) // a template uses .Remote
	}
	return nil
}

// Start watches resolv.conf, the ConfigMap directory and the Corefile, and
// applies their changes until Stop.
func (d *State) Start() { d.startReload() }

// Stop stops the watch and closes the retired groups; the live ones stay
// open until Close.
func (d *State) Stop() { d.stopReload() }

// Close closes the live groups. After Stop: no reload may change them
// after.
func (d *State) Close() {
	d.res.keepOnly(nil) // the handlers' taps and exporters
	for _, g := range d.groups {
		_ = g.Close()
	}
	if d.views != nil {
		for _, g := range d.views.groups {
			_ = g.Close()
		}
	}
	for _, g := range d.chain.Load().Groups() { // the blocks' further forwards
		_ = g.Close()
	}
}

// SetReloadFaultForTest makes every Corefile edit fail half-way through
// its rebuild with f's error (nil f: no fault).
func (d *State) SetReloadFaultForTest(f func() error) {
	if f == nil {
		d.reloadFault.Store(nil)
		return
	}
	d.reloadFault.Store(&f)
}

// GroupFor is the group the shared view forwards name to now (tests).
func (d *State) GroupFor(name string) *forward.Group {
	w, _ := wire.AppendNameWire(nil, name)
	return d.pub.Load().shared.Lookup(w).Group
}
