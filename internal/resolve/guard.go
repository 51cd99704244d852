package resolve

import (
	"errors"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
)

// A panic while a flight is open must not end the process, nor leave the
// flight open: its waiters would never be answered, and every later asker
// of the question would join it (issue 41). Building and caching an
// upstream's answer (store), a fetch (run, runMiss: also goroutines of
// their own), starting an asynchronous fetch (Start) and each waiter's
// answer (finish) recover, report to package panics, and finish the
// flight with errRecovered: its
// clients get SERVFAIL and the next asker starts a new flight. finish
// counts only once, so a fetch that was under way when its flight was
// finished this way changes nothing when it ends.

// errRecovered is the error of a flight finished after a recovered panic.
var errRecovered = errors.New("recovered a panic (logged)")

// recoverFlight, deferred, finishes c with errRecovered after a panic.
func (r *Resolver) recoverFlight(c *call) {
	if p := recover(); p != nil {
		panics.Recovered(panics.Resolve, p, c.uq)
		r.stats.UpstreamErrors.Add(1)
		r.flights.finish(c, nil, errRecovered)
	}
}

// resolved hands a waiter its answer; a panic in it is its own and does
// not keep the flight's other waiters from theirs.
func resolved(w Waiter, e *cache.Entry, err error) {
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Resolve, p, nil)
		}
	}()
	w.Resolved(e, err)
}
