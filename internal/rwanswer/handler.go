package rwanswer

import "github.com/nodelocaldns/nodelocaldns/internal/answer"

// Rules are an answer.Handler: the block's rewrite ttl and rcode rules on
// every answer it sends (the rewrite directive registers them:
// internal/rewrite).

// Query lets the query pass: the rules act on answers only.
func (r *Rules) Query(_ *answer.Request, out []byte) ([]byte, answer.Verdict) {
	return out, answer.Pass
}

// Answer applies the rules to the answer, in place or replacing it by its
// repacking when that is no longer.
func (r *Rules) Answer(_ *answer.Request, out []byte, start int) []byte {
	return answer.Replace(out, start, r.Apply(out[start:]))
}
