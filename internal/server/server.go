// Package server owns the DNS listeners: several SO_REUSEPORT UDP sockets
// per address read in batches (recvmmsg) and answered from the cache on the
// reading goroutine, TCP with several queries per connection answered as
// they complete, admission (a bound on concurrent misses and on TCP
// connections), EDNS, and truncation to the client's payload size.
//
// It knows nothing about upstreams: a miss calls the Forward function it is
// given with a ready upstream query, and the answer goes through the cache.
//
// Lifecycle (lifecycle.go): Files and Adopt hand the listening sockets to a
// twin instance, so what is queued in them survives this server; Shutdown
// stops the loops before it closes anything and drains TCP; CheckLoops
// tells a waiting loop from a wedged one for health checks.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// ForwardFunc sends query (wire format, ID chosen by the transport) for the
// lower-case FQDN qname upstream and returns the validated answer.
type ForwardFunc func(ctx context.Context, qname string, query []byte) ([]byte, error)

// Config configures a Server.
type Config struct {
	Addrs []netip.Addr
	Port  int
	// UDPSockets is the number of SO_REUSEPORT sockets per address; 0
	// means GOMAXPROCS, so every core can read its own socket.
	UDPSockets int
	Cache      *cache.Cache
	Forward    ForwardFunc
	// ClusterZone is the cluster domain ("cluster.local."); names in it
	// get the Cluster policy, others the Default policy.
	ClusterZone   string
	ClusterPolicy cache.Policy
	DefaultPolicy cache.Policy
	ServFailTTL   time.Duration
	// StaleWindow is how long past expiry an answer may be served stale
	// (RFC 8767) when the upstream fails or is slow; 0 disables.
	StaleWindow time.Duration
	// StaleClientTimeout is how long a client whose answer is stale waits
	// for the refresh before it gets the stale answer (default 1.8 s, RFC
	// 8767's suggestion: under the 2 s many stubs wait before retrying).
	StaleClientTimeout time.Duration
	// StaleRecheck is how long after a failed refresh a stale answer is
	// served without asking the upstream again (default 30 s, RFC 8767).
	StaleRecheck time.Duration
	// MaxUDPSize is the UDP payload size advertised in OPT records, to
	// upstreams and to clients (default 1232, the DNS flag day 2020 value
	// that fits an IPv6 minimum MTU without fragmentation).
	MaxUDPSize uint16
	// MaxClientUDPSize caps a UDP answer to a client that advertises a
	// larger EDNS size (default 4096: the pod-to-node link has no path MTU
	// to fear; docs/design.md, "UDP sizes"). Clients without EDNS get 512.
	MaxClientUDPSize uint16
	// ForwardTimeout bounds one miss end to end (default 4 s: a glibc client
	// waits 5 s before it retries, so it still gets our SERVFAIL).
	ForwardTimeout time.Duration
	// MaxInflight bounds concurrent misses (default 1024); past it a query
	// gets SERVFAIL at once and is counted as rejected.
	MaxInflight int
	// TCPIdleTimeout closes a TCP connection with no query for this long
	// (default 10 s, as CoreDNS); TCPReadTimeout bounds reading one query
	// once it has started (default 2 s); MaxTCPConns bounds open TCP
	// connections (default 1000); MaxTCPPipeline bounds the misses
	// outstanding on one connection (default 32).
	TCPIdleTimeout time.Duration
	TCPReadTimeout time.Duration
	MaxTCPConns    int
	MaxTCPPipeline int
	Now            func() time.Time
	Logger         *slog.Logger
	// QueryLog, when set, gets one line per answered query (client, name,
	// type, rcode, duration, cache hit or miss); nil costs nothing.
	QueryLog *slog.Logger
}

func (c *Config) setDefaults() {
	if c.UDPSockets <= 0 {
		c.UDPSockets = runtime.GOMAXPROCS(0)
	}
	if c.MaxUDPSize < wire.MinUDPSize {
		c.MaxUDPSize = 1232
	}
	if c.MaxClientUDPSize < wire.MinUDPSize {
		c.MaxClientUDPSize = DefaultMaxClientUDPSize
	}
	if c.ForwardTimeout <= 0 {
		c.ForwardTimeout = 4 * time.Second
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = 1024
	}
	if c.TCPIdleTimeout <= 0 {
		c.TCPIdleTimeout = 10 * time.Second
	}
	if c.TCPReadTimeout <= 0 {
		c.TCPReadTimeout = 2 * time.Second
	}
	if c.MaxTCPConns <= 0 {
		c.MaxTCPConns = 1000
	}
	if c.MaxTCPPipeline <= 0 {
		c.MaxTCPPipeline = 32
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.StaleClientTimeout <= 0 {
		c.StaleClientTimeout = 1800 * time.Millisecond
	}
	if c.StaleRecheck <= 0 {
		c.StaleRecheck = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ClusterZone == "" {
		c.ClusterZone = "cluster.local."
	}
}

// Server answers DNS queries on UDP and TCP.
type Server struct {
	cfg         Config
	clusterWire []byte
	inflight    chan struct{}
	stats       Stats

	mu      sync.Mutex
	udp     []*udpListener
	procs   int // Ps reserved for the receive loops (reserveProcs)
	tcp     []*tcpListener
	conns   map[net.Conn]*tcpConn
	closing atomic.Bool
	serving atomic.Bool
	wg      sync.WaitGroup // serving goroutines
	missWG  sync.WaitGroup // miss goroutines
	// Sockets handed over by a twin (Adopt), used by Listen.
	adoptedUDP map[netip.AddrPort][]*udpListener
	adoptedTCP map[netip.AddrPort]*tcpListener
}

// New checks cfg and returns a server that is not yet listening.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if cfg.Cache == nil || cfg.Forward == nil {
		return nil, errors.New("server: Cache and Forward are required")
	}
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("server: no listen address")
	}
	zone, ok := wire.AppendNameWire(nil, cfg.ClusterZone)
	if !ok {
		return nil, fmt.Errorf("server: invalid cluster zone %q", cfg.ClusterZone)
	}
	return &Server{
		cfg:         cfg,
		clusterWire: zone,
		inflight:    make(chan struct{}, cfg.MaxInflight),
		conns:       make(map[net.Conn]*tcpConn),
	}, nil
}

// policy picks the TTL policy for a question name.
func (s *Server) policy(name []byte) cache.Policy {
	if wire.InZone(name, s.clusterWire) {
		return s.cfg.ClusterPolicy
	}
	return s.cfg.DefaultPolicy
}

// Result of answering a query from what is at hand.
type verdict int

const (
	answered verdict = iota // out holds the response
	dropped                 // send nothing
	miss                    // must be resolved upstream
)

// answerLocal parses raw into q and appends the response to out when it
// can be given without an upstream: a cache hit or an error. maxSize is the
// transport's limit (0 for UDP: the client's advertised size).
func (s *Server) answerLocal(raw []byte, q *wire.Query, out []byte, tcp bool, now int64, st *Stats) ([]byte, verdict) {
	err := wire.ParseQuery(raw, q)
	st.countRequest(tcp)
	if err != nil {
		rcode := wire.RcodeFormErr
		switch {
		case errors.Is(err, wire.ErrDrop):
			st.Dropped.Add(1)
			return out, dropped
		case errors.Is(err, wire.ErrNotImp):
			rcode = wire.RcodeNotImp
		case errors.Is(err, wire.ErrBadVers):
			rcode = wire.RcodeBadVers
		}
		st.Malformed.Add(1)
		out = wire.AppendError(out, raw, q, rcode, s.cfg.MaxUDPSize)
		st.countRcode(rcode)
		return out, answered
	}
	if q.Type == 251 || q.Type == 252 { // IXFR, AXFR: zone transfers are not a cache's job
		out = wire.AppendError(out, raw, q, wire.RcodeRefused, s.cfg.MaxUDPSize)
		st.countRcode(wire.RcodeRefused)
		return out, answered
	}
	e, prefetch := s.cfg.Cache.Get(q, now)
	if e == nil {
		if wire.EqualNameFold(q.Name, healthName) {
			out = wire.AppendError(out, raw, q, wire.RcodeSuccess, s.cfg.MaxUDPSize)
			st.countRcode(wire.RcodeSuccess)
			return out, answered
		}
		return out, miss
	}
	out = e.Write(out, q, now, s.maxSize(q, tcp), s.cfg.MaxUDPSize)
	st.countRcode(e.Rcode())
	if prefetch {
		s.prefetch(q)
	}
	return out, answered
}

// DefaultMaxClientUDPSize is the default cap on UDP answers to EDNS
// clients: 4096, the size most clients that advertise more than 1232
// advertise (kdig, older dig, BIND), so they get their answer in one round
// trip. Between a pod and its node there is no path MTU to discover; a
// 4096-byte answer is at most 3 fragments on a 1500-byte veth.
const DefaultMaxClientUDPSize = 4096

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

// admit takes a miss slot, or reports false when MaxInflight are busy.
func (s *Server) admit() bool {
	select {
	case s.inflight <- struct{}{}:
		return true
	default:
		s.stats.Rejected.Add(1)
		return false
	}
}

func (s *Server) release() { <-s.inflight }

// healthName is answered by the server itself (NOERROR, no records), so a
// health check proves the listener works without asking any upstream. It
// is under .invalid (RFC 6761 §6.4), which no real resolver answers, so it
// shadows nothing.
var healthName, _ = wire.AppendNameWire(nil, "health-check.nodelocaldns.invalid.")

// HealthQuery returns a query for the health name with the given ID.
func HealthQuery(id uint16) []byte {
	q := wire.Query{Name: healthName, Type: wire.TypeA, Class: wire.ClassINET}
	b := wire.AppendUpstreamQuery(nil, &q, wire.MinUDPSize)
	wire.SetID(b, id)
	return b
}
