package server

import (
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// A panic anywhere in the serving path must not end the process (issue 41):
// a hostile or corrupt entry, an answer a directive cannot walk, a bug. Each
// place that still owes an answer recovers, reports to package panics (a
// count by place, one log line per place per ten seconds with the query's
// shape and the stack, never its name), answers SERVFAIL and goes on:
//
//   - a query answered from what is at hand (answerGuarded: the cache, the
//     errors, a handler's answer, and the one sequence after it: the
//     block's handlers, the counters, the query log), on UDP and TCP;
//   - a miss (miss.go, chain.go): starting it, writing the answer the
//     Resolver gave, and the sequence before it is delivered;
//   - what escapes those: the UDP receive loop starts again (the rest of
//     its batch is lost and retried by the clients), a TCP connection is
//     closed.
//
// The hit path pays one deferred call per query, which does nothing unless
// a panic is on its way (BenchmarkAnswerGuardedHit).

// answerGuarded is answerLocal, with a panic recovered: the query is
// answered SERVFAIL, replacing whatever was appended for it.
func (s *Server) answerGuarded(r *request, out []byte) (res []byte, v verdict) {
	start := len(out)
	defer func() {
		if p := recover(); p != nil {
			res, v = s.recoveredAnswer(r, p, out[:start]), answered
		}
	}()
	return s.answerLocal(r, out)
}

// recoveredAnswer reports the panic p met while answering r and appends
// SERVFAIL for it to out (nothing when r is no query at all).
func (s *Server) recoveredAnswer(r *request, p any, out []byte) []byte {
	where := panics.UDP
	if r.tcp {
		where = panics.TCP
	}
	panics.Recovered(where, p, r.raw)
	// The SERVFAIL goes undecorated: what the block does may be what
	// panicked, and would again in its query log, trace or dnstap.
	r.blk = nil
	n := len(out)
	out = appendServfail(out, r.raw, s.cfg.MaxUDPSize)
	if len(out) > n {
		r.st.countRcode(wire.RcodeServFail)
	}
	return out
}

// appendServfail appends SERVFAIL for the query raw, parsed afresh (what
// was parsed before the panic is not trusted). Should that panic too, the
// bare header is answered; a message that is no query gets nothing.
func appendServfail(out, raw []byte, size uint16) (res []byte) {
	start := len(out)
	defer func() {
		if p := recover(); p != nil {
			res = appendBareServfail(out[:start], raw)
		}
	}()
	var q wire.Query
	switch err := wire.ParseQuery(raw, &q); {
	case len(raw) < wire.HeaderLen || wire.Flags(raw)&wire.FlagQR != 0:
		return out // a response, or no header: dropped, as answer drops them
	case err != nil && !q.HasQ:
		return appendBareServfail(out, raw)
	}
	return wire.AppendError(out, raw, &q, wire.RcodeServFail, size)
}

// appendBareServfail appends a header alone: the query's ID, opcode and
// RD, QR and rcode SERVFAIL, no sections.
func appendBareServfail(out, raw []byte) []byte {
	if len(raw) < wire.HeaderLen {
		return out
	}
	f := wire.Flags(raw)&(0xF<<11|wire.FlagRD) | wire.FlagQR | wire.RcodeServFail
	return append(out, raw[0], raw[1], byte(f>>8), byte(f), 0, 0, 0, 0, 0, 0, 0, 0)
}
