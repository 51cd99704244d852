package server

import (
	"net/netip"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	"github.com/nodelocaldns/nodelocaldns/internal/rwanswer"
	"github.com/nodelocaldns/nodelocaldns/internal/trace"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Answers is what the block serving a name does to every answer it sends
// besides caching (Config.BlockAnswers).
type Answers struct {
	// Log is the block's log (the Corefile's log, CoreDNS's lines:
	// internal/dnslog); nil: none.
	Log *dnslog.Log
	// Shuffle: loadbalance shuffles its answers (internal/loadbalance).
	Shuffle bool
	// Balance is loadbalance's weighted policy or prefer subnets, applied
	// instead of the plain shuffle; nil: round_robin.
	Balance *loadbalance.Policy
	// Whoami: each query is answered with the client's own address and
	// port, before the cache (internal/whoami).
	Whoami bool
	// Trace is the block's trace (internal/trace); nil: none. Each query
	// of the block counts toward its sampling; a sampled one's span is
	// recorded once it is answered.
	Trace *trace.Tracer
	// Rewrite: the block's rewrite ttl and rcode rules, applied to every
	// answer (internal/rwanswer); nil: none.
	Rewrite *rwanswer.Rules
	// Taps are the block's dnstap directives (internal/dnstap): each gets
	// CLIENT_QUERY and CLIENT_RESPONSE of every query the block answers,
	// cache hits too (dnstap runs before cache in CoreDNS's plugin.cfg).
	Taps []*dnstap.Tap
}

// What the blocks do to every answer they send, besides caching (the
// Corefile's log, loadbalance and whoami): bits of Server.acts.
const (
	actLog uint32 = 1 << iota
	actShuffle
	actWhoami
	actTrace
	actRewrite
	actTap
)

// BlockActs says what some block of the block tables serving now does to
// its answers, besides caching.
type BlockActs struct {
	Log, Shuffle, Whoami bool
	Trace                bool // trace
	Rewrite              bool // rewrite ttl or rcode rules
	Tap                  bool // dnstap
}

// SetBlockActs says what some block of the block tables serving now does
// (BlockActs); while none
// does, the serving path asks no block (Config.BlockAnswers). The daemon
// calls it whenever it swaps the tables: a query at the swap may find the
// flags of one configuration and the block of the other, and is then
// answered as the one whose block it found (a flag on with a block that
// does nothing costs a lookup).
func (s *Server) SetBlockActs(b BlockActs) {
	var a uint32
	for _, f := range [...]struct {
		on  bool
		bit uint32
	}{{b.Log, actLog}, {b.Shuffle, actShuffle}, {b.Whoami, actWhoami}, {b.Trace, actTrace}, {b.Rewrite, actRewrite}, {b.Tap, actTap}} {
		if f.on {
			a |= f.bit
		}
	}
	if s.cfg.BlockAnswers == nil {
		a = 0
	}
	s.acts.Store(a)
}

// answersFor is what the block answering q does: asked of the policy its
// view's resolver serves the name by (Config.BlockAnswers), as the
// CoreDNS metric zone is; nothing when q has no question or no block acts
// (acts, loaded once by the caller, is zero).
func (s *Server) answersFor(acts uint32, q *wire.Query) Answers {
	if acts == 0 || !q.HasQ {
		return Answers{}
	}
	return s.cfg.BlockAnswers(s.resolver(q.View).Policy(q.Name))
}

// answersOf is answersFor of r's question, asked once per query (answer
// resets it).
func (s *Server) answersOf(r *request) Answers {
	if !r.blkOK {
		r.blk, r.blkOK = s.answersFor(r.acts, &r.q), true
	}
	return r.blk
}

// answerSide applies the block's rewrite ttl and rcode rules, then its
// loadbalance, to the answer at out[start:], the tail of out (CoreDNS's
// plugin.cfg: loadbalance, then rewrite, then cache).
func (s *Server) answerSide(a Answers, out []byte, start int) []byte {
	if a.Rewrite != nil {
		out = s.rewritten(a.Rewrite, out, start)
	}
	if a.Shuffle {
		out = s.shuffled(out, start, a.Balance)
	}
	return out
}

// rewritten applies rewrite's answer rules to the answer at out[start:]:
// in place, or replaced by its repacking when that is no longer.
func (s *Server) rewritten(r *rwanswer.Rules, out []byte, start int) []byte {
	resp := out[start:]
	n := r.Apply(resp)
	if len(n) == 0 || len(resp) == 0 || &n[0] == &resp[0] || len(n) > len(resp) {
		return out
	}
	return append(out[:start], n...)
}

// shuffled applies loadbalance (p: its weighted policy or prefer; nil:
// round_robin) to the answer at out[start:], the tail of out: in place, or
// replaced by its repacking when that is no longer (a larger one could
// pass the client's size; it is then left unshuffled).
func (s *Server) shuffled(out []byte, start int, p *loadbalance.Policy) []byte {
	resp := out[start:]
	var n []byte
	if p != nil {
		n = p.Apply(resp)
	} else {
		n = loadbalance.Shuffle(resp)
	}
	if len(n) == 0 || len(resp) == 0 || &n[0] == &resp[0] || len(n) > len(resp) {
		return out
	}
	return append(out[:start], n...)
}

// traced records the span of one answered query of a block with trace
// (t, its block's, not nil) when the query is its sampled one: the
// question, the answer's rcode (resp is the answer without TCP's
// length), the transport, the client, whether it came from upstream
// (miss) and the time since it arrived (start). Only a sampled query pays
// more than the count: its name rendered and a span queued.
func (s *Server) traced(t *trace.Tracer, client netip.Addr, tcp bool, q *wire.Query, resp []byte, miss bool, start time.Time) {
	if wire.EqualNameFold(q.Name, healthName) || !t.Sample() || len(resp) < wire.HeaderLen {
		return
	}
	t.Record(trace.Span{
		Start: start, Duration: s.cfg.Clock.Now().Sub(start),
		Name: wire.NameString(q.Name), QType: q.Type, Rcode: wire.Rcode(resp),
		TCP: tcp, Remote: client, Miss: miss,
	})
}

// tapQuery sends CLIENT_QUERY of the query raw from client, received at t,
// to each of taps (CoreDNS's dnstap plugin, before the rest of the block
// runs). Health probes are the daemon's own and are not tapped.
func (s *Server) tapQuery(taps []*dnstap.Tap, q *wire.Query, client netip.AddrPort, tcp bool, raw []byte, t time.Time) {
	if len(taps) == 0 || wire.EqualNameFold(q.Name, healthName) {
		return
	}
	m := dnstap.Message{Type: dnstap.ClientQuery, TCP: tcp, Query: client, QueryTime: t, QueryMessage: raw}
	for _, tp := range taps {
		tp.Send(&m)
	}
}

// tapResponse sends CLIENT_RESPONSE of the answer resp to the query
// received at t, once written (CoreDNS's dnstap ResponseWriter).
func (s *Server) tapResponse(taps []*dnstap.Tap, q *wire.Query, client netip.AddrPort, tcp bool, resp []byte, t time.Time) {
	if len(taps) == 0 || wire.EqualNameFold(q.Name, healthName) {
		return
	}
	m := dnstap.Message{Type: dnstap.ClientResponse, TCP: tcp, Query: client, QueryTime: t, ResponseTime: s.cfg.Clock.Now(), ResponseMessage: resp}
	for _, tp := range taps {
		tp.Send(&m)
	}
}

// tapAnswered sends both of a query answered at once (a hit, an error,
// whoami).
func (s *Server) tapAnswered(taps []*dnstap.Tap, q *wire.Query, client netip.AddrPort, tcp bool, raw, resp []byte, t time.Time) {
	s.tapQuery(taps, q, client, tcp, raw, t)
	s.tapResponse(taps, q, client, tcp, resp, t)
}
