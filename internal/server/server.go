// Package server owns the DNS listeners: several SO_REUSEPORT UDP sockets
// per address read in batches (recvmmsg) and answered from the cache on the
// reading goroutine, TCP with several queries per connection answered as
// they complete, admission (a bound on concurrent misses and on TCP
// connections), EDNS, and truncation to the client's payload size.
//
// It knows nothing about upstreams or cache policy: it looks a query's
// block up once, right after parsing it (the Resolver's BlockFunc: a zone
// table, a cost of the name's labels), and hands the block on; a hit is
// the Resolver's Hit, a miss its Start (one miss path for UDP and TCP, miss.go: no
// goroutine waits for it, the answer is written by whoever learns it) or,
// for what Start leaves to a blocking path, its Resolve in a miss worker;
// the server writes the entry it gets. Every answer, a hit's over UDP or
// TCP or a miss's, then goes through its block's answer-side handlers
// (answer.Chain: log, dnstap, trace, loadbalance, rewrite's ttl and rcode,
// whoami) in one sequence (chain.go); the server imports none of them.
//
// Lifecycle (lifecycle.go): Files and Adopt hand the listening sockets to a
// twin instance, so what is queued in them survives this server; Shutdown
// stops the loops before it closes anything and drains TCP; CheckLoops
// tells a waiting loop from a wedged one for health checks.
//
// A panic in the serving path never ends the process (guard.go): where an
// answer is still owed it is recovered, reported to internal/panics and
// answered SERVFAIL, and the loops go on.
package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Config configures a Server. Zero fields take the defaults of package
// config (the flags' defaults), so a default lives in one place.
type Config struct {
	Addrs []netip.Addr
	Port  int
	// Ports, when set, is the port of each Addrs[i] (0: Port): a Corefile's
	// blocks on several ports listen on an address once per port, each
	// socket with its own index (its view, its CoreDNS server label).
	Ports []int
	// UDPSockets is the number of SO_REUSEPORT sockets per address; 0
	// means GOMAXPROCS, so every core can read its own socket.
	UDPSockets int
	// Resolver answers hits and misses (cache, coalescing, serve-stale,
	// admission of distinct questions).
	Resolver *resolve.Resolver
	// Views, when set, answer the queries of each view instead (views.go;
	// Views[0] is Resolver): a query arriving on Addrs[i] is answered by
	// Views[AddrViews[i]] with wire.Query.View set to that index (the
	// Corefile's blocks seen from the address; config.View). SetViews
	// replaces them.
	Views     []*resolve.Resolver
	AddrViews []uint8
	// Clock is the time source for TTLs and the server's timers (nil:
	// clock.Real). Socket deadlines are the kernel's and use real time.
	Clock clock.Clock
	// MaxUDPSize caps the payload size answered over UDP and advertised in
	// OPT records, to upstreams and to clients (default
	// DefaultMaxUDPSize).
	MaxUDPSize uint16
	// MaxClientUDPSize caps a UDP answer to a client that advertises a
	// larger EDNS size (default DefaultMaxClientUDPSize: the
	// pod-to-node link has no path MTU to fear; docs/design.md, "UDP
	// sizes"). Clients without EDNS get 512.
	MaxClientUDPSize uint16
	// MaxWaiting bounds the clients waiting for a miss, all questions
	// together, so memory stays bounded whatever the clients do (default
	// DefaultMaxWaiting), apportioned by client address (package fair);
	// past it, or past its client's share, a miss gets its stale answer
	// or SERVFAIL at once and is counted as rejected. The bound on
	// distinct questions is the Resolver's.
	MaxWaiting int
	// TCPIdleTimeout closes a TCP connection with no query for this long;
	// TCPReadTimeout bounds reading one query once it has started;
	// MaxTCPConns bounds open TCP connections; MaxTCPPipeline bounds the
	// misses outstanding on one connection (defaults: Default*, defaults.go).
	TCPIdleTimeout time.Duration
	TCPReadTimeout time.Duration
	// TCPWriteTimeout bounds writing answers to a TCP client (default
	// TCPReadTimeout).
	TCPWriteTimeout time.Duration
	// TCPMaxQueries closes a client TCP connection after this many
	// queries, once their answers are written (the Corefile's timeouts
	// maxtcpqueries, as CoreDNS's); 0 or -1: unlimited.
	TCPMaxQueries  int
	MaxTCPConns    int
	MaxTCPPipeline int
	Logger         *slog.Logger
	// QueryLog, when set, gets one line per answered query (client, name,
	// type, rcode, duration, cache hit, stale or miss); nil costs nothing.
	QueryLog *slog.Logger
	// CoreDNSZones are the Corefile zones whose queries count under
	// CoreDNS's metric names (the blocks with a prometheus directive);
	// nil counts none (stats.go). A query counts under its block's
	// (resolve.Block.Metric: an index here).
	CoreDNSZones []CDZone
	// Autopath, when set, answers pods' search-path queries (autopath.go);
	// nil costs one comparison per query.
	Autopath Autopath
	// Clients maps a client's address to its key in every bound's shares
	// and in the cache (package fair: loopback and the node's own
	// addresses are the node, by source port); nil: every address is its
	// own client.
	Clients *fair.Clients
}

func (c *Config) setDefaults() {
	if c.UDPSockets <= 0 {
		c.UDPSockets = runtime.GOMAXPROCS(0)
	}
	if c.MaxUDPSize < wire.MinUDPSize {
		c.MaxUDPSize = DefaultMaxUDPSize
	}
	if c.MaxClientUDPSize < wire.MinUDPSize {
		c.MaxClientUDPSize = DefaultMaxClientUDPSize
	}
	if c.MaxWaiting <= 0 {
		c.MaxWaiting = DefaultMaxWaiting
	}
	if c.TCPIdleTimeout <= 0 {
		c.TCPIdleTimeout = DefaultTCPIdleTimeout
	}
	if c.TCPReadTimeout <= 0 {
		c.TCPReadTimeout = DefaultTCPReadTimeout
	}
	if c.TCPWriteTimeout <= 0 {
		c.TCPWriteTimeout = c.TCPReadTimeout
	}
	if c.MaxTCPConns <= 0 {
		c.MaxTCPConns = DefaultMaxTCPConns
	}
	if c.MaxTCPPipeline <= 0 {
		c.MaxTCPPipeline = DefaultMaxTCPPipeline
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server answers DNS queries on UDP and TCP.
type Server struct {
	cfg   Config
	res   *resolve.Resolver
	views atomic.Pointer[viewTable] // views.go
	// The resolvers whose counters Snapshot sums (under mu): those of the
	// current views and those the last SetViews replaced (misses may still
	// finish on them). One generation later a replaced resolver's counts
	// move into retired and it is let go, so counters never go back and
	// reloads keep nothing alive.
	allRes  []*resolve.Resolver
	retired Counters
	// waiting: the clients waiting for a miss, by client (package fair),
	// at most MaxWaiting; under waitMu.
	waitMu  sync.Mutex
	waiting *fair.Shares
	stats   Stats
	// CoreDNS-named counters (stats.go): cd is shared by TCP and the miss
	// path; each UDP loop has its own (udpListener.cd).
	cd  *cdCounters
	cdz cdZones

	mu    sync.Mutex
	udp   []*udpListener
	procs int // Ps reserved for the receive loops (reserveProcs)
	tcp   []*tcpListener
	conns map[net.Conn]*tcpConn
	// tcpShares: the open connections by client, at most MaxTCPConns.
	tcpShares *fair.Shares
	// tcpOut: KiB of miss answers being written to TCP clients, by
	// client, at most MaxTCPAnswerBytes (deliverTCP); under tcpOutMu.
	tcpOutMu sync.Mutex
	tcpOut   *fair.Shares
	closing  atomic.Bool
	serving  atomic.Bool
	wg       sync.WaitGroup // serving goroutines
	missWG   sync.WaitGroup // miss workers
	// missQ hands a miss to an idle miss worker (unbuffered: taken only by
	// one waiting for it); missStop, closed at shutdown, ends idle ones.
	missQ    chan *missReq
	missStop chan struct{}
	stopOnce sync.Once
	// Sockets handed over by a twin (Adopt), used by Listen.
	adoptedUDP map[netip.AddrPort][]*udpListener
	adoptedTCP map[netip.AddrPort]*tcpListener
	// askers: record each query's client address in wire.Query.From
	// (SetRecordAskers), for what a fetch needs it for.
	askers atomic.Bool
}

// SetRecordAskers turns on or off recording the client's address in each
// query (wire.Query.From), which a fetch sees as resolve.Asker: the
// Corefile's templates that use .Remote need it. Off, it costs one atomic
// load per UDP batch and per TCP query.
func (s *Server) SetRecordAskers(on bool) { s.askers.Store(on) }

// New checks cfg and returns a server that is not yet listening.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if cfg.Resolver == nil {
		return nil, errors.New("server: Resolver is required")
	}
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("server: no listen address")
	}
	if cfg.Ports != nil {
		if len(cfg.Ports) != len(cfg.Addrs) {
			return nil, errors.New("server: Ports must give one port per address")
		}
		seen := map[netip.AddrPort]bool{}
		for i, a := range cfg.Addrs {
			if p := cfg.Ports[i]; p < 0 || p > 65535 {
				return nil, fmt.Errorf("server: port %d of %s", p, a)
			}
			ap := sockKey(netip.AddrPortFrom(a, uint16(cfg.port(i))))
			if seen[ap] {
				return nil, fmt.Errorf("server: %s listed twice", ap)
			}
			seen[ap] = true
		}
	}
	if len(cfg.Views) > 0 && cfg.Views[0] != cfg.Resolver {
		return nil, errors.New("server: Views[0] must be Resolver")
	}
	s := &Server{
		cfg:       cfg,
		res:       cfg.Resolver,
		waiting:   fair.New(cfg.MaxWaiting),
		missQ:     make(chan *missReq),
		missStop:  make(chan struct{}),
		conns:     make(map[net.Conn]*tcpConn),
		tcpShares: fair.New(cfg.MaxTCPConns),
		tcpOut:    fair.New(MaxTCPAnswerBytes >> 10),
	}
	if len(cfg.CoreDNSZones) > 0 {
		s.cdz = cdZones{zones: cfg.CoreDNSZones, n: len(cfg.CoreDNSZones) + 1}
		s.cd = newCDCounters(len(cfg.Addrs), s.cdz.n, false)
	}
	views := cfg.Views
	if len(views) == 0 {
		views = []*resolve.Resolver{cfg.Resolver}
	}
	if err := s.SetViews(views, cfg.AddrViews); err != nil {
		return nil, err
	}
	return s, nil
}

// Result of answering a query from what is at hand.
type verdict int

const (
	answered verdict = iota // out holds the response
	dropped                 // send nothing
	miss                    // must be resolved upstream
)

// request is one query answered from what is at hand (answerLocal): what
// its transport sets once per receive loop or connection (tcp, st, cd,
// and over TCP the client and local addresses) and per query (raw, t,
// now, from, and over UDP the client's sockaddr). answerLocal parses raw
// into q, finds its block once (blk, in the view's resolver res) and sets
// k, which the rest of its answer's way counts it in.
type request struct {
	raw []byte
	q   wire.Query
	t   time.Time // when it arrived
	now int64     // t in unix ns
	// from is the client's address when askers are recorded
	// (SetRecordAskers), else zero; owner is the client as the cache
	// counts its clients (wire.Query.Client on a hit: hitKey).
	from, owner netip.Addr
	tcp         bool
	st          *Stats
	cd          cdObserver
	k           cdKey
	// res is the resolver of the query's view and blk its block (nil: no
	// block: a malformed query, the health name), found once, right after
	// parsing; depth is how many of blk.Answer's handlers let the query
	// pass (answer.Chain.Query): theirs see its answer.
	res   *resolve.Resolver
	blk   *resolve.Block
	depth int
	// a is what blk.Answer's handlers see, filled only when it has some.
	a answer.Request
	// sa is a UDP client's raw sockaddr and local the address its query
	// came to; over TCP client and local are the connection's.
	sa     []byte
	client netip.AddrPort
	local  netip.Addr
	// wild: the query came to a wildcard socket, whose address says
	// nothing of its family; v6 is then the client's (CoreDNS's family
	// label).
	wild, v6 bool
}

// clientAddr is the client's address and port.
func (r *request) clientAddr() netip.AddrPort {
	if r.tcp {
		return r.client
	}
	return sockaddrAddrPort(r.sa)
}

// cdObserver counts queries under CoreDNS's metric names as arriving on
// server index srv (stats.go); a nil c counts nothing. A UDP loop's
// durations are added per batch (cdCounters.flush), TCP's here.
type cdObserver struct {
	c   *cdCounters
	srv int
}

// answerLocal appends to out the response to r when it can be given
// without an upstream: a cache hit, a handler's answer or an error; then,
// when answered, the one sequence every answer goes through (finish). The
// transport's limit is the client's advertised size over UDP, 65,535 over
// TCP.
func (s *Server) answerLocal(r *request, out []byte) ([]byte, verdict) {
	start := len(out)
	out, v, how := s.answer(r, out)
	if r.cd.c != nil {
		s.observe(r, out[start:], v, how)
	}
	if v == answered {
		out = s.finish(r, out, start, how == ansHit)
	}
	return out, v
}

// observe counts r under CoreDNS's names as it arrives (resp is its
// answer when v is answered) and sets r.k, where finish counts its
// answer.
func (s *Server) observe(r *request, resp []byte, v verdict, how int) {
	r.k = cdKey{zone: -1}
	if how == ansHealth || how == ansBadVers || v == dropped {
		// Health checks are the daemon's own probes; CoreDNS answers
		// BADVERS before counting anything; drops are no queries.
		return
	}
	metric := CDDroppedZone // a query without a block: malformed
	if r.blk != nil {
		metric = r.blk.Metric
	}
	r.k = s.cdKey(r.cd.srv, metric, r.tcp)
	if r.wild {
		r.k.fam = 0
		if r.v6 {
			r.k.fam = 1
		}
	}
	if r.k.zone < 0 {
		return
	}
	cd := r.cd.c
	cd.request(r.k, &r.q, len(r.raw))
	if how == ansHit {
		switch {
		case v == miss:
			cd.cache(r.k, cdCacheMiss)
		case resp[3]&0xF == 0 && (resp[6] != 0 || resp[7] != 0):
			cd.cache(r.k, cdHitSuccess)
		default:
			cd.cache(r.k, cdHitDenial)
		}
	}
}

// How answer answered.
const (
	ansHit       = iota // from the cache (or a miss)
	ansLocal            // an error of our own (REFUSED zone transfers), or a handler's answer (whoami)
	ansMalformed        // FORMERR, NOTIMP
	ansBadVers
	ansHealth
	ansAutopath // handed to autopath, answered on the miss path
)

// answer answers r from what is at hand. Right after parsing it finds the
// query's block, once: everything after (the block's handlers, the cache,
// the CoreDNS metric zone, a miss, its flight and its fetch) reads it from
// r.
func (s *Server) answer(r *request, out []byte) ([]byte, verdict, int) {
	raw, q, st, tcp, now := r.raw, &r.q, r.st, r.tcp, r.now
	r.blk, r.depth, r.res = nil, 0, nil
	start := len(out)
	err := wire.ParseQuery(raw, q)
	q.From, q.Client = r.from, r.owner
	st.countRequest(tcp)
	if err != nil {
		rcode, how := wire.RcodeFormErr, ansMalformed
		switch {
		case errors.Is(err, wire.ErrDrop):
			st.Dropped.Add(1)
			return out, dropped, how
		case errors.Is(err, wire.ErrNotImp):
			rcode = wire.RcodeNotImp
		case errors.Is(err, wire.ErrBadVers):
			rcode, how = wire.RcodeBadVers, ansBadVers
		}
		st.Malformed.Add(1)
		out = wire.AppendError(out, raw, q, rcode, s.cfg.MaxUDPSize)
		st.countRcode(rcode)
		return out, answered, how
	}
	if isHealth(q.Name) {
		// Answered here, never cached or forwarded, and not counted as a
		// hit or a miss: health checks would skew the hit ratio.
		st.HealthChecks.Add(1)
		out = wire.AppendError(out, raw, q, wire.RcodeSuccess, s.cfg.MaxUDPSize)
		st.countRcode(wire.RcodeSuccess)
		return out, answered, ansHealth
	}
	r.res = s.resolver(q.View)
	r.blk = r.res.Block(q.Name)
	if c := r.blk.Answer; c != nil {
		s.chainRequest(r)
		var v answer.Verdict
		if out, v, r.depth = c.Query(&r.a, out); v != answer.Pass {
			if v == answer.Drop {
				st.Dropped.Add(1)
				return out[:start], dropped, ansLocal
			}
			// A handler's answer (whoami, acl): the client's own, never
			// cached, coalesced or forwarded.
			st.countRcode(wire.Rcode(out[start:]))
			return out, answered, ansLocal
		}
	}
	if q.Type == 251 || q.Type == 252 { // IXFR, AXFR: zone transfers are not a cache's job
		out = wire.AppendError(out, raw, q, wire.RcodeRefused, s.cfg.MaxUDPSize)
		st.countRcode(wire.RcodeRefused)
		return out, answered, ansLocal
	}
	e := r.res.Hit(q, r.blk, now)
	if s.isCandidate(q) && (e == nil || e.Rcode() == wire.RcodeNXDomain) {
		// Decided off the hot path (autopath.go). A cached answer other
		// than NXDOMAIN is the client's (the first candidate exists) and
		// is served here, without touching the other candidates.
		return out, miss, ansAutopath
	}
	if e == nil {
		return out, miss, ansHit
	}
	out = e.Write(out, q, now, s.maxSize(q, tcp), s.cfg.MaxUDPSize)
	st.countRcode(e.Rcode())
	return out, answered, ansHit
}

// maxSize is the largest answer the client gets over this transport: over
// UDP its EDNS size (already at least 512) up to MaxClientUDPSize, and 512
// without EDNS (RFC 1035 §4.2.1).
func (s *Server) maxSize(q *wire.Query, tcp bool) int {
	if tcp {
		return 0xFFFF
	}
	if !q.EDNS {
		return wire.MinUDPSize
	}
	return int(min(q.Size, s.cfg.MaxClientUDPSize))
}

// hitKey is the client of a hit as the cache counts an entry's clients
// (its popularity): a loopback address is the node, any other its own
// (the node's other addresses, a few, count as clients of their own: the
// hit path does not look them up). Constant time, no allocation.
func (s *Server) hitKey(a netip.Addr) netip.Addr {
	if s.cfg.Clients != nil && a.IsLoopback() {
		return fair.Node
	}
	return a
}

// admit takes a waiting slot for a miss of client c, or reports false
// when MaxWaiting clients are waiting or c holds its share of them while
// only the reserve is free (package fair; counted).
func (s *Server) admit(c netip.Addr) bool {
	s.waitMu.Lock()
	v := s.waiting.Take(c)
	s.waitMu.Unlock()
	if v == fair.OverShare {
		s.stats.WaitingShareRejects.Add(1)
	}
	return v == fair.Taken
}

// release gives back a waiting slot of client c.
func (s *Server) release(c netip.Addr) {
	s.waitMu.Lock()
	s.waiting.Put(c)
	s.waitMu.Unlock()
}

// healthName is answered by the server itself (NOERROR, no records), so a
// health check proves the listener works without asking any upstream. It
// is under .invalid (RFC 6761 §6.4), which no real resolver answers, so it
// shadows nothing.
var healthName, _ = wire.AppendNameWire(nil, "health-check.nodelocaldns.invalid.")

// isHealth reports whether name is healthName; the length test keeps it to
// one comparison on the hit path.
func isHealth(name []byte) bool {
	return len(name) == len(healthName) && wire.EqualNameFold(name, healthName)
}

// HealthQuery returns a query for the health name with the given ID.
func HealthQuery(id uint16) []byte {
	q := wire.Query{Name: healthName, Type: wire.TypeA, Class: wire.ClassINET}
	b := wire.AppendUpstreamQuery(nil, &q, wire.MinUDPSize)
	wire.SetID(b, id)
	return b
}

// port is the port of Addrs[i].
func (c *Config) port(i int) int {
	if i < len(c.Ports) && c.Ports[i] != 0 {
		return c.Ports[i]
	}
	return c.Port
}
