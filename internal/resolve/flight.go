package resolve

import (
	"sync"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// flights coalesces concurrent misses: while one upstream query for a
// question is outstanding, later askers wait for its result instead of
// sending their own. Client misses, stale refreshes and prefetches all go
// through it, so there is at most one upstream query per question.
//
// It is also admission: at most max questions are in flight, and at most
// maxWaiters clients wait on one of them.
type flights struct {
	mu         sync.Mutex
	calls      map[flightKey]*call
	max        int
	maxWaiters int
}

type flightKey struct {
	name   string // lower-cased wire name
	qtype  uint16
	qclass uint16
	flags  uint8
}

// call is one upstream resolution. done is closed when entry and err are
// set.
type call struct {
	done    chan struct{}
	entry   *cache.Entry
	err     error
	waiters int // clients waiting on it (under flights.mu)
}

// flightRun is what a new call needs to run: its key and a private copy of
// the query (it may outlive the client that started it).
type flightRun struct {
	key flightKey
	q   wire.Query
}

// join returns the call in flight for q's question, or registers a new one
// (joined false). A waiting client (wait) counts against the question's
// waiter cap until it calls leave. ok is false when the call cannot be
// had: a new question over the flight bound, or a client over the waiter
// cap.
func (f *flights) join(q *wire.Query, wait bool) (c *call, own flightRun, joined, ok bool) {
	lower := wire.AppendLower(make([]byte, 0, len(q.Name)), q.Name)
	k := flightKey{name: string(lower), qtype: q.Type, qclass: q.Class, flags: cache.KeyFlags(q)}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[flightKey]*call)
	}
	if c, found := f.calls[k]; found {
		if wait {
			if c.waiters >= f.maxWaiters {
				return nil, flightRun{}, true, false
			}
			c.waiters++
		}
		return c, flightRun{}, true, true
	}
	if len(f.calls) >= f.max {
		return nil, flightRun{}, false, false
	}
	c = &call{done: make(chan struct{})}
	if wait {
		c.waiters = 1
	}
	f.calls[k] = c
	own = flightRun{key: k, q: *q}
	own.q.Name = lower
	return c, own, false, true
}

// leave ends a client's wait on c.
func (f *flights) leave(c *call) {
	f.mu.Lock()
	c.waiters--
	f.mu.Unlock()
}

// finish publishes the result of c and removes it from the flights.
func (f *flights) finish(c *call, own flightRun, e *cache.Entry, err error) {
	c.entry, c.err = e, err
	f.mu.Lock()
	delete(f.calls, own.key)
	f.mu.Unlock()
	close(c.done)
}

// inFlight reports how many distinct questions are being resolved.
func (f *flights) inFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}
