package server

import (
	"net/netip"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// shuffled applies the Corefile's loadbalance (Config.Shuffle, not nil) to
// the answer at out[start:], the tail of out, for q arriving on local: in
// place, or replaced by its repacking when that is no longer (a larger one
// could pass the client's size; it is then left unshuffled).
func (s *Server) shuffled(out []byte, start int, local netip.Addr, q *wire.Query) []byte {
	if !q.HasQ {
		return out
	}
	resp := out[start:]
	n := s.cfg.Shuffle.Apply(local, q.Name, resp)
	if len(n) == 0 || len(resp) == 0 || &n[0] == &resp[0] || len(n) > len(resp) {
		return out
	}
	return append(out[:start], n...)
}
