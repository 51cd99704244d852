package server

import (
	"context"
	"net/netip"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Autopath is -autopath's part in serving (internal/autopath, wired by the
// daemon): a pod's search-path query answered in one round trip. The
// server asks Candidate on the hot path after the cache lookup: a cached
// answer other than NXDOMAIN is served as any hit (the first candidate
// exists: autopath would decline); a miss or a cached NXDOMAIN leaves the
// serving loop as a miss, and the miss goroutine asks Answer. The
// candidates resolve through the view the query arrived on
// (CandidateView).
type Autopath interface {
	// Candidate reports whether q may be a search-path query autopath
	// answers (A or AAAA for X.<ns>.svc.<cluster domain>, while the pod
	// watch is synced). It must not allocate: it runs for every query.
	Candidate(q *wire.Query) bool
	// Answer is the autopath answer to qname (as the client wrote it)
	// and qtype from src, or nil to answer as usual. An error means the
	// decision was not known before ctx ended: the query is dropped, not
	// answered as usual (the other query of the pair may get the autopath
	// answer, and the two must agree).
	Answer(ctx context.Context, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error)
}

// isCandidate is the hot path's test: one nil check with autopath off.
func (s *Server) isCandidate(q *wire.Query) bool {
	return s.cfg.Autopath != nil && s.cfg.Autopath.Candidate(q)
}

// answerAutopath answers a candidate miss when autopath does, and reports
// whether it did (m.out holds the answer, or nothing: dropped). The
// answer depends on the pod asking: it is never stored in the cache.
func (s *Server) answerAutopath(m *missReq) bool {
	if !s.isCandidate(&m.q) {
		return false // the watch was lost since the serving loop looked
	}
	var qm dns.Msg
	if err := qm.Unpack(m.raw); err != nil || len(qm.Question) != 1 {
		return false
	}
	src := m.client().Addr()
	ctx := context.WithValue(context.Background(), viewKey{}, candidateView{m.res, m.q.View})
	if m.q.From.IsValid() {
		ctx = resolve.WithAsker(ctx, m.q.From) // for the candidates' fetches
	}
	ans, err := s.cfg.Autopath.Answer(ctx, src, qm.Question[0].Name, m.q.Type)
	if err != nil {
		m.source = answer.FromAutopath
		s.stats.Dropped.Add(1)
		return true
	}
	if ans == nil {
		return false
	}
	ans.Id = m.q.ID
	ans.Response = true
	ans.Opcode = int(m.q.Opcode)
	ans.RecursionDesired = m.q.Flags&wire.FlagRD != 0
	ans.RecursionAvailable = true
	ans.CheckingDisabled = m.q.CD()
	ans.Authoritative, ans.AuthenticatedData, ans.Truncated = false, false, false
	ans.Extra = nil
	if m.q.EDNS {
		ans.SetEdns0(s.cfg.MaxUDPSize, m.q.DO)
	}
	if !m.tcp {
		// miekg/dns's rule, the one the cache's truncation follows
		// (docs/design.md, "Truncation").
		ans.Truncate(s.maxSize(&m.q, false))
	}
	ans.Compress = true
	packed, err := ans.PackBuffer(m.out[len(m.out):cap(m.out)])
	if err != nil {
		s.cfg.Logger.Warn("autopath answer not packed; answering as usual", "name", qm.Question[0].Name, "err", err)
		return false
	}
	m.out = append(m.out, packed...)
	m.source = answer.FromAutopath
	s.stats.countRcode(ans.Rcode)
	return true
}

type viewKey struct{}

type candidateView struct {
	res  *resolve.Resolver
	view uint8
}

// CandidateView is the view a candidate query arrived on, from the context
// Answer is called with: its resolver and its index (wire.Query.View, part
// of the cache key). Autopath resolves the candidates through it, so a
// view's own zones, forwards and refusals apply and its answers are cached
// under its key. ok is false outside Answer.
func CandidateView(ctx context.Context) (res *resolve.Resolver, view uint8, ok bool) {
	v, ok := ctx.Value(viewKey{}).(candidateView)
	return v.res, v.view, ok
}
