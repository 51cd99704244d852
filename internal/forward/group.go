package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Proto is how a group talks to its upstreams.
type Proto int

const (
	// UDP sends each query over UDP and re-asks over TCP (same server) when the answer is truncated.
	UDP Proto = iota
	// TCP sends every query over a pool of pipelined TCP connections per server.
	TCP
)

func (p Proto) String() string {
	switch p {
	case UDP:
		return "udp"
	case TCP:
		return "tcp"
	}
	return fmt.Sprintf("Proto(%d)", int(p))
}

// Defaults for zero GroupConfig fields.
const (
	// DefaultPoolSize: two connections keep queries flowing while one is recycled, and spread the
	// load over two in-order (miekg/dns-based) kube-dns workers.
	DefaultPoolSize = 2
	// DefaultMaxPerConn: enough pipelining for a burst of misses without one slow answer holding
	// up too many queries behind it in an in-order upstream.
	DefaultMaxPerConn = 100
	// DefaultMaxQueriesPerConn: recycle now and then so a connection does not stick to one
	// kube-dns endpoint forever behind a Service VIP (kube-proxy balances per connection).
	DefaultMaxQueriesPerConn = 10000
	// DefaultIdleTimeout: below CoreDNS's 10 s idle close, so we close first and never write
	// into a connection the server is closing.
	DefaultIdleTimeout = 5 * time.Second
	// DefaultTryTimeout: glibc waits 5 s per try and tries twice; 2 s leaves room for a second
	// try or the next server within the client's first wait.
	DefaultTryTimeout = 2 * time.Second
	// DefaultMaxInflight: past a thousand concurrent misses the upstream is already in trouble;
	// more waiting queries only add memory and latency, never answers. 1024, the same number as
	// the server's admission limit (the -max-inflight flag's default is this constant), so a
	// group is never the tighter bound by accident.
	DefaultMaxInflight = 1024
	// maxPasses: like glibc's attempts:2, go over the healthy servers at most twice, which also
	// rides out one lost UDP packet.
	maxPasses = 2
)

// GroupConfig configures a Group. Zero numeric fields take the Default* values.
type GroupConfig struct {
	Name              string           // "kube-dns", "node", "stub:example.com." — for metrics and logs
	Servers           []netip.AddrPort // in preference order (resolv.conf order for the node group)
	Proto             Proto
	PoolSize          int           // TCP: connections per server
	MaxPerConn        int           // TCP: outstanding queries per connection
	MaxQueriesPerConn int           // TCP: recycle a connection after this many queries
	IdleTimeout       time.Duration // TCP: close a connection idle this long
	TryTimeout        time.Duration // one try on one server (a UDP try includes its TCP re-ask)
	MaxInflight       int           // queries in flight in the group; past it Exchange fails with ErrOverloaded
	Logger            *slog.Logger  // nil: discard
	// Clock times tries, health probes and the dial backoff; nil: clock.Real. Socket I/O
	// deadlines (TCP idle close, write timeout) stay on the system clock.
	Clock clock.Clock

	// A Corefile forward's options (zero values: our defaults).
	MaxFails      int           // consecutive failures marking a server down (0: 3; <0: never, CoreDNS's max_fails 0)
	ProbeInterval time.Duration // first wait before probing a down server (0: 500 ms; CoreDNS's health_check)
	// ServerNames are TLS server names of single servers (CoreDNS's
	// tls://IP%NAME), over TLS's ServerName; with TLS only.
	ServerNames map[netip.AddrPort]string
	// FailoverRcodes: an answer whose rcode's bit (1<<rcode) is set moves on
	// to the next server like SERVFAIL and REFUSED (CoreDNS's failover); the
	// last one is returned when no server gives another.
	FailoverRcodes uint16
	// MaxTries caps the tries of one query that get no answer (a timeout,
	// a refused connection), over all servers (CoreDNS's
	// max_connect_attempts; an answer moved on by rcode does not count);
	// 0: the walk's two passes only.
	MaxTries int
	// RefuseOverload: a query past MaxInflight fails with an error that also
	// wraps wire.RcodeError(REFUSED), so its client gets REFUSED (CoreDNS's
	// max_concurrent); without it, SERVFAIL.
	RefuseOverload bool
	// ProbeName is the name a down server is probed for, "NAME IN NS" ("": the root;
	// CoreDNS's health_check ... domain NAME).
	ProbeName string
	// Spread starts each query at the next server in turn (CoreDNS's policy random or
	// round_robin) instead of the first healthy one in order (sequential).
	Spread bool
	// TLS, when set, makes the TCP connections DNS over TLS (RFC 7858) with this client
	// configuration (CoreDNS's tls:// upstreams, tls and tls_servername); Proto must be TCP.
	TLS *tls.Config
	// Plain are servers of a TLS group asked in plain DNS: a forward's
	// dns:// targets beside its tls:// ones (CoreDNS's transport is per
	// target), over UDP, or over TCP with PlainTCP (force_tcp). The
	// group's policy, failover, health and limits span both. Only with TLS.
	Plain    map[netip.AddrPort]bool
	PlainTCP bool
	// FailFast fails a query at once (ErrAllDown) when every server is marked down,
	// instead of asking one of them (CoreDNS's failfast_all_unhealthy_upstreams).
	FailFast bool
}

// Group forwards queries to a list of equivalent upstream servers with health tracking and
// failover. It is safe for concurrent use.
type Group struct {
	cfg  GroupConfig
	clk  clock.Clock
	name string
	obs  Observer
	log  *slog.Logger
	ups  []*upstream // GroupConfig.Servers: after the endpoints, the fallback
	// eps are the endpoints (SetEndpoints): asked first, each query starting at the next one in
	// turn (epTurn). Replaced whole; a walk keeps the list it began with.
	eps      atomic.Pointer[[]*upstream]
	epTurn   atomic.Uint32
	inflight atomic.Int64
	next     atomic.Uint32 // turns among the servers when all are down
	turn     atomic.Uint32 // GroupConfig.Spread: the next query's first server

	probeName []byte // cfg.ProbeName in wire form; nil: the root

	ctx    context.Context // cancelled by Close; parent of health probes
	cancel context.CancelFunc
	mu     sync.Mutex // orders probe start (wg.Add) against Close; guards retired, SetEndpoints
	wg     sync.WaitGroup
	// retired: endpoints removed whose pools may still hold connections (closed by Close).
	retired []*upstream
}

// upstream is one server of a group.
type upstream struct {
	addr  netip.AddrPort
	name  string
	tcp   *tcpPool // TCP groups only
	udp   *udpMux  // UDP groups only
	fails atomic.Int32
	down  atomic.Bool
	// answers counts the valid answers the server gave (probes included): a timeout counts
	// towards down only if the server answered nothing else while the try waited.
	answers atomic.Uint64
	probing atomic.Bool // a probe goroutine runs for it
	// gone: an endpoint SetEndpoints removed. It takes no new query, its probe ends, and its
	// pool closes its connections as their queries end (tcpPool.retire).
	gone atomic.Bool
}

// NewGroup validates cfg, fills in defaults and returns a group whose upstreams all start healthy.
// obs may be nil.
func NewGroup(cfg GroupConfig, obs Observer) (*Group, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("group %q: %w", cfg.Name, err)
	}
	cfg.setDefaults()
	if obs == nil {
		obs = nopObserver{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "forward", "group", cfg.Name)
	g := &Group{cfg: cfg, clk: clock.Or(cfg.Clock), name: cfg.Name, obs: obs, log: log}
	if cfg.ProbeName != "" {
		buf := make([]byte, 256)
		n, err := dns.PackDomainName(dns.Fqdn(cfg.ProbeName), buf, 0, nil, false)
		if err != nil {
			return nil, fmt.Errorf("group %q: probe name %q: %w", cfg.Name, cfg.ProbeName, err)
		}
		g.probeName = buf[:n]
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	for _, a := range cfg.Servers {
		u := &upstream{addr: a, name: a.String()}
		switch plain := cfg.TLS != nil && cfg.Plain[a]; {
		case cfg.Proto == TCP && !(plain && !cfg.PlainTCP):
			u.tcp = newTCPPool(a, &g.cfg, g.clk, obs, log)
			if plain {
				u.tcp.tls = nil // a plain server of a TLS group, with force_tcp
			} else if n := cfg.ServerNames[a]; n != "" && cfg.TLS != nil {
				u.tcp.tls = cfg.TLS.Clone()
				u.tcp.tls.ServerName = n
			}
		default: // a UDP group, or a plain server of a TLS group
			u.udp = newUDPMux(&g.cfg, u.name, g.clk, obs, log)
		}
		g.ups = append(g.ups, u)
		obs.Health(g.name, u.name, true)
	}
	return g, nil
}

func (c *GroupConfig) validate() error {
	if c.Name == "" {
		return errors.New("empty name")
	}
	if len(c.Servers) == 0 {
		return errors.New("no servers")
	}
	for _, s := range c.Servers {
		if !s.IsValid() || s.Port() == 0 {
			return fmt.Errorf("invalid server address %q", s)
		}
	}
	if c.Proto != UDP && c.Proto != TCP {
		return fmt.Errorf("unknown protocol %v", c.Proto)
	}
	if c.TLS != nil && c.Proto != TCP {
		return errors.New("TLS needs the TCP protocol")
	}
	if len(c.Plain) > 0 && c.TLS == nil {
		return errors.New("plain servers are for a TLS group")
	}
	if c.ProbeName != "" {
		if _, ok := dns.IsDomainName(c.ProbeName); !ok {
			return fmt.Errorf("invalid probe name %q", c.ProbeName)
		}
	}
	if c.PoolSize < 0 || c.MaxPerConn < 0 || c.MaxQueriesPerConn < 0 || c.MaxInflight < 0 ||
		c.IdleTimeout < 0 || c.TryTimeout < 0 {
		return errors.New("negative limit or timeout")
	}
	return nil
}

func (c *GroupConfig) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.PoolSize, DefaultPoolSize)
	def(&c.MaxPerConn, DefaultMaxPerConn)
	def(&c.MaxQueriesPerConn, DefaultMaxQueriesPerConn)
	def(&c.MaxInflight, DefaultMaxInflight)
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.TryTimeout == 0 {
		c.TryTimeout = DefaultTryTimeout
	}
	if c.MaxFails == 0 {
		c.MaxFails = maxFails
	}
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = probeInterval
	}
	c.Servers = append([]netip.AddrPort(nil), c.Servers...)
}

// Name returns the group's name.
func (g *Group) Name() string { return g.name }

// Exchange sends query (wire format, one question) and returns the validated answer in wire
// format with the caller's ID. The query is not modified; the answer is a new slice.
//
// Healthy servers are tried in order, each for at most TryTimeout, within ctx; the list is gone
// through at most twice. An answer with SERVFAIL or REFUSED is returned only if no later healthy
// server gives another. When every server is marked down, one of them (in turn) is still tried
// once, so a down-marking never fails a query with nothing sent; a TCP upstream whose dial is
// held back after failures fails at once.
func (g *Group) Exchange(ctx context.Context, query []byte) ([]byte, error) {
	q, err := g.enter(query)
	if err != nil {
		return nil, err
	}
	defer g.leave()
	var w walk
	g.begin(&w)
	ans, err := g.walk(ctx, query, q, &w)
	if err != nil {
		return nil, err
	}
	return ans, nil
}

// enter admits a query (Exchange's, ExchangeAsync's): the group is open, the query parses,
// and it is counted in flight within MaxInflight. The caller calls leave once it ends.
func (g *Group) enter(query []byte) (question, error) {
	if g.ctx.Err() != nil {
		return question{}, fmt.Errorf("group %s: %w", g.name, ErrClosed)
	}
	q, err := parseQuery(query)
	if err != nil {
		return question{}, fmt.Errorf("group %s: %w", g.name, err)
	}
	if g.inflight.Add(1) > int64(g.cfg.MaxInflight) {
		g.inflight.Add(-1)
		g.obs.Failure(g.name, "", KindOverloaded)
		if g.cfg.RefuseOverload {
			return question{}, fmt.Errorf("group %s: %w (%d, max_concurrent): %w", g.name, ErrOverloaded, g.cfg.MaxInflight, wire.RcodeError(wire.RcodeRefused))
		}
		return question{}, fmt.Errorf("group %s: %w (%d)", g.name, ErrOverloaded, g.cfg.MaxInflight)
	}
	g.obs.Inflight(g.name, 1)
	return q, nil
}

// leave ends what enter counted.
func (g *Group) leave() {
	g.inflight.Add(-1)
	g.obs.Inflight(g.name, -1)
}

// walk is one query's way through the group's servers: healthy ones in order (from a turning
// start with Spread), at most maxPasses times, with the one try on a down server when every
// server is down. Exchange goes through it in one goroutine; ExchangeAsync makes its first try
// without one and hands the rest of the walk to a goroutine only when that try did not answer.
type walk struct {
	eps            []*upstream // the endpoints when the walk began (asked before g.ups)
	epStart        int         // the endpoint the passes start at
	pass, start, k int         // pass number, its first server, the next position in it
	tried          int         // servers tried in this pass
	failedTries    int         // tries that got no answer, in every pass (GroupConfig.MaxTries)
	allDown        bool
	last           int // position (in the pass) of the server tried last; -1: the all-down try
	fallback       []byte
	lastErr        error
}

// begin starts w's first pass.
func (g *Group) begin(w *walk) {
	*w = walk{}
	w.start = g.passStart()
	if eps := g.eps.Load(); eps != nil && len(*eps) > 0 {
		w.eps = *eps
		w.epStart = int(g.epTurn.Add(1)-1) % len(w.eps)
	}
}

// at is the server at position k of w's pass: the endpoints first, from the one in turn, then
// the configured servers from the pass's start.
func (g *Group) at(w *walk, k int) *upstream {
	if m := len(w.eps); k < m {
		return w.eps[(w.epStart+k)%m]
	}
	k -= len(w.eps)
	return g.ups[(w.start+k)%len(g.ups)]
}

// passStart is the first server of a pass.
func (g *Group) passStart() int {
	if n := len(g.ups); g.cfg.Spread && n > 1 {
		return int(g.turn.Add(1)-1) % n
	}
	return 0
}

// nextServer returns the server w tries next, or nil when the walk is over (its result is then
// end's).
func (g *Group) nextServer(w *walk) *upstream {
	n := len(w.eps) + len(g.ups)
	for w.pass < maxPasses && !w.allDown {
		if g.cfg.MaxTries > 0 && w.failedTries >= g.cfg.MaxTries {
			return nil
		}
		for w.k < n {
			k := w.k
			w.k++
			if u := g.at(w, k); !u.down.Load() && !u.gone.Load() {
				w.tried++
				w.last = k
				return u
			}
		}
		if w.fallback != nil {
			return nil
		}
		if w.tried == 0 {
			if w.pass > 0 {
				return nil
			}
			// Every server is marked down. Failing with nothing sent would make the
			// down-marking an outage of its own; ask one, in turn, once (unless
			// FailFast: the operator asked for exactly that outage).
			if g.cfg.FailFast {
				w.lastErr = ErrAllDown
				return nil
			}
			w.allDown, w.last = true, -1
			return g.at(w, int(g.next.Add(1)-1)%n)
		}
		w.pass++
		w.k, w.tried = 0, 0
		w.start = g.passStart()
	}
	return nil
}

// take handles the result of the try nextServer chose last: final reports that the walk is
// over with ans (the caller's ID set) or err.
func (g *Group) take(w *walk, q question, ans []byte, err error) (final bool, _ []byte, _ error) {
	if err != nil {
		if errors.Is(err, errAbandoned) {
			return true, nil, fmt.Errorf("group %s: %w", g.name, err)
		}
		w.lastErr = err
		w.failedTries++
		if w.allDown {
			return true, nil, g.noAnswer(w, nil)
		}
		return false, nil, nil
	}
	if rc := wire.Rcode(ans); !w.allDown && (rc == wire.RcodeServFail || rc == wire.RcodeRefused || g.cfg.FailoverRcodes&(1<<(rc&0xF)) != 0) &&
		g.healthyAfter(w, w.last) {
		w.fallback = ans
		return false, nil, nil
	}
	wire.SetID(ans, q.id)
	return true, ans, nil
}

// end is the walk's result once nextServer has nothing more: the SERVFAIL or REFUSED kept as
// fallback, or the error.
func (g *Group) end(w *walk, q question, ctxErr error) ([]byte, error) {
	if w.fallback != nil {
		wire.SetID(w.fallback, q.id)
		return w.fallback, nil
	}
	return nil, g.noAnswer(w, ctxErr)
}

func (g *Group) noAnswer(w *walk, ctxErr error) error {
	lastErr := w.lastErr
	if lastErr == nil {
		lastErr = ctxErr
	}
	return fmt.Errorf("group %s: %w: %w", g.name, ErrNoAnswer, lastErr)
}

// walk tries servers until one answers or the walk is over, within ctx.
func (g *Group) walk(ctx context.Context, query []byte, q question, w *walk) ([]byte, error) {
	for ctx.Err() == nil {
		u := g.nextServer(w)
		if u == nil {
			break
		}
		ans, err := g.attempt(ctx, u, query, q)
		if final, ans, err := g.take(w, q, ans, err); final {
			return ans, err
		}
	}
	return g.end(w, q, ctx.Err())
}

// errAbandoned marks a try that ended for a reason that is not the upstream's fault: the caller
// cancelled, or the group closed.
var errAbandoned = errors.New("abandoned")

// attempt is one try on u with its accounting: the Observer hears of the answer or the
// failure, and u's health follows.
func (g *Group) attempt(ctx context.Context, u *upstream, query []byte, q question) ([]byte, error) {
	seen := u.answers.Load()
	start := g.clk.Now()
	var ans []byte
	var err error
	if u.down.Load() && u.tcp != nil {
		err = u.tcp.heldBack() // a down upstream's pool that may not dial yet: fail at once
	}
	if err == nil {
		ans, err = g.try(ctx, u, query, q, false)
		if t := tapperOf(ctx); t != nil && !errors.Is(err, errRetired) {
			t.Tried(u.name, g.cfg.Proto == TCP, start, query, ans)
		}
	}
	if err != nil {
		if errors.Is(err, errRetired) {
			return nil, err // taken out meanwhile: not its failure, the walk moves on
		}
		if errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, ErrClosed) {
			return nil, fmt.Errorf("%w: %w", errAbandoned, err)
		}
		kind := failureKind(err)
		if !u.gone.Load() { // a removed endpoint's series are gone (Remover)
			g.obs.Failure(g.name, u.name, kind)
		}
		g.failed(u, kind, seen)
		return nil, err
	}
	if !u.gone.Load() {
		g.obs.Exchange(g.name, u.name, wire.Rcode(ans), g.clk.Now().Sub(start))
	}
	g.answered(u)
	return ans, nil
}

// errTryTimeout is the cause of a try's context ending after TryTimeout.
var errTryTimeout = fmt.Errorf("try timed out: %w", context.DeadlineExceeded)

// try is one attempt on one server, bounded by TryTimeout. The answer keeps the wire ID. A
// probe of a TCP upstream uses a connection of its own, never a pooled one.
func (g *Group) try(ctx context.Context, u *upstream, query []byte, q question, probe bool) ([]byte, error) {
	if u.tcp != nil {
		if !probe {
			return u.tcp.exchange(ctx, query, q) // bounded by the pool's try timer
		}
		tctx, cancel, timer := g.tryContext(ctx)
		defer release(cancel, timer)
		return exchangeTCPOnce(tctx, u.name, u.tcp.tls, query, q) // over TLS to a tls:// server
	}
	// UDP: the try is bounded by a recycled timer of the upstream's sockets (see
	// udpMux.exchange), without a context of its own (5 allocations per miss).
	ans, err := g.exchangeUDP(ctx, u, query, q)
	if !reaskOverTCP(ans, err) {
		return ans, err
	}
	// Truncated, or larger than the size we advertised: the full answer over TCP from the
	// same server, with a try of its own.
	tctx, cancel, timer := g.tryContext(ctx)
	defer release(cancel, timer)
	return exchangeTCPOnce(tctx, u.name, nil, query, q)
}

// tryContext returns ctx bounded by TryTimeout on the group's clock (its cause then
// errTryTimeout), with what release needs to free it. When the caller's deadline comes first,
// ctx is used as is (cancel and timer nil): a context of its own costs a timer and
// allocations on every miss.
func (g *Group) tryContext(ctx context.Context) (context.Context, context.CancelCauseFunc, clock.Timer) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= g.cfg.TryTimeout {
		return ctx, nil, nil
	}
	tctx, cancel := context.WithCancelCause(ctx)
	t := g.clk.AfterFunc(g.cfg.TryTimeout, func() { cancel(errTryTimeout) })
	return tctx, cancel, t
}

// release frees what tryContext made.
func release(cancel context.CancelCauseFunc, t clock.Timer) {
	if t != nil {
		t.Stop()
		cancel(context.Canceled)
	}
}

// healthyAfter reports whether a server after the k-th of w's pass is up.
func (g *Group) healthyAfter(w *walk, k int) bool {
	for j := k + 1; j < len(w.eps)+len(g.ups); j++ {
		if u := g.at(w, j); !u.down.Load() && !u.gone.Load() {
			return true
		}
	}
	return false
}

// Close stops health probes, closes every connection and fails queries in flight with ErrClosed.
// It waits for the probes and the connections' read and write loops to end. An ExchangeAsync
// that goes on in a goroutine of its own (a retry, a dial, a TCP re-ask) is not waited for: it
// ends within its deadline (a try on a closed pool fails at once with ErrClosed) and calls Done
// after Close returns.
func (g *Group) Close() error {
	g.mu.Lock()
	g.cancel()
	g.mu.Unlock()
	g.wg.Wait()
	g.mu.Lock()
	ups := append(append([]*upstream(nil), g.ups...), g.retired...)
	if eps := g.eps.Load(); eps != nil {
		ups = append(ups, *eps...)
	}
	g.retired = nil
	g.mu.Unlock()
	for _, u := range ups {
		if u.tcp != nil {
			u.tcp.close()
		}
		if u.udp != nil {
			u.udp.close()
		}
	}
	return nil
}
