package resolve

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// flights coalesces concurrent misses: while one upstream query for a
// question is outstanding, later askers wait for its result instead of
// sending their own. Client misses, stale refreshes and prefetches all go
// through it, so there is at most one upstream query per question.
//
// It is also admission: at most max questions are in flight, apportioned
// among the clients that started them (package fair: the first asker owns
// a flight; one client cannot hold the whole bound, a newcomer always finds
// its share), and at most maxWaiters clients wait on one of them.
//
// A miss that nobody joins costs two allocations here: the call, and one
// buffer sized to the question that holds its lower-cased name, the map key
// (the name and 5 bytes, a string over the same bytes) and, for Start, the
// upstream query.
type flights struct {
	mu         sync.Mutex
	calls      map[string]*call // key: see appendFlightKey
	shares     *fair.Shares     // flights by owner, at most the flight bound
	maxWaiters int
	// overShare counts new questions refused because their asker held
	// its share and only the reserve was free (Stats.ShareRejected).
	overShare *atomic.Uint64
	// stalled: the questions whose prefetch failed after the client
	// timeout or later (stall.go), by key, at most max of them; clk
	// times the flights for it.
	stalled map[string]struct{}
	clk     clock.Clock
}

// newFlights returns flights bounded to max questions, maxWaiters clients
// waiting on each.
func newFlights(max, maxWaiters int, overShare *atomic.Uint64, clk clock.Clock) flights {
	return flights{shares: fair.New(max), maxWaiters: maxWaiters, overShare: overShare, clk: clock.Or(clk)}
}

// maxFlightKey is the longest key: a wire name (255 bytes at most, RFC 1035
// 3.1) and 5 bytes of type, class and flags.
const maxFlightKey = 255 + 5

// appendFlightKey appends q's key to dst: the lower-cased wire name (self-
// delimiting, so nothing after it can be mistaken for part of it), type,
// class and the cache key flags (DO, CD).
func appendFlightKey(dst []byte, q *wire.Query) []byte {
	dst = wire.AppendLower(dst, q.Name)
	dst = binary.BigEndian.AppendUint16(dst, q.Type)
	dst = binary.BigEndian.AppendUint16(dst, q.Class)
	return append(dst, cache.KeyFlags(q))
}

// call is one upstream resolution. done, when made, is closed once entry
// and err are set.
type call struct {
	// done is made only for a call someone waits on while another
	// goroutine runs it (a second asker, or the first asker of a stale
	// refresh): the first asker of a miss runs it itself and needs no
	// channel, and most misses have no second asker. Set under flights.mu,
	// before the call is in the map or while it is.
	done    chan struct{}
	entry   *cache.Entry
	err     error
	kept    bool       // entry is the one prefer_positive kept, not the upstream's answer
	waiters int        // clients waiting on it (under flights.mu)
	owner   netip.Addr // the first asker, whose flight share it takes
	started int64      // unix ns (flights.clk), for stall.go
	// finished: finish has run (under flights.mu).
	finished bool

	// What the run needs, private to the call (it may outlive the client
	// that started it): the key, and the query with its name lower-cased
	// (both in buf).
	key string
	q   wire.Query
	buf []byte

	// Waiters of Resolver.Start (under flights.mu until finish takes them), and what a
	// started fetch needs when its answer comes (Fetched).
	w0   Waiter
	more []Waiter
	r    *Resolver
	uq   []byte
	// blk is the block of the question, as its first asker's lookup found
	// it: its policy builds the entry, its fetch asks upstream.
	blk *Block
}

// upstreamQueryExtra is what an upstream query holds beside its name: header (12), type and
// class (4), an OPT record with no options (11).
const upstreamQueryExtra = 12 + 4 + 11

// joinAsync is join for a Waiter: w counts against the question's waiter cap and is called at
// finish.
func (f *flights) joinAsync(q *wire.Query, b *Block, w Waiter) (c *call, joined, ok bool) {
	return f.joinWith(q, b, true, false, w)
}

// addWaiter registers w on c; f.mu is held.
func (c *call) addWaiter(w Waiter) {
	if c.w0 == nil {
		c.w0 = w
	} else {
		c.more = append(c.more, w)
	}
}

// join returns the call in flight for q's question, or registers a new one
// (joined false) owned by q's client (owner) for the question's block b.
// A waiting client (wait) counts against the question's waiter cap until
// it calls leave. A call returned joined, or new with needDone, has its
// done channel. ok is false when the call cannot be had: a new question
// over the flight bound or its asker's share of it (the latter counted in
// overShare), or a client over the waiter cap.
func (f *flights) join(q *wire.Query, b *Block, wait, needDone bool) (c *call, joined, ok bool) {
	return f.joinWith(q, b, wait, needDone, nil)
}

// joinWith is join, registering w (when not nil) as a waiter under the same lock: a waiter
// needs no done channel.
func (f *flights) joinWith(q *wire.Query, b *Block, wait, needDone bool, w Waiter) (c *call, joined, ok bool) {
	var kb [maxFlightKey]byte
	k := kb[:0]
	if len(q.Name) > 255 {
		k = make([]byte, 0, len(q.Name)+5) // the parser never lets one through
	}
	k = appendFlightKey(k, q)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[string]*call)
	}
	if c, found := f.calls[string(k)]; found { // no allocation for the lookup
		if wait {
			if c.waiters >= f.maxWaiters {
				return nil, true, false
			}
			c.waiters++
		}
		if w != nil {
			c.addWaiter(w)
		} else if c.done == nil {
			c.done = make(chan struct{})
		}
		return c, true, true
	}
	who := owner(q)
	if who == fair.Prefetch && f.isStalled(k) {
		return nil, false, false
	}
	switch f.shares.Take(who) {
	case fair.Taken:
	case fair.OverShare:
		if who != fair.Prefetch { // a prefetch over its share is skipped, not a client refused
			f.overShare.Add(1)
		}
		return nil, false, false
	default:
		return nil, false, false
	}
	// The key's bytes, then room for the upstream query (Start), in one
	// buffer; the key string is those bytes, which nothing changes.
	buf := make([]byte, len(k), len(k)+len(k)+upstreamQueryExtra)
	copy(buf, k)
	c = &call{key: unsafe.String(&buf[0], len(k)), q: *q, buf: buf, owner: who, blk: b, started: f.clk.Now().UnixNano()}
	c.q.Name = buf[:len(q.Name):len(q.Name)] // the lower-cased name starts the key
	if needDone {
		c.done = make(chan struct{})
	}
	if wait {
		c.waiters = 1
	}
	if w != nil {
		c.addWaiter(w)
	}
	f.calls[c.key] = c
	return c, false, true
}

// owner is the client whose share a new flight for q takes: q.Client, the
// key the server gave it (package fair), or its address when it has none
// (a caller outside the server); the zero address is held to the bound
// only.
func owner(q *wire.Query) netip.Addr {
	if q.Client.IsValid() {
		return q.Client
	}
	return q.From
}

// leave ends a client's wait on c.
func (f *flights) leave(c *call) {
	f.mu.Lock()
	c.waiters--
	f.mu.Unlock()
}

// finish publishes the result of c and removes it from the flights.
//
// Only the first finish of a call counts: after a panic recovered on the
// way (guard.go) a call may be finished with an error before the fetch
// that was under way finishes it again.
func (f *flights) finish(c *call, e *cache.Entry, err error) {
	f.mu.Lock()
	if c.finished {
		f.mu.Unlock()
		return
	}
	c.finished = true
	c.entry, c.err = e, err
	delete(f.calls, c.key)
	f.shares.Put(c.owner)
	f.noteStall(c, err)
	done := c.done // no one can join (and make it) once the call is out of the map
	w0, more := c.w0, c.more
	c.w0, c.more = nil, nil
	f.mu.Unlock()
	if done != nil {
		close(done)
	}
	if w0 != nil {
		resolved(w0, e, err)
	}
	for _, w := range more {
		resolved(w, e, err)
	}
}

// inFlight reports how many distinct questions are being resolved.
func (f *flights) inFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}
