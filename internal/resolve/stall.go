package resolve

import (
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
)

// Prefetches stop when the upstream stalls (issue 37). A prefetch that
// has not answered within the client timeout (its block's
// StaleClientTimeout: how long a client waits for a refresh) and then
// fails is not started again for its question until a fetch of that
// question answers, whoever started it (a client's miss, a stale entry's
// refresh). One pod that caches 1,100 names from an upstream that answers
// once and then stalls, and hits each twice in the last tenth of its TTL,
// had 1,100 prefetches hold the flights for the forward timeout, cycle
// after cycle; now they hold at most the prefetches' share (package fair)
// once, and never again for those names.
//
// What is remembered is bounded by the flight bound: past it an arbitrary
// question is forgotten (a prefetch of it may stall once more).

// isStalled reports whether the question of key k (appendFlightKey) had a
// prefetch stall that nothing answered since; f.mu is held.
func (f *flights) isStalled(k []byte) bool {
	if len(f.stalled) == 0 {
		return false
	}
	_, ok := f.stalled[string(k)] // no allocation for the lookup
	return ok
}

// noteStall records how c, finishing with err, leaves its question: a
// prefetch that failed after the client timeout stalls it; an answer,
// from any flight, ends the stall. f.mu is held.
func (f *flights) noteStall(c *call, err error) {
	switch {
	case err == nil:
		if len(f.stalled) > 0 {
			delete(f.stalled, c.key)
		}
	case c.owner == fair.Prefetch && f.clk.Now().UnixNano()-c.started >= int64(clientTimeout(c.blk)):
		if f.stalled == nil {
			f.stalled = make(map[string]struct{})
		}
		if len(f.stalled) >= f.shares.Max() {
			for k := range f.stalled {
				delete(f.stalled, k)
				break
			}
		}
		f.stalled[strings.Clone(c.key)] = struct{}{}
	}
}

// clientTimeout is how long a client of b waits for a refresh before it
// gets its stale answer: the policy's StaleClientTimeout, or the default
// when it is unset or immediate.
func clientTimeout(b *Block) time.Duration {
	if b != nil && b.Policy.StaleClientTimeout > 0 {
		return b.Policy.StaleClientTimeout
	}
	return DefaultStaleClientTimeout
}
