package server

import (
	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
)

// The one sequence every answer goes through before it is sent, whatever
// its transport (UDP, TCP) and wherever it came from (the cache, a
// handler, the server itself, a miss): the handlers of the query's block
// that let the query pass see it, innermost first (they may change it:
// rewrite's ttl and rcode rules, loadbalance; or observe it: dnstap, log,
// trace), then it counts under CoreDNS's names and goes to the query log.
// The block was found once, when the query arrived (answer), and its
// handlers saw the query then (answer.Chain.Query).

// chainRequest fills r.a, what the block's handlers see of r.
func (s *Server) chainRequest(r *request) {
	r.a = answer.Request{Q: &r.q, Raw: r.raw, Client: r.clientAddr(), Local: r.local, TCP: r.tcp, Start: r.t,
		EDNSSize: s.cfg.MaxUDPSize, Clock: s.cfg.Clock, Source: answer.FromCache}
}

// finish is the sequence for an answer given at once: out[start:] (over
// TCP without its length); own says the block's cache wrote it, not the
// server (CoreDNS's plugin label).
func (s *Server) finish(r *request, out []byte, start int, own bool) []byte {
	if r.blk != nil && r.blk.Answer != nil {
		out = r.blk.Answer.Answer(&r.a, out, start, r.depth)
	}
	resp := out[start:]
	if r.cd.c != nil && r.k.zone >= 0 && len(resp) > 3 {
		dur := int64(-1) // a UDP loop adds its batch's at flush
		if r.tcp {
			dur = s.cfg.Clock.Now().UnixNano() - r.now
		}
		r.cd.c.response(r.k, int(resp[3]&0xF), own, len(resp), dur)
	}
	if s.cfg.QueryLog != nil {
		s.logQuery(r.clientAddr(), r.tcp, &r.q, resp, answer.FromCache, r.t)
	}
	return out
}

// finishMiss is the sequence for a miss's answer (m.out, after TCP's
// length), then hands it to its transport, which returns m to the pool.
func (s *Server) finishMiss(m *missReq) {
	s.decorate(m)
	if m.tcp {
		s.deliverTCP(m)
	} else {
		m.l.reply(m)
	}
}

// decorate is finishMiss's sequence: the block's handlers, the counters,
// the query log. A panic on the way answers m SERVFAIL, undecorated
// (guard.go).
func (s *Server) decorate(m *missReq) {
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Miss, p, m.raw)
			s.recoveredMiss(m)
		}
	}()
	start := 0
	if m.tcp {
		start = 2
	}
	if m.blk != nil && m.blk.Answer != nil && !m.undecorated {
		m.a.Source = m.source
		m.out = m.blk.Answer.Answer(&m.a, m.out, start, m.blk.Answer.Len())
	}
	resp := m.out[start:]
	if s.cd != nil && m.cdk.zone >= 0 {
		if m.source == answer.FromStale {
			s.cd.cache(m.cdk, cdServedStale)
		}
		if len(resp) > 3 {
			s.cd.response(m.cdk, int(resp[3]&0xF), !m.cdSelf, len(resp), s.cfg.Clock.Now().Sub(m.t0).Nanoseconds())
		}
	}
	if s.cfg.QueryLog != nil {
		s.logQuery(m.client(), m.tcp, &m.q, resp, m.source, m.t0)
	}
}
