package forward

import "time"

// Observer receives what the package measures; the lead's metrics package implements it with
// Prometheus. Methods are called concurrently and must not block. group is GroupConfig.Name and
// upstream is the server's "ip:port".
type Observer interface {
	// Exchange: an upstream returned a valid answer with this rcode after d (the whole try,
	// including a TCP re-ask after a truncated UDP answer).
	Exchange(group, upstream string, rcode int, d time.Duration)
	// Failure: one failure of kind (Kind* constants). For KindOverloaded upstream is "".
	// Garbage or mismatched UDP packets are counted one by one while the try keeps listening.
	// Health probes are not counted here: their result shows in Health.
	Failure(group, upstream, kind string)
	// Health: an upstream changed state. NewGroup reports every upstream healthy once.
	Health(group, upstream string, healthy bool)
	// Conns: a TCP connection to upstream opened (+1) or closed (-1).
	Conns(group, upstream string, delta int)
	// Inflight: a query entered (+1) or left (-1) the group.
	Inflight(group string, delta int)
	// SocketUse: a query to upstream was sent over an already open socket of proto ("udp")
	// (reused) or made the transport open one (not reused, counted before the open, so a
	// failed open counts too): CoreDNS's connection cache hits and misses.
	SocketUse(group, upstream, proto string, reused bool)
}

// nopObserver is used when NewGroup is given a nil Observer.
type nopObserver struct{}

func (nopObserver) Exchange(string, string, int, time.Duration) {}
func (nopObserver) Failure(string, string, string)              {}
func (nopObserver) Health(string, string, bool)                 {}
func (nopObserver) Conns(string, string, int)                   {}
func (nopObserver) Inflight(string, int)                        {}
func (nopObserver) SocketUse(string, string, string, bool)      {}

var _ Observer = nopObserver{}
