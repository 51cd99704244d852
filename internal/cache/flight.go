package cache

import (
	"sync"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Flight coalesces concurrent misses: while one upstream query for a
// question is outstanding, later askers wait for its result instead of
// sending their own. Client misses, stale refreshes and prefetches all go
// through it, so there is at most one upstream query per question.
type Flight struct {
	mu    sync.Mutex
	calls map[flightKey]*Call
}

type flightKey struct {
	name   string // lower-cased wire name
	qtype  uint16
	qclass uint16
	flags  uint8
}

// Call is one upstream resolution. Done is closed when Entry and Err are
// set.
type Call struct {
	done  chan struct{}
	Entry *Entry
	Err   error
	dups  int
}

// Done is closed when the call has finished.
func (c *Call) Done() <-chan struct{} { return c.done }

// Start returns the call resolving the question of q, starting fn in its
// own goroutine if none is in flight. fn gets its own copy of the query,
// so it may outlive the caller (a client that stopped waiting, a
// background refresh). joined reports that the call was already running.
func (f *Flight) Start(q *wire.Query, fn func(q *wire.Query) (*Entry, error)) (c *Call, joined bool) {
	c, own, joined := f.join(q)
	if !joined {
		go f.run(c, own, fn)
	}
	return c, joined
}

// join returns the call in flight for q's question, or registers a new
// one (joined false) with the key and a private copy of the query.
func (f *Flight) join(q *wire.Query) (c *Call, own flightRun, joined bool) {
	lower := wire.AppendLower(make([]byte, 0, len(q.Name)), q.Name)
	k := flightKey{name: string(lower), qtype: q.Type, qclass: q.Class, flags: keyFlags(q)}
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[flightKey]*Call)
	}
	if c, ok := f.calls[k]; ok {
		c.dups++
		f.mu.Unlock()
		return c, flightRun{}, true
	}
	c = &Call{done: make(chan struct{})}
	f.calls[k] = c
	f.mu.Unlock()
	own = flightRun{key: k, q: *q}
	own.q.Name = lower
	return c, own, false
}

// flightRun is what a new call needs to run.
type flightRun struct {
	key flightKey
	q   wire.Query
}

func (f *Flight) run(c *Call, own flightRun, fn func(q *wire.Query) (*Entry, error)) {
	c.Entry, c.Err = fn(&own.q)
	f.mu.Lock()
	delete(f.calls, own.key)
	f.mu.Unlock()
	close(c.done)
}

// Do returns the result of resolving the question of q: the first caller
// runs fn itself (on its own copy of the query), later callers wait for
// it. shared reports whether the result came from another caller's run.
// Use Start when the caller may stop waiting.
func (f *Flight) Do(q *wire.Query, fn func(q *wire.Query) (*Entry, error)) (e *Entry, shared bool, err error) {
	c, own, joined := f.join(q)
	if joined {
		<-c.done
		return c.Entry, true, c.Err
	}
	f.run(c, own, fn)
	return c.Entry, false, c.Err
}

// InFlight reports how many distinct questions are being resolved.
func (f *Flight) InFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}
