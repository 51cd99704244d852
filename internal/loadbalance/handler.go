package loadbalance

import "github.com/nodelocaldns/nodelocaldns/internal/answer"

// The loadbalance directive's handler: every answer of the block
// reordered (answer.Handler), hits too, as CoreDNS's loadbalance wraps
// the cache.

// setup builds a block's loadbalance from its *Policy (nil fields: plain
// round_robin).
func setup(_ answer.Env, cfg any) (answer.Handler, error) {
	p, _ := cfg.(*Policy)
	if p == nil {
		return nil, nil
	}
	if p.Weights == nil && len(p.Prefer) == 0 {
		return Handler{}, nil
	}
	return Handler{Policy: p}, nil
}

// Handler shuffles (round_robin) or applies Policy (weighted, prefer) to
// every answer of its block.
type Handler struct {
	answer.Passer
	Policy *Policy // nil: round_robin
}

// Answer reorders the answer in place, or replaces it by its repacking
// when that is no longer (a larger one could pass the client's size; it
// is then left as it is).
func (h Handler) Answer(_ *answer.Request, out []byte, start int) []byte {
	if h.Policy != nil {
		return answer.Replace(out, start, h.Policy.Apply(out[start:]))
	}
	return answer.Replace(out, start, Shuffle(out[start:]))
}
