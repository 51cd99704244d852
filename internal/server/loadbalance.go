package server

import (
	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// What the blocks do to every answer they send, besides caching (the
// Corefile's log and loadbalance): bits of Server.acts.
const (
	actLog uint32 = 1 << iota
	actShuffle
)

// SetBlockActs says whether some block of the block tables serving now
// logs and whether some shuffles; while neither, the serving path asks no
// block (Config.BlockAnswers). The daemon calls it whenever it swaps the
// tables: a query at the swap may find the flags of one configuration and
// the block of the other, and is then answered as the one whose block it
// found (a flag on with a block that does nothing costs a lookup).
func (s *Server) SetBlockActs(log, shuffle bool) {
	var a uint32
	if log {
		a |= actLog
	}
	if shuffle {
		a |= actShuffle
	}
	if s.cfg.BlockAnswers == nil {
		a = 0
	}
	s.acts.Store(a)
}

// blockAnswers is what the block answering q does to its answer: asked of
// the policy its view's resolver serves the name by (Config.BlockAnswers),
// as the CoreDNS metric zone is; nothing when q has no question or no
// block acts (acts, loaded once by the caller, is zero).
func (s *Server) blockAnswers(acts uint32, q *wire.Query) (*dnslog.Log, bool) {
	if acts == 0 || !q.HasQ {
		return nil, false
	}
	return s.cfg.BlockAnswers(s.resolver(q.View).Policy(q.Name))
}

// shuffled applies loadbalance to the answer at out[start:], the tail of
// out: in place, or replaced by its repacking when that is no longer (a
// larger one could pass the client's size; it is then left unshuffled).
func (s *Server) shuffled(out []byte, start int) []byte {
	resp := out[start:]
	n := loadbalance.Shuffle(resp)
	if len(n) == 0 || len(resp) == 0 || &n[0] == &resp[0] || len(n) > len(resp) {
		return out
	}
	return append(out[:start], n...)
}
