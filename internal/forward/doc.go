// Package forward sends cache misses to upstream DNS servers: upstream Groups with health checks
// and failover, and the transports (pipelined TCP pool, over TLS for DNS-over-TLS servers; UDP
// with TCP on TC). Each server of a group keeps its transport: a TLS group may hold plain
// servers (GroupConfig.Plain, a forward's plain targets beside its tls:// ones), asked over UDP
// or TCP, with one walk, health and limit over all. Which group a name goes to is not decided
// here: a Route is compiled into internal/blocks' table.
//
// It owns nothing else: it must not cache answers, import Prometheus or internal packages beyond
// wire, clock and panics (a panic recovered on a reader is reported there: guard.go), or log per
// query. Measurements go to an Observer the caller implements; operator-worthy events
// (upstream down/up, dial failures starting) go to the GroupConfig.Logger, one line each.
//
// # API
//
//	func NewGroup(cfg GroupConfig, obs Observer) (*Group, error)
//	func (g *Group) Exchange(ctx context.Context, query []byte) ([]byte, error)
//	func (g *Group) Close() error
//
// # Exchange
//
// The query is wire format with exactly one question; the answer comes back in wire format with
// the caller's ID (transports use their own IDs on the wire). An answer is used only if QR is set,
// the ID is the one sent, it has exactly one question equal to the query's (name compared
// case-insensitively), and wire.CheckMessage accepts it: every name within the message, every
// compression pointer pointing backwards (so none loops or points past the end), the names inside
// NS, CNAME, PTR, DNAME, MX, SOA, SRV, NAPTR… rdata included, A/AAAA of their size. Otherwise it
// counts as a failure of that upstream (KindMalformed or KindMismatch) and the next try is made;
// nothing malformed is returned, so nothing malformed is cached or relayed. Over UDP, packets that
// are not the answer (another ID or question) are counted and ignored while the try keeps
// listening for the real one (spoofing defence: random ID, random source port).
//
// Healthy servers are tried in configuration order (resolv.conf order for the node group), each
// try bounded by TryTimeout and all by ctx; the list is gone through at most twice. SERVFAIL and
// REFUSED answers are passed on only if no later server answers otherwise (as glibc moves on).
//
// Errors: ErrOverloaded (MaxInflight reached, at once), ErrBadQuery, ErrClosed, or ErrNoAnswer
// wrapping the last failure (a context error when the deadline passed). The server answers
// SERVFAIL (or stale) for all of them.
//
// Time: tries, health probes and the dial backoff run on GroupConfig.Clock (clock.Real when nil),
// so tests move a clock.Fake. Socket deadlines (TCP idle close, write timeout) stay on the system
// clock.
//
// # Health
//
// maxFails (3) consecutive failures mark a server down. A timeout counts only if the server
// answered nothing else while the try waited: a few names it never answers (a broken zone) are
// slow names, not a dead server, and must not fail everyone else's queries. A down server is
// skipped and probed in the background with ". IN NS" (RD clear) every 500 ms, backing off to 2 s,
// until any valid answer marks it up (a query's answer marks it up too). When every server of a
// group is down, a query is still tried on one of them, in turn, once: a down-marking never turns
// into SERVFAIL with nothing sent.
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
// connection, dialled if need be (counted as KindClosed, not against health). A connection that
// delivered no frame (no answer to any query) for a whole try is closed when that try ends: it may
// be stuck inside a frame that never completes (a lying length prefix), and an idle wedged
// connection would otherwise be preferred over dialling; its other queries are asked again on
// another connection. Read buffers start at 4 KiB and grow with the bytes received, never with the
// announced length. Failed dials back off from 100 ms to 2 s; meanwhile queries fail over at once.
// Health probes use a one-shot connection of their own, never the pool. The number of open
// connections never exceeds PoolSize, draining ones included.
//
// # UDP
//
// A few connected sockets per upstream shared by every query (at most 4 take new queries; a new
// one opens only when each open one has queries waiting), each with one reader goroutine that
// takes the answers in batches (recvmmsg through the netpoller) and hands each to the query
// waiting for its ID and question; queries queued while a send is in progress leave together
// in one sendmmsg. A waiting query parks on a recycled channel and a recycled timer, not on a
// socket, and holds no receive buffer: the reader's buffers (the largest size advertised + 1:
// 1233 bytes for the server's default 1232) belong to the socket. An answer that fills one is larger than we asked for and is
// treated as truncated. Spoofing defence (RFC 5452): a random ID per query, unique among the
// IDs in use on its socket (in flight, or given up on until the socket closes, so a late answer
// is told apart and dropped), answers must match the ID and the question, and the source ports
// are random kernel-chosen ones, replaced after 256 queries or 5 s. A pending ICMP error
// (refused) fails the socket's waiting queries at once. A truncated answer is asked again over
// a one-shot TCP connection to the same server, with its own TryTimeout; that read, too, grows
// with the bytes received. Observer.SocketUse counts a query sent over an open socket (hit) or
// one that opened a socket (miss).
//
// # Without a waiting goroutine (ExchangeAsync)
//
// ExchangeAsync gives the result Exchange would give, to a Done instead of a returning call: the
// first try is sent from the caller's goroutine (the UDP datagram through the socket's send queue,
// the TCP frame written at once without blocking when no write is in progress), and the upstream
// socket's reader hands the matched answer to the Done, so a miss the first server answers costs
// no goroutine and no hand-off between goroutines. The try's end is a recycled timer of the wait;
// exactly one of the reader, the timer and a failing connection completes it. When the first try
// does not give the final answer (an error, a timeout, a truncated or oversized UDP answer, SERVFAIL
// or REFUSED while another server is healthy, a connection closed under it) or a TCP pool would have
// to dial or wait for a slot, the rest of the walk runs as Exchange's in a goroutine of its own.
package forward
