package server

import (
	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
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
	// Whoami: each query is answered with the client's own address and
	// port, before the cache (internal/whoami).
	Whoami bool
}

// What the blocks do to every answer they send, besides caching (the
// Corefile's log, loadbalance and whoami): bits of Server.acts.
const (
	actLog uint32 = 1 << iota
	actShuffle
	actWhoami
)

// SetBlockActs says whether some block of the block tables serving now
// logs, whether some shuffles and whether some answers whoami; while none
// does, the serving path asks no block (Config.BlockAnswers). The daemon
// calls it whenever it swaps the tables: a query at the swap may find the
// flags of one configuration and the block of the other, and is then
// answered as the one whose block it found (a flag on with a block that
// does nothing costs a lookup).
func (s *Server) SetBlockActs(log, shuffle, whoami bool) {
	var a uint32
	if log {
		a |= actLog
	}
	if shuffle {
		a |= actShuffle
	}
	if whoami {
		a |= actWhoami
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
