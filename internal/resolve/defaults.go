package resolve

import "time"

// Defaults of resolution, used for a zero Config or Policy field and by
// the flags (internal/config reads them; this package imports no
// configuration).
const (
	// DefaultUDPSize is the EDNS UDP size advertised upstream (and, by the
	// server, in our answers): 1232, the DNS flag day 2020 value that fits
	// an IPv6 minimum MTU without fragmentation.
	DefaultUDPSize = 1232
	// DefaultMaxInflight bounds the distinct questions being resolved
	// upstream at once (flights, not waiting clients): past it a new
	// question gets its stale answer or SERVFAIL at once. The same flag
	// sets each upstream group's bound, whose default
	// (forward.DefaultMaxInflight) config's tests hold equal to this one.
	DefaultMaxInflight = 1024
	// DefaultMaxWaitersPerQuestion caps the clients waiting on one
	// question's flight. A thousand pods starting together all ask for the
	// same Service name at once, and they must all be answered by one
	// upstream query (TestThousandConcurrentMissesOneUpstreamQuery); a
	// client past the cap gets the stale answer or SERVFAIL at once. At
	// half of the server's waiting bound (server.DefaultMaxWaiting), one
	// stuck name can never hold more than half of the waiting budget.
	DefaultMaxWaitersPerQuestion = 1024
	// DefaultFetchTimeout bounds one miss end to end (-forward-timeout): a
	// glibc client waits 5 s before it retries, so it still gets our
	// SERVFAIL.
	DefaultFetchTimeout = 4 * time.Second
	// DefaultStaleClientTimeout is how long a client whose answer is stale
	// waits for the refresh: 1.8 s, RFC 8767's suggestion, under the 2 s
	// many stubs wait before retrying.
	DefaultStaleClientTimeout = 1800 * time.Millisecond
	// DefaultStaleRecheck is how long after a failed refresh a stale
	// answer is served without asking the upstream again (RFC 8767: 30 s).
	DefaultStaleRecheck = 30 * time.Second
)
