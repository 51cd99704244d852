package server

import (
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// Defaults of the transport, used for a zero Config field and by the flags
// (internal/config reads them; this package imports no configuration).
const (
	// DefaultMaxUDPSize is the EDNS size advertised in our answers: the
	// resolver's (resolve.DefaultUDPSize), one value.
	DefaultMaxUDPSize = resolve.DefaultUDPSize
	// DefaultMaxClientUDPSize caps UDP answers to clients that advertise a
	// larger EDNS size: between a pod and its node there is no path MTU to
	// fear, and 4096 is at most 3 fragments on a 1500-byte veth
	// (docs/design.md, "UDP sizes").
	DefaultMaxClientUDPSize = 4096
	// DefaultMaxWaiting bounds all clients waiting for a miss, so memory
	// stays bounded whatever clients do. One costs ~7 KiB (a goroutine
	// stack and its pooled query and answer, TestWaitingClientMemory), so
	// 2048 cost ~14 MiB, as the manifest's memory arithmetic counts. Twice
	// the flight bound gives every flight room for a second waiter.
	DefaultMaxWaiting = 2 * resolve.DefaultMaxInflight
	// DefaultMaxTCPConns bounds open client TCP connections.
	DefaultMaxTCPConns = 1000
	// DefaultMaxTCPPipeline bounds the misses outstanding on one client
	// TCP connection.
	DefaultMaxTCPPipeline = 32
	// DefaultTCPIdleTimeout closes an idle client TCP connection (as
	// CoreDNS).
	DefaultTCPIdleTimeout = 10 * time.Second
	// DefaultTCPReadTimeout bounds reading one TCP query once its first
	// byte is there (a slow-loris client cannot hold a slot for long).
	DefaultTCPReadTimeout = 2 * time.Second
)

// MaxTCPAnswerBytes bounds the answers to misses being written to TCP
// clients, all connections together, apportioned by client (package fair:
// a client holding 256 KiB borrows only while the 2 MiB reserve stays
// free). A client that reads its answers holds its bytes for the time of
// a write; one that does not can hold them until the write deadline, and
// without a bound 1,000 connections with 32 answers of 64 KiB each pending
// were 2 GiB. 8 MiB is 128 of the largest answers at once.
const MaxTCPAnswerBytes = 8 << 20
