// Package forward sends cache misses to upstream DNS servers: the zone Router, upstream Groups
// with health checks and failover, and the transports (pipelined TCP pool; UDP with TCP on TC).
//
// It owns nothing else: it must not cache answers, import Prometheus or other internal packages,
// or log per query. Measurements go to an Observer the caller implements; operator-worthy events
// (upstream down/up, dial failures starting) go to the GroupConfig.Logger, one line each.
//
// # API
//
//	func NewGroup(cfg GroupConfig, obs Observer) (*Group, error)
//	func (g *Group) Exchange(ctx context.Context, query []byte) ([]byte, error)
//	func (g *Group) Close() error
//	func NewRouter(routes []Route) *Router
//	func (r *Router) Update(routes []Route)
//	func (r *Router) Lookup(qname string) *Group
//
// # Exchange
//
// The query is wire format with exactly one question; the answer comes back in wire format with
// the caller's ID (transports use their own IDs on the wire). An answer is used only if QR is set,
// the ID is the one sent, and it has exactly one question equal to the query's (name compared
// case-insensitively). Otherwise it counts as a failure of that upstream (KindMalformed or
// KindMismatch) and the next try is made. Over UDP such packets are counted and ignored while the
// try keeps listening for the real answer (spoofing defence: random ID, random source port).
//
// Healthy servers are tried in configuration order (resolv.conf order for the node group), each
// try bounded by TryTimeout and all by ctx; the list is gone through at most twice. SERVFAIL and
// REFUSED answers are passed on only if no later server answers otherwise (as glibc moves on).
//
// Errors: ErrOverloaded (MaxInflight reached, at once), ErrAllDown (every server marked down, at
// once, nothing sent), ErrBadQuery, ErrClosed, or ErrNoAnswer wrapping the last failure (a
// context error when the deadline passed). The server answers SERVFAIL (or stale) for all of them.
//
// # Health
//
// maxFails (3) consecutive failures mark a server down; it is skipped and probed in the
// background with ". IN NS" (RD clear) every 500 ms, backing off to 2 s, until any valid answer
// marks it up. When every server of a group is down Exchange fails fast with ErrAllDown instead of
// making each client wait on a dead server: DESIGN.md asks for SERVFAIL or stale at once, and the
// probes end the outage within the probe interval of the server's recovery.
//
// # TCP (RFC 7766)
//
// Per server, up to PoolSize long-lived connections with up to MaxPerConn queries outstanding on
// each. A query goes to the connection with the fewest outstanding; a new connection is dialled
// while the pool is not full and all open ones are busy, because a miekg/dns-based kube-dns
// answers one connection's queries in order. Each connection has one reader dispatching answers by
// wire ID in any order; writes are serialised with a write deadline. A connection is closed after
// IdleTimeout without traffic, and drained and replaced after MaxQueriesPerConn queries. When the
// peer closes or resets a connection before answering, the query is sent once more on another
// connection, dialled if need be (counted as KindClosed, not against health). Failed dials back off from 100 ms to 2 s; meanwhile queries
// fail over at once. The number of open connections never exceeds PoolSize, draining ones included.
//
// # UDP
//
// One connected socket per try (a fresh random source port) with a random ID. A truncated answer
// is asked again over a one-shot TCP connection to the same server, with its own TryTimeout.
//
// # Router
//
// Longest zone suffix on label boundaries ("xcluster.local." is not in "cluster.local."); "." is
// the default. Update swaps the table atomically; Lookup takes no lock and does not allocate.
package forward
