package resolve

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// starter is a StartFunc the test steers: each start is kept until the test
// answers it through the upstream's fetch (so answers are built the same way
// as Resolve's), or declined.
type starter struct {
	up      *upstream
	decline atomic.Bool
	mu      sync.Mutex
	started []started
}

type started struct {
	qname []byte
	query []byte
	done  FetchDone
}

func (s *starter) start(_ *Block, qname []byte, query []byte, _ netip.AddrPort, _ time.Duration, done FetchDone) bool {
	if s.decline.Load() {
		return false
	}
	s.mu.Lock()
	s.started = append(s.started, started{append([]byte(nil), qname...), query, done})
	s.mu.Unlock()
	return true
}

func (s *starter) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.started)
}

// answer completes the i-th start with what the upstream's fetch gives.
func (s *starter) answer(i int) {
	s.mu.Lock()
	st := s.started[i]
	s.mu.Unlock()
	st.done.Fetched(s.up.fetch(context.Background(), wire.NameString(st.qname), st.query))
}

// waiter records what Resolved gave, and how often it was called.
type waiter struct {
	calls atomic.Int32
	e     *cache.Entry
	err   error
	done  chan struct{}
}

func newWaiter() *waiter { return &waiter{done: make(chan struct{})} }

func (w *waiter) Resolved(e *cache.Entry, err error) {
	if w.calls.Add(1) == 1 {
		w.e, w.err = e, err
		close(w.done)
	}
}

func (w *waiter) wait(t *testing.T) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Resolved not called")
	}
}

func newStartEnv(t *testing.T, mutate func(*Config)) (*env, *starter) {
	t.Helper()
	var s *starter
	e := newEnv(t, func(c *Config) {
		c.Start = func(b *Block, qname []byte, query []byte, asker netip.AddrPort, timeout time.Duration, done FetchDone) bool {
			return s.start(b, qname, query, asker, timeout, done)
		}
		if mutate != nil {
			mutate(c)
		}
	})
	s = &starter{up: e.up}
	return e, s
}

// Start coalesces Waiters and blocking askers on one upstream query, caches
// the answer, and calls every Waiter exactly once with it.
func TestStartCoalescesWaitersAndBlockingAskers(t *testing.T) {
	e, s := newStartEnv(t, nil)
	q := question(t, "a.example.")
	const n = 20
	var ws []*waiter
	for i := 0; i < n; i++ {
		w := newWaiter()
		ws = append(ws, w)
		if _, how, err := e.r.Start(q, nil, w); how != Later || err != nil {
			t.Fatalf("Start %d: %v %v", i, how, err)
		}
	}
	blocked := e.resolveAsync(q) // a blocking asker joins the started flight
	waitFor(t, "the blocking asker to join", func() bool {
		e.r.flights.mu.Lock()
		defer e.r.flights.mu.Unlock()
		for _, c := range e.r.flights.calls {
			return c.waiters == n+1
		}
		return false
	})
	if s.count() != 1 {
		t.Fatalf("%d fetches started, want 1", s.count())
	}
	if string(s.started[0].qname) != string(wire.AppendLower(nil, q.Name)) {
		t.Fatalf("started for %q", s.started[0].qname)
	}
	s.answer(0)
	for i, w := range ws {
		w.wait(t)
		if w.err != nil || addrOf(t, w.e, q) != "192.0.2.1" {
			t.Fatalf("waiter %d: %v %v", i, w.e, w.err)
		}
	}
	if r := <-blocked; r.err != nil || r.stale || addrOf(t, r.e, q) != "192.0.2.1" {
		t.Fatalf("blocking asker: %+v", r)
	}
	if e.up.calls.Load() != 1 {
		t.Fatalf("%d upstream queries, want 1", e.up.calls.Load())
	}
	for i, w := range ws {
		if c := w.calls.Load(); c != 1 {
			t.Fatalf("waiter %d called %d times", i, c)
		}
	}
	st := e.r.Stats()
	if st.Misses.Load() != n+1 || st.Coalesced.Load() != n || e.r.InFlight() != 0 {
		t.Fatalf("misses %d coalesced %d in flight %d", st.Misses.Load(), st.Coalesced.Load(), e.r.InFlight())
	}
	// Cached: the next asker hits.
	if en, how, _ := e.r.Start(q, nil, newWaiter()); how != Now || en == nil {
		t.Fatalf("after the answer: %v %v", how, en)
	}
}

// A Waiter joins a flight a blocking asker started (a miss worker's), and gets
// its answer.
func TestStartJoinsABlockingFlight(t *testing.T) {
	e, s := newStartEnv(t, nil)
	q := question(t, "b.example.")
	release := e.up.block()
	first := e.resolveAsync(q)
	waitFor(t, "the blocking fetch", func() bool { return e.up.calls.Load() == 1 })
	w := newWaiter()
	if _, how, _ := e.r.Start(q, nil, w); how != Later {
		t.Fatalf("Start: %v", how)
	}
	release()
	w.wait(t)
	if w.err != nil || addrOf(t, w.e, q) != "192.0.2.1" || s.count() != 0 {
		t.Fatalf("waiter: %v %v, %d starts", w.e, w.err, s.count())
	}
	<-first
}

// A stale entry is Resolve's (its client may get the stale answer when the
// refresh is slow); without a StartFunc everything is.
func TestStartLeavesStaleToResolve(t *testing.T) {
	e, s := newStartEnv(t, nil)
	q := question(t, "stale.example.")
	s.decline.Store(true) // warm through the blocking fetch
	e.warmAndExpire(t, q, "192.0.2.7")
	s.decline.Store(false)
	if _, how, _ := e.r.Start(q, nil, newWaiter()); how != Blocking {
		t.Fatalf("stale: %v, want Blocking", how)
	}
	if s.count() != 0 || e.r.InFlight() != 0 {
		t.Fatal("Start left something behind for a stale question")
	}
	plain := newEnv(t, nil)
	if _, how, _ := plain.r.Start(question(t, "x.example."), nil, newWaiter()); how != Blocking {
		t.Fatalf("no StartFunc: %v, want Blocking", how)
	}
}

// A declined start (not a plain forward) fetches through Fetch in a
// goroutine; the Waiters still get the answer.
func TestStartDeclinedFetchesWithFetch(t *testing.T) {
	e, s := newStartEnv(t, nil)
	s.decline.Store(true)
	q := question(t, "c.example.")
	w := newWaiter()
	if _, how, _ := e.r.Start(q, nil, w); how != Later {
		t.Fatalf("Start: %v", how)
	}
	w.wait(t)
	if w.err != nil || addrOf(t, w.e, q) != "192.0.2.1" || e.up.calls.Load() != 1 {
		t.Fatalf("waiter: %v %v, %d fetches", w.e, w.err, e.up.calls.Load())
	}
}

// Failures: a fetch error reaches every Waiter as an error (counted, not
// cached); an upstream SERVFAIL is cached for ServFailTTL, as Resolve does.
func TestStartFailures(t *testing.T) {
	e, s := newStartEnv(t, nil)
	q := question(t, "fail.example.")
	boom := errors.New("boom")
	e.up.set(dns.RcodeSuccess, "", boom)
	w1, w2 := newWaiter(), newWaiter()
	e.r.Start(q, nil, w1)
	e.r.Start(q, nil, w2)
	s.answer(0)
	w1.wait(t)
	w2.wait(t)
	if !errors.Is(w1.err, boom) || !errors.Is(w2.err, boom) || w1.e != nil {
		t.Fatalf("got %v %v / %v", w1.e, w1.err, w2.err)
	}
	if e.r.Stats().UpstreamErrors.Load() != 1 {
		t.Fatalf("upstream errors %d", e.r.Stats().UpstreamErrors.Load())
	}
	e.up.set(dns.RcodeServerFailure, "", nil)
	w3 := newWaiter()
	e.r.Start(q, nil, w3)
	s.answer(1)
	w3.wait(t)
	if w3.err != nil || w3.e.Rcode() != dns.RcodeServerFailure {
		t.Fatalf("SERVFAIL: %v %v", w3.e, w3.err)
	}
	if en, how, _ := e.r.Start(q, nil, newWaiter()); how != Now || en.Rcode() != dns.RcodeServerFailure {
		t.Fatalf("SERVFAIL not cached: %v %v", how, en)
	}
}

// Admission: past MaxFlights questions or MaxWaiters askers, Start rejects at
// once with ErrOverloaded and registers nothing.
func TestStartAdmission(t *testing.T) {
	e, s := newStartEnv(t, func(c *Config) { c.MaxFlights, c.MaxWaiters = 2, 2 })
	a, b, c := question(t, "a.example."), question(t, "b.example."), question(t, "c.example.")
	for _, q := range []*wire.Query{a, a, b} {
		if _, how, _ := e.r.Start(q, nil, newWaiter()); how != Later {
			t.Fatalf("Start %s: %v", wire.NameString(q.Name), how)
		}
	}
	w := newWaiter()
	if _, how, err := e.r.Start(a, nil, w); how != Now || !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third waiter: %v %v", how, err)
	}
	if _, how, err := e.r.Start(c, nil, w); how != Now || !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third question: %v %v", how, err)
	}
	if w.calls.Load() != 0 || s.count() != 2 || e.r.Stats().Rejected.Load() != 2 {
		t.Fatalf("rejected waiter called %d times, %d starts, %d rejected", w.calls.Load(), s.count(), e.r.Stats().Rejected.Load())
	}
	s.answer(0)
	s.answer(1)
	if e.r.InFlight() != 0 {
		t.Fatalf("%d in flight", e.r.InFlight())
	}
}

// A flight that finished between the caller's lookup and its Start: the
// Waiter gets the cached answer at once, with no second upstream query.
func TestStartLateAskerTakesTheCachedAnswer(t *testing.T) {
	e, s := newStartEnv(t, nil)
	q := question(t, "late.example.")
	w := newWaiter()
	e.r.Start(q, nil, w)
	s.answer(0)
	w.wait(t)
	// Forge the interleaving: a new flight for a question now in the cache.
	c, joined, ok := e.r.flights.joinAsync(q, e.r.Block(q.Name), newWaiter())
	if joined || !ok {
		t.Fatal("join")
	}
	e.r.flights.finish(c, nil, nil)
	w2 := newWaiter()
	if en, how, _ := e.r.Start(q, nil, w2); how != Now || en == nil {
		t.Fatalf("Start: %v", how)
	}
	if s.count() != 1 || e.up.calls.Load() != 1 {
		t.Fatalf("%d starts, %d fetches", s.count(), e.up.calls.Load())
	}
}

// Concurrent Starts and answers under -race: each Waiter is called exactly
// once, and one upstream query is made per question.
func TestStartConcurrent(t *testing.T) {
	e, s := newStartEnv(t, nil)
	qs := []*wire.Query{question(t, "a.example."), question(t, "b.example."), question(t, "c.example.")}
	var ws []*waiter
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				w := newWaiter()
				mu.Lock()
				ws = append(ws, w)
				mu.Unlock()
				if _, how, err := e.r.Start(qs[(g+i)%len(qs)], nil, w); how == Now {
					w.Resolved(nil, err) // a hit or a rejection: answered here
				}
			}
		}(g)
	}
	allStarted := make(chan struct{})
	go func() { wg.Wait(); close(allStarted) }()
	// Answer whatever starts, as an upstream's reader would, until every
	// Start has returned and every started fetch is answered.
answering:
	for next := 0; ; {
		if next < s.count() {
			s.answer(next)
			next++
			continue
		}
		select {
		case <-allStarted:
			if next == s.count() {
				break answering
			}
		default:
			time.Sleep(50 * time.Microsecond)
		}
	}
	for i, w := range ws {
		w.wait(t)
		if c := w.calls.Load(); c != 1 {
			t.Fatalf("waiter %d called %d times", i, c)
		}
	}
	if s.count() != len(qs) {
		t.Fatalf("%d upstream queries for %d questions", s.count(), len(qs))
	}
}
