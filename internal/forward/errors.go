package forward

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// Sentinel errors the server branches on. Every error Exchange returns wraps one of these or a
// context error, with the group and upstream as context.
var (
	// ErrOverloaded: the group already has MaxInflight queries in flight. Never cache it.
	ErrOverloaded = errors.New("too many queries in flight")
	// ErrNoAnswer: every try failed (timeouts, network errors, invalid answers) or the
	// caller's deadline passed; the last failure is wrapped too.
	ErrNoAnswer = errors.New("no valid answer from any upstream")
	// ErrBadQuery: the query is not a DNS message with exactly one question.
	ErrBadQuery = errors.New("malformed query")
	// ErrAllDown: every server is marked down and the group fails fast
	// (GroupConfig.FailFast); wrapped in ErrNoAnswer.
	ErrAllDown = errors.New("every upstream is down (failfast_all_unhealthy_upstreams)")
	// ErrClosed: the group was closed.
	ErrClosed = errors.New("group closed")
)

// Failure kinds reported to Observer.Failure.
const (
	KindTimeout    = "timeout"    // no answer within the try's deadline
	KindRefused    = "refused"    // connection refused (TCP RST on connect, ICMP port unreachable on UDP)
	KindClosed     = "closed"     // the upstream closed or reset a TCP connection before answering
	KindMalformed  = "malformed"  // an answer that does not parse as a DNS response
	KindMismatch   = "mismatch"   // an answer for another ID or another question
	KindNetwork    = "network"    // any other transport error
	KindOverloaded = "overloaded" // MaxInflight reached; reported with an empty upstream
)

// Transport-level failures, classified by failureKind.
var (
	errMalformed  = errors.New("malformed answer")
	errMismatch   = errors.New("answer does not match the query")
	errPeerClosed = errors.New("connection closed by upstream before answering")
)

// failureKind maps a transport error to the kind reported to the Observer.
func failureKind(err error) string {
	switch {
	case errors.Is(err, errMalformed):
		return KindMalformed
	case errors.Is(err, errMismatch):
		return KindMismatch
	case errors.Is(err, errPeerClosed):
		return KindClosed
	case errors.Is(err, syscall.ECONNREFUSED):
		return KindRefused
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return KindTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return KindTimeout
	}
	return KindNetwork
}

// peerClosed reports whether a read or write error means the upstream closed the connection.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED)
}
