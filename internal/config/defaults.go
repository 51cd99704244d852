package config

import (
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
)

// Defaults of the serving path. The flags below use them, and so do
// server.New and resolve.New for a zero Config field, so a default lives in
// one place.
const (
	// DefaultMaxUDPSize is the largest UDP answer and the EDNS size we
	// advertise: 1232, the DNS flag day 2020 value that fits an IPv6
	// minimum MTU without fragmentation.
	DefaultMaxUDPSize = 1232
	// DefaultMaxClientUDPSize caps UDP answers to clients that advertise a
	// larger EDNS size: between a pod and its node there is no path MTU to
	// fear, and 4096 is at most 3 fragments on a 1500-byte veth
	// (docs/design.md, "UDP sizes").
	DefaultMaxClientUDPSize = 4096
	// DefaultMaxInflight bounds the distinct questions being resolved
	// upstream at once (flights, not waiting clients): past it a new
	// question gets its stale answer or SERVFAIL at once.
	// It is also each upstream group's bound (forward.DefaultMaxInflight):
	// one value, defined there.
	DefaultMaxInflight = forward.DefaultMaxInflight
	// DefaultMaxWaitersPerQuestion caps the clients waiting on one
	// question's flight. A thousand pods starting together all ask for the
	// same Service name at once, and they must all be answered by one
	// upstream query (TestThousandConcurrentMissesOneUpstreamQuery); a
	// client past the cap gets the stale answer or SERVFAIL at once. At
	// half of DefaultMaxWaiting, one stuck name can never hold more than
	// half of the waiting budget: 1,024 other clients still wait, as many
	// as the whole budget was before admission counted questions.
	DefaultMaxWaitersPerQuestion = 1024
	// DefaultMaxWaiting bounds all clients waiting for a miss, so memory
	// stays bounded whatever clients do. One costs ~7 KiB (a goroutine
	// stack and its pooled query and answer, TestWaitingClientMemory), so
	// 2048 cost ~14 MiB, as the manifest's memory arithmetic counts. Twice
	// the flight bound gives every flight room for a second waiter.
	DefaultMaxWaiting = 2 * DefaultMaxInflight
	// DefaultMaxTCPConns bounds open client TCP connections.
	DefaultMaxTCPConns = 1000
	// DefaultMaxTCPPipeline bounds the misses outstanding on one client
	// TCP connection.
	DefaultMaxTCPPipeline = 32
	// DefaultForwardTimeout bounds one miss end to end: a glibc client
	// waits 5 s before it retries, so it still gets our SERVFAIL.
	DefaultForwardTimeout = 4 * time.Second
	// DefaultTCPIdleTimeout closes an idle client TCP connection (as
	// CoreDNS).
	DefaultTCPIdleTimeout = 10 * time.Second
	// DefaultTCPReadTimeout bounds reading one TCP query once its first
	// byte is there (a slow-loris client cannot hold a slot for long).
	DefaultTCPReadTimeout = 2 * time.Second
	// DefaultStaleClientTimeout is how long a client whose answer is stale
	// waits for the refresh: 1.8 s, RFC 8767's suggestion, under the 2 s
	// many stubs wait before retrying.
	DefaultStaleClientTimeout = 1800 * time.Millisecond
	// DefaultStaleRecheck is how long after a failed refresh a stale
	// answer is served without asking the upstream again (RFC 8767: 30 s).
	DefaultStaleRecheck = 30 * time.Second
	// DefaultClusterDomain is the Kubernetes default cluster domain.
	DefaultClusterDomain = "cluster.local."
)
