package cache

import (
	"sync"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Flight coalesces concurrent misses: while one upstream query for a
// question is outstanding, later askers wait for its result instead of
// sending their own.
type Flight struct {
	mu    sync.Mutex
	calls map[flightKey]*call
}

type flightKey struct {
	name   string // lower-cased wire name
	qtype  uint16
	qclass uint16
	flags  uint8
}

type call struct {
	done  chan struct{}
	entry *Entry
	err   error
	dups  int
}

// Do runs fn for the question of q unless a run for the same question is
// in flight, in which case it waits for that run's result. shared reports
// whether the result came from another caller's run. fn runs in the
// caller's goroutine.
func (f *Flight) Do(q *wire.Query, fn func() (*Entry, error)) (e *Entry, shared bool, err error) {
	k := flightKey{name: string(wire.AppendLower(make([]byte, 0, len(q.Name)), q.Name)), qtype: q.Type, qclass: q.Class, flags: keyFlags(q)}
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[flightKey]*call)
	}
	if c, ok := f.calls[k]; ok {
		c.dups++
		f.mu.Unlock()
		<-c.done
		return c.entry, true, c.err
	}
	c := &call{done: make(chan struct{})}
	f.calls[k] = c
	f.mu.Unlock()

	defer func() {
		f.mu.Lock()
		delete(f.calls, k)
		f.mu.Unlock()
		close(c.done)
	}()
	c.entry, c.err = fn()
	return c.entry, false, c.err
}

// InFlight reports how many distinct questions are being resolved.
func (f *Flight) InFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}
