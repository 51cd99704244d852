// Package answer is what the Corefile's directives that act on every
// query a block answers have in common: log, dnstap, trace, loadbalance,
// rewrite's ttl and rcode rules, acl and whoami (CoreDNS runs them in
// front of its cache, so they see hits as well as misses). Each is one
// Handler; a block carries its handlers, set up once per loaded Corefile,
// as one Chain in plugin.cfg order; the server applies a Chain in one
// sequence, the same for UDP, TCP and misses (Chain.Query when the query
// arrives, Chain.Answer once its answer is ready).
//
// A directive's package registers its setup here (Register, from an init
// function), as the fetch-side directives register with
// internal/directive: whoever builds a block's chain (internal/running)
// asks the registry by the directive names the block has, and the server
// imports none of them.
//
// It must stay small and allocation-free on the serving path: it imports
// only the wire format, the clock and the registry.
package answer

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/registry"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Source says where an answer came from.
type Source uint8

const (
	FromCache    Source = iota // a cache entry (a hit)
	FromUpstream               // resolved upstream (or our SERVFAIL) after a miss
	FromStale                  // a stale entry (RFC 8767) after a miss
	FromServer                 // an error or the health name, answered by the server itself
	FromOverload               // not admitted: the stale entry or SERVFAIL at once
	FromAutopath               // answered (or dropped) by autopath
)

var sourceNames = [...]string{"hit", "miss", "stale", "local", "overload", "autopath"}

// String is the query log's name of the source.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "local"
}

// Request is one query as the chain sees it. The server owns it: a
// handler must not keep it, or its slices, past the call.
type Request struct {
	// Q is the query, parsed; Q.Name is the name as the client wrote it.
	Q *wire.Query
	// Raw is the query as received.
	Raw []byte
	// Client is the client's address and port; Local the address the
	// query was sent to.
	Client netip.AddrPort
	Local  netip.Addr
	TCP    bool
	// Start is when the query arrived.
	Start time.Time
	// Source is where the answer came from (set before Answer).
	Source Source
	// EDNSSize is the EDNS size the server advertises in its own
	// answers (a handler that answers writes it in its OPT).
	EDNSSize uint16
	// Clock is the server's time (a duration is Clock.Now() - Start).
	Clock clock.Clock
}

// Verdict is what Query decided.
type Verdict uint8

const (
	Pass     Verdict = iota // go on: the next handler, then the cache
	Answered                // the handler appended the answer
	Drop                    // send nothing
)

// Handler is one directive of one block, set up. Query sees a query of
// the block when it arrives, before the cache, in the chain's order: it
// may append the answer to out and return Answered (whoami, acl), return
// Drop (acl), or Pass, changing nothing. Answer sees the answer,
// out[start:], just before it is sent, in the chain's reverse order (as
// CoreDNS's response writers wrap each other): it may change it in place
// or replace it (returning out[:start] and the new answer), and observe
// it (log, trace, dnstap). Both are called concurrently and must not
// allocate on the common path.
type Handler interface {
	Query(r *Request, out []byte) ([]byte, Verdict)
	Answer(r *Request, out []byte, start int) []byte
}

// Passer implements Query as Pass: embed it in a Handler that only acts on
// answers.
type Passer struct{}

func (Passer) Query(_ *Request, out []byte) ([]byte, Verdict) { return out, Pass }

// Keeper implements Answer as keeping the answer: embed it in a Handler
// that only acts on queries.
type Keeper struct{}

func (Keeper) Answer(_ *Request, out []byte, _ int) []byte { return out }

// ForwardObserver is a Handler that also sees every try of the block's
// fetches upstream (dnstap's FORWARDER_QUERY and FORWARDER_RESPONSE):
// client is the flight's first asker, upstream the server asked, start
// when the try began; answer is nil when none came.
type ForwardObserver interface {
	Forwarded(client netip.AddrPort, upstream string, tcp bool, start time.Time, query, answer []byte)
}

// Chain is a block's handlers in plugin.cfg order. Never modified once
// built; nil is the empty chain.
type Chain struct {
	names []string
	hs    []Handler
	fwd   []ForwardObserver
}

// NewChain builds a chain of handlers (in plugin.cfg order) named by
// names; nil when there is none.
func NewChain(names []string, hs []Handler) *Chain {
	if len(hs) == 0 {
		return nil
	}
	c := &Chain{names: slices.Clone(names), hs: slices.Clone(hs)}
	for _, h := range hs {
		if f, ok := h.(ForwardObserver); ok {
			c.fwd = append(c.fwd, f)
		}
	}
	return c
}

// Len is the number of handlers.
func (c *Chain) Len() int {
	if c == nil {
		return 0
	}
	return len(c.hs)
}

// Names are the directives of the handlers, in order.
func (c *Chain) Names() []string {
	if c == nil {
		return nil
	}
	return c.names
}

// Forwarders are the handlers that see the fetches' tries upstream.
func (c *Chain) Forwarders() []ForwardObserver {
	if c == nil {
		return nil
	}
	return c.fwd
}

// Query runs the handlers' Query in order until one answers or drops the
// query. It returns out, the verdict, and depth: how many handlers saw
// the query and passed it (their Answer sees the answer: Chain.Answer
// with that depth; len for a query that went on to the cache).
func (c *Chain) Query(r *Request, out []byte) ([]byte, Verdict, int) {
	if c == nil {
		return out, Pass, 0
	}
	for i, h := range c.hs {
		var v Verdict
		if out, v = h.Query(r, out); v != Pass {
			return out, v, i
		}
	}
	return out, Pass, len(c.hs)
}

// Answer runs the Answer of the first depth handlers on the answer
// out[start:], the innermost first.
func (c *Chain) Answer(r *Request, out []byte, start, depth int) []byte {
	if c == nil {
		return out
	}
	for i := min(depth, len(c.hs)) - 1; i >= 0; i-- {
		out = c.hs[i].Answer(r, out, start)
	}
	return out
}

// Replace returns out with its tail from start replaced by n, when n is
// a different buffer no longer than the tail (a handler that repacked the
// answer: a longer one could pass the client's size, and is dropped).
func Replace(out []byte, start int, n []byte) []byte {
	resp := out[start:]
	if len(n) == 0 || len(resp) == 0 || &n[0] == &resp[0] || len(n) > len(resp) {
		return out
	}
	return append(out[:start], n...)
}

// Block is what a setup may know of the block besides its directive's
// configuration.
type Block struct {
	// Pos is where the block starts (file:line), for logs.
	Pos string
	// Plugins are the block's directives in plugin.cfg order.
	Plugins []string
	// Local is the block's first listen address and its port (zero when
	// it binds none).
	Local netip.AddrPort
}

// Env is what a setup may use besides its configuration.
type Env struct {
	// Log is the daemon's logger (what a handler opens is shared by the
	// blocks that ask for it: Block.Pos names the block asking).
	Log   *slog.Logger
	Block Block
	// Out is where query log lines go (CoreDNS writes them on stdout).
	Out io.Writer
	// Shared returns the resource key names, opening it with open the
	// first time this Corefile asks for it; whoever runs the handlers
	// owns what is opened: it keeps a resource a reloaded Corefile asks
	// for again, and closes the others once they no longer serve (and
	// all at shutdown). A collector's connection, a tap's queue or an
	// exporter live there, never in a package variable.
	Shared func(key string, open func() (io.Closer, error)) (io.Closer, error)
	// Stats returns the owner's value for key, made with make the first
	// time: counters and bounds shared by every block and kept for the
	// owner's life (a reload does not reset them), which its metrics read
	// (dnstap's Totals, trace's Stats).
	Stats func(key string, make func() any) any
}

// Setup builds a block's handler from cfg, the directive's configuration
// as the Corefile's parsing gave it; a nil Handler with no error: the
// directive does nothing in this block.
type Setup func(env Env, cfg any) (Handler, error)

var registered = registry.New[Setup]("answer")

// Register makes setup the answer-side handler of the directive name. It
// panics when name is registered twice (a programming error, found at
// start).
func Register(name string, setup Setup) { registered.Register(name, setup) }

// Registered returns the setup of the directive name; false: name has no
// answer-side handler.
func Registered(name string) (Setup, bool) { return registered.Get(name) }
