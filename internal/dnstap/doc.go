// Package dnstap is the Corefile's `dnstap` directive: dnstap messages
// (https://dnstap.info), the protobuf encoded here with protowire, sent
// over Frame Streams (the bidirectional handshake READY, ACCEPT, START on
// a unix socket, TCP or TLS; STOP and FINISH at close) to a collector, as
// CoreDNS's dnstap plugin sends them (plugin/dnstap, its msg package and
// forward's dnstap.go).
//
// A Tap is one directive: its endpoint, `full`, its identity, version and
// extra. Send encodes a message at once (the caller's buffers are reused
// after it returns) and hands it to the Tap's writer goroutine through a
// bounded queue; it never blocks: a message the queue cannot take is
// dropped and counted. The writer connects, writes frames, flushes when
// the queue runs empty, and on any error (a collector that stops reading
// past the write timeout, or goes away) closes the connection, drops what
// it was writing and what waits (counted), and dials again with backoff;
// one log line per state change (connected, lost, and the first failure
// of a run of failed dials).
//
// It matches no names and knows no blocks: which block's taps a query is
// sent to is internal/blocks' to say; the server fills the client's
// messages, internal/running the forwarder's from what internal/forward
// reports of each try (forward.Tapper).
package dnstap
