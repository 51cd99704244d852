// Package panics is what the serving path does with a panic it recovers:
// it counts it by where it happened, for a metric, and logs it at a bounded
// rate with the shape of the message in hand (header flags, opcode, rcode,
// section counts, the question's type, class and name length) and the
// stack. It never logs a name or any other byte a client or an upstream
// chose, so a hostile packet cannot write into the log.
//
// It answers nothing and decides nothing: the transports (internal/server),
// the resolver (internal/resolve) and the upstream readers
// (internal/forward) recover where they still owe an answer, answer it
// (SERVFAIL, or an error for the flight), and report here. It imports no
// package of this module but wire.
package panics

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Where a panic was recovered: the label of
// nodelocaldns_panics_recovered_total.
const (
	UDP      = "udp"      // answering a UDP query from the cache (the receive loop)
	TCP      = "tcp"      // answering a TCP query from the cache (its connection)
	Miss     = "miss"     // a miss: started, resolved, written or delivered
	Resolve  = "resolve"  // building, caching and handing out an upstream's answer
	Upstream = "upstream" // an upstream's reader, or a try's result
)

// Wheres lists every label, for the metric.
var Wheres = [...]string{UDP, TCP, Miss, Resolve, Upstream}

// logEvery bounds the log to one line per place per interval; the lines
// in between are counted and the next line says how many.
const logEvery = 10 * time.Second

// maxStack bounds the stack in a log line.
const maxStack = 4096

type site struct {
	count      atomic.Uint64
	lastLog    atomic.Int64 // unix ns of the last line
	suppressed atomic.Uint64
}

var (
	sites  [len(Wheres)]site
	logger atomic.Pointer[slog.Logger]
)

// SetLogger sets where the lines go (slog.Default() until then).
func SetLogger(l *slog.Logger) { logger.Store(l) }

func index(where string) int {
	for i, w := range Wheres {
		if w == where {
			return i
		}
	}
	return len(Wheres) - 1
}

// Counts returns the panics recovered since the process started, by where
// (in Wheres' order).
func Counts() [len(Wheres)]uint64 {
	var c [len(Wheres)]uint64
	for i := range sites {
		c[i] = sites[i].count.Load()
	}
	return c
}

// ForgetLogged lets the next panic of every place be logged at once, as
// if the interval had passed (tests).
func ForgetLogged() {
	for i := range sites {
		sites[i].lastLog.Store(0)
	}
}

// Count is the number of panics recovered at where.
func Count(where string) uint64 { return sites[index(where)].count.Load() }

// Recovered reports the panic v, recovered at where while msg (a query or
// an upstream's answer, nil when unknown) was in hand: counted, and logged
// unless a line for the same place was logged within logEvery.
func Recovered(where string, v any, msg []byte) {
	s := &sites[index(where)]
	s.count.Add(1)
	now := time.Now().UnixNano()
	last := s.lastLog.Load()
	if last != 0 && now-last < int64(logEvery) || !s.lastLog.CompareAndSwap(last, now) {
		s.suppressed.Add(1)
		return
	}
	l := logger.Load()
	if l == nil {
		l = slog.Default()
	}
	stack := debug.Stack()
	if len(stack) > maxStack {
		stack = stack[:maxStack]
	}
	l.Error("recovered a panic while serving: the query it concerned got SERVFAIL (or its upstream try failed), serving goes on; a bug, please report this line",
		"where", where, "panic", panicText(v), "message", Shape(msg),
		"suppressed_since_last", s.suppressed.Swap(0), "stack", string(stack))
}

// panicText is the panic's value as text, bounded: a runtime error's text
// names no data, and a value a caller panicked with is cut short.
func panicText(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// Shape describes a DNS message without any byte its sender chose freely:
// its length, the header's flags, opcode, rcode and section counts, and the
// first question's name length (in wire bytes), label count, type and
// class. It never fails: what cannot be read is said so.
func Shape(msg []byte) string {
	if msg == nil {
		return "unknown"
	}
	if len(msg) < wire.HeaderLen {
		return fmt.Sprintf("%d bytes, shorter than a header", len(msg))
	}
	f := wire.Flags(msg)
	qd, an, ns, ar := wire.Counts(msg)
	s := fmt.Sprintf("%d bytes, opcode %d, rcode %d, flags %s, counts %d/%d/%d/%d",
		len(msg), wire.Opcode(msg), f&0xF, flagText(f), qd, an, ns, ar)
	if qd == 0 {
		return s
	}
	nameLen, labels, off, ok := walkName(msg, wire.HeaderLen)
	if !ok || off+4 > len(msg) {
		return s + ", question unreadable"
	}
	typ := uint16(msg[off])<<8 | uint16(msg[off+1])
	class := uint16(msg[off+2])<<8 | uint16(msg[off+3])
	return s + fmt.Sprintf(", question: name of %d bytes in %d labels, type %d, class %d", nameLen, labels, typ, class)
}

// walkName measures the uncompressed name at off: its length in wire
// bytes, its labels (the root not counted), and the offset past it.
func walkName(b []byte, off int) (n, labels, end int, ok bool) {
	start := off
	for off < len(b) {
		l := int(b[off])
		switch {
		case l == 0:
			return off + 1 - start, labels, off + 1, true
		case l&0xC0 != 0 || off-start+1+l > 254:
			return 0, 0, 0, false // compressed or too long: no query's
		}
		labels++
		off += 1 + l
	}
	return 0, 0, 0, false
}

// flagText names the header bits that are set (Z as z).
func flagText(f uint16) string {
	names := [...]struct {
		bit  uint16
		name string
	}{{1 << 15, "qr"}, {1 << 10, "aa"}, {1 << 9, "tc"}, {1 << 8, "rd"}, {1 << 7, "ra"}, {1 << 6, "z"}, {1 << 5, "ad"}, {1 << 4, "cd"}}
	s := ""
	for _, n := range names {
		if f&n.bit != 0 {
			if s != "" {
				s += " "
			}
			s += n.name
		}
	}
	if s == "" {
		return "none"
	}
	return s
}
