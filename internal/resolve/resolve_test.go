package resolve

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// upstream is a fetch function the test steers: each call takes the next
// reply from the test (an answer built by the handler), or blocks until
// the test releases it.
type upstream struct {
	calls atomic.Int64
	mu    sync.Mutex
	// reply builds the answer to a query: rcode and the A record's address
	// ("" for none); err fails the fetch.
	rcode int
	addr  string
	err   error
	gate  chan struct{} // when set, calls wait for it to close
}

func (u *upstream) set(rcode int, addr string, err error) {
	u.mu.Lock()
	u.rcode, u.addr, u.err = rcode, addr, err
	u.mu.Unlock()
}

func (u *upstream) block() (release func()) {
	ch := make(chan struct{})
	u.mu.Lock()
	u.gate = ch
	u.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			if u.gate == ch {
				u.gate = nil
			}
			u.mu.Unlock()
			close(ch)
		})
	}
}

func (u *upstream) fetch(ctx context.Context, _ string, query []byte) ([]byte, error) {
	u.calls.Add(1)
	u.mu.Lock()
	gate := u.gate
	u.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	u.mu.Lock()
	rcode, addr, err := u.rcode, u.addr, u.err
	u.mu.Unlock()
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	if err := m.Unpack(query); err != nil {
		return nil, err
	}
	r := new(dns.Msg)
	r.SetRcode(m, rcode)
	if addr != "" {
		r.Answer = append(r.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A:   net.ParseIP(addr),
		})
	}
	return r.Pack()
}

var testPolicy = Policy{
	TTL:                cache.Policy{SuccessMax: time.Hour, DenialMax: time.Hour},
	ServFailTTL:        2 * time.Second,
	StaleWindow:        time.Hour,
	StaleClientTimeout: 1800 * time.Millisecond,
	StaleRecheck:       30 * time.Second,
}

type env struct {
	r   *Resolver
	c   *cache.Cache
	clk *clock.Fake
	up  *upstream
}

func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	e := &env{c: cache.New(cache.Config{}), clk: clock.NewFake(time.Unix(1_700_000_000, 0)), up: &upstream{addr: "192.0.2.1"}}
	pol, err := Zones(testPolicy)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Cache: e.c, Fetch: e.up.fetch, Blocks: pol, Clock: e.clk}
	if mutate != nil {
		mutate(&cfg)
	}
	if e.r, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func question(t testing.TB, name string) *wire.Query {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q := new(wire.Query)
	if err := wire.ParseQuery(raw, q); err != nil {
		t.Fatal(err)
	}
	return q
}

// addrOf is the A record an entry answers with.
func addrOf(t *testing.T, e *cache.Entry, q *wire.Query) string {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(e.WriteStale(nil, q, 0xFFFF, 1232)); err != nil {
		t.Fatal(err)
	}
	if len(m.Answer) == 0 {
		return dns.RcodeToString[m.Rcode]
	}
	return m.Answer[0].(*dns.A).A.String()
}

// waitFor polls cond until it holds or 5 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type result struct {
	e     *cache.Entry
	stale bool
	err   error
}

func (e *env) resolveAsync(q *wire.Query) <-chan result {
	ch := make(chan result, 1)
	go func() {
		en, stale, err := e.r.Resolve(context.Background(), q, nil)
		ch <- result{en, stale, err}
	}()
	return ch
}

// warm caches the answer addr for q and lets it expire (30 s TTL), so the
// next Resolve finds it stale.
func (e *env) warmAndExpire(t *testing.T, q *wire.Query, addr string) {
	t.Helper()
	e.up.set(dns.RcodeSuccess, addr, nil)
	if en, stale, err := e.r.Resolve(context.Background(), q, nil); err != nil || stale || addrOf(t, en, q) != addr {
		t.Fatalf("warm: %v %v %v", en, stale, err)
	}
	e.clk.Advance(31 * time.Second)
	if _, st, _ := e.c.Lookup(q, e.clk.Now().UnixNano()); st != cache.Stale {
		t.Fatalf("entry is %v, want stale", st)
	}
}

func TestCoalescing(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "a.example.")
	release := e.up.block()
	const n = 50
	var results []<-chan result
	for i := 0; i < n; i++ {
		results = append(results, e.resolveAsync(q))
	}
	waitFor(t, "all askers to join", func() bool {
		e.r.flights.mu.Lock()
		defer e.r.flights.mu.Unlock()
		for _, c := range e.r.flights.calls {
			return c.waiters == n
		}
		return false
	})
	release()
	for _, ch := range results {
		r := <-ch
		if r.err != nil || r.stale || addrOf(t, r.e, q) != "192.0.2.1" {
			t.Fatalf("got %+v", r)
		}
	}
	if c := e.up.calls.Load(); c != 1 {
		t.Fatalf("%d upstream queries, want 1", c)
	}
	st := e.r.Stats()
	if st.Coalesced.Load() != n-1 || st.Misses.Load() != n || st.Stale.Load() != 0 {
		t.Fatalf("coalesced %d misses %d stale %d", st.Coalesced.Load(), st.Misses.Load(), st.Stale.Load())
	}
}

// A flight that finishes between a client's cache lookup and its join must
// not make that client ask again (seen in CI: two upstream queries for one
// popular name under load). The interleaving is forced: the flight's answer
// is in the cache when the late client becomes the owner of a new flight.
func TestLateAskerTakesTheFinishedFlightsAnswer(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "late.example.com.")
	if res := <-e.resolveAsync(q); res.err != nil {
		t.Fatal(res.err)
	}
	if c := e.up.calls.Load(); c != 1 {
		t.Fatalf("%d upstream queries for the first asker", c)
	}
	// The late client looked before the answer was put, then joined.
	c, joined, ok := e.r.flights.join(q, e.r.Block(q.Name), true, false)
	if joined || !ok {
		t.Fatalf("join: joined %v ok %v", joined, ok)
	}
	e.r.runMiss(c)
	e.r.flights.leave(c)
	if c.err != nil || c.entry == nil {
		t.Fatalf("late client got %v, %v", c.entry, c.err)
	}
	if n := e.up.calls.Load(); n != 1 {
		t.Fatalf("%d upstream queries, want 1: the late client asked again", n)
	}
}

func TestStaleServedAfterClientTimeout(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "slow.example.")
	e.warmAndExpire(t, q, "192.0.2.1")
	release := e.up.block()
	defer release()
	e.up.set(dns.RcodeSuccess, "192.0.2.2", nil)
	ch := e.resolveAsync(q)
	waitFor(t, "the client to wait", func() bool { return e.clk.Timers() == 1 })
	select {
	case r := <-ch:
		t.Fatalf("answered before the client timeout: %+v", r)
	default:
	}
	e.clk.Advance(testPolicy.StaleClientTimeout)
	r := <-ch
	if r.err != nil || !r.stale || addrOf(t, r.e, q) != "192.0.2.1" {
		t.Fatalf("got %+v, want the stale answer", r)
	}
	// The refresh goes on and replaces the entry when it comes.
	release()
	waitFor(t, "the refresh", func() bool { return e.r.InFlight() == 0 })
	if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h == nil || addrOf(t, h, q) != "192.0.2.2" {
		t.Fatalf("after the refresh: %v", h)
	}
}

func TestStaleServedAtOnceDuringRecheck(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "down.example.")
	e.warmAndExpire(t, q, "192.0.2.1")
	e.up.set(0, "", errors.New("upstream down"))
	en, stale, err := e.r.Resolve(context.Background(), q, nil)
	if err != nil || !stale || addrOf(t, en, q) != "192.0.2.1" {
		t.Fatalf("failed refresh: %v %v %v", en, stale, err)
	}
	calls := e.up.calls.Load()
	// Within the recheck interval: stale at once, no upstream query, no
	// timer.
	for i := 0; i < 3; i++ {
		e.clk.Advance(5 * time.Second)
		en, stale, err := e.r.Resolve(context.Background(), q, nil)
		if err != nil || !stale || addrOf(t, en, q) != "192.0.2.1" {
			t.Fatalf("during recheck: %v %v %v", en, stale, err)
		}
	}
	if c := e.up.calls.Load(); c != calls {
		t.Fatalf("%d upstream queries during the recheck interval", c-calls)
	}
	// After it, the upstream is asked again.
	e.clk.Advance(testPolicy.StaleRecheck)
	e.up.set(dns.RcodeSuccess, "192.0.2.3", nil)
	en, stale, err = e.r.Resolve(context.Background(), q, nil)
	if err != nil || stale || addrOf(t, en, q) != "192.0.2.3" {
		t.Fatalf("after recheck: %v %v %v", en, stale, err)
	}
}

func TestRefreshSuccessReplacesStale(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "moved.example.")
	e.warmAndExpire(t, q, "192.0.2.1")
	e.up.set(dns.RcodeSuccess, "192.0.2.9", nil)
	en, stale, err := e.r.Resolve(context.Background(), q, nil)
	if err != nil || stale || addrOf(t, en, q) != "192.0.2.9" {
		t.Fatalf("refresh: %v %v %v", en, stale, err)
	}
	if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h == nil || addrOf(t, h, q) != "192.0.2.9" {
		t.Fatalf("cache after refresh: %v", h)
	}
}

// TestErrorAfterExpiryServesStale: a refresh answered SERVFAIL or REFUSED
// (RFC 8767 §4) gives the stale answer, and a SERVFAIL never shadows it.
func TestErrorAfterExpiryServesStale(t *testing.T) {
	for _, rcode := range []int{dns.RcodeRefused, dns.RcodeServerFailure, dns.RcodeNotImplemented} {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			e := newEnv(t, nil)
			q := question(t, "flaky.example.")
			e.warmAndExpire(t, q, "192.0.2.1")
			e.up.set(rcode, "", nil)
			en, stale, err := e.r.Resolve(context.Background(), q, nil)
			if err != nil || !stale || addrOf(t, en, q) != "192.0.2.1" {
				t.Fatalf("got %v %v %v, want the stale answer", en, stale, err)
			}
			now := e.clk.Now().UnixNano()
			if en, st, refresh := e.c.Lookup(q, now); st != cache.Stale || refresh || addrOf(t, en, q) != "192.0.2.1" {
				t.Fatalf("cache: %v %v refresh=%v; want the stale entry in its recheck interval", en, st, refresh)
			}
		})
	}
}

func TestServFailCachedForItsTTL(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "broken.example.")
	e.up.set(dns.RcodeServerFailure, "", nil)
	en, stale, err := e.r.Resolve(context.Background(), q, nil)
	if err != nil || stale || en.Rcode() != dns.RcodeServerFailure {
		t.Fatalf("got %v %v %v", en, stale, err)
	}
	e.clk.Advance(testPolicy.ServFailTTL - time.Millisecond)
	if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h == nil || h.Rcode() != dns.RcodeServerFailure {
		t.Fatalf("SERVFAIL not cached: %v", h)
	}
	e.clk.Advance(time.Millisecond)
	if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h != nil {
		t.Fatalf("SERVFAIL cached past its TTL")
	}
	if c := e.up.calls.Load(); c != 1 {
		t.Fatalf("%d upstream queries", c)
	}
}

func TestPrefetchOncePerEntry(t *testing.T) {
	e := newEnv(t, nil)
	e.c = cache.New(cache.Config{PrefetchHits: 2})
	e.r.cfg.Cache = e.c
	q := question(t, "popular.example.")
	if _, _, err := e.r.Resolve(context.Background(), q, nil); err != nil {
		t.Fatal(err)
	}
	release := e.up.block()
	e.up.set(dns.RcodeSuccess, "192.0.2.5", nil)
	e.clk.Advance(28 * time.Second) // the last tenth of 30 s
	for i := 0; i < 10; i++ {
		if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h == nil || addrOf(t, h, q) != "192.0.2.1" {
			t.Fatalf("hit %d: %v", i, h)
		}
	}
	waitFor(t, "the prefetch", func() bool { return e.up.calls.Load() == 2 })
	release()
	waitFor(t, "the prefetch to finish", func() bool { return e.r.InFlight() == 0 })
	if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h == nil || addrOf(t, h, q) != "192.0.2.5" {
		t.Fatalf("after prefetch: %v", h)
	}
	if c := e.up.calls.Load(); c != 2 {
		t.Fatalf("%d upstream queries, want 2 (one miss, one prefetch)", c)
	}
}

// TestAdmissionCountsQuestions: the flight bound counts distinct questions,
// waiters on one question are capped on their own, and a stuck question
// never keeps another from being fetched.
func TestAdmissionCountsQuestions(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFlights = 2; c.MaxWaiters = 3 })
	stuck := question(t, "stuck.example.")
	release := e.up.block()
	var waiting []<-chan result
	for i := 0; i < 3; i++ {
		waiting = append(waiting, e.resolveAsync(stuck))
	}
	waitFor(t, "three waiters", func() bool {
		e.r.flights.mu.Lock()
		defer e.r.flights.mu.Unlock()
		for _, c := range e.r.flights.calls {
			return c.waiters == 3
		}
		return false
	})
	// A fourth client for the same name is over the waiter cap.
	if _, _, err := e.r.Resolve(context.Background(), stuck, nil); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("fourth waiter: %v, want ErrOverloaded", err)
	}
	// Another name is a second flight: admitted.
	other := e.resolveAsync(question(t, "other.example."))
	waitFor(t, "the second flight", func() bool { return e.r.InFlight() == 2 })
	// A third distinct name is over the flight bound.
	if _, _, err := e.r.Resolve(context.Background(), question(t, "third.example."), nil); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third question: %v, want ErrOverloaded", err)
	}
	release()
	for _, ch := range append(waiting, other) {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if st := e.r.Stats(); st.Rejected.Load() != 2 || st.Misses.Load() != 6 {
		t.Fatalf("rejected %d misses %d", st.Rejected.Load(), st.Misses.Load())
	}
}

// TestOverloadServesStale: a question that is not admitted gets its stale
// answer when there is one.
func TestOverloadServesStale(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFlights = 1 })
	q := question(t, "kept.example.")
	e.warmAndExpire(t, q, "192.0.2.1")
	release := e.up.block()
	defer release()
	busy := e.resolveAsync(question(t, "busy.example."))
	waitFor(t, "the flight", func() bool { return e.r.InFlight() == 1 })
	en, stale, err := e.r.Resolve(context.Background(), q, nil)
	if err != nil || !stale || addrOf(t, en, q) != "192.0.2.1" {
		t.Fatalf("got %v %v %v", en, stale, err)
	}
	release()
	<-busy
}

func TestZonesLongestMatch(t *testing.T) {
	def := Policy{StaleWindow: 1}
	pol, err := Zones(def,
		Zone{Name: "cluster.local.", Policy: Policy{StaleWindow: 2}},
		Zone{Name: "svc.Cluster.Local.", Policy: Policy{StaleWindow: 3}},
	)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]time.Duration{
		"example.com.":                 1,
		"cluster.local.":               2,
		"a.B.cluster.local.":           2,
		"x.default.SVC.cluster.local.": 3,
		"notcluster.local.":            1,
	} {
		if got := pol(question(t, name).Name).Policy.StaleWindow; got != want {
			t.Errorf("%s: policy %d, want %d", name, got, want)
		}
	}
	if _, err := Zones(def, Zone{Name: "a..b."}); err == nil {
		t.Error("invalid zone name accepted")
	}
}

func BenchmarkHit(b *testing.B) {
	c := cache.New(cache.Config{})
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	up := &upstream{addr: "192.0.2.1"}
	pol, _ := Zones(testPolicy)
	r, _ := New(Config{Cache: c, Fetch: up.fetch, Blocks: pol, Clock: clk})
	q := question(b, "bench.example.")
	if _, _, err := r.Resolve(context.Background(), q, nil); err != nil {
		b.Fatal(err)
	}
	now := clk.Now().UnixNano()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r.Hit(q, nil, now) == nil {
			b.Fatal("miss")
		}
	}
}

// A miss nobody joins costs the flights two allocations (the call and its
// key), and a joined call is found without allocating.
func TestFlightsAllocs(t *testing.T) {
	f := newFlights(10, 10, new(atomic.Uint64), nil)
	q := question(t, "Alloc.Example.com.")
	allocs := testing.AllocsPerRun(100, func() {
		c, joined, ok := f.join(q, flightBlock, true, false)
		if joined || !ok || c.done != nil {
			t.Fatalf("join: joined %v ok %v", joined, ok)
		}
		f.leave(c)
		f.finish(c, nil, nil)
	})
	if allocs > 2 {
		t.Fatalf("%v allocations per unjoined flight, want <= 2", allocs)
	}
	c, _, _ := f.join(q, flightBlock, true, false)
	if string(c.q.Name) != "\x05alloc\x07example\x03com\x00" {
		t.Fatalf("call name %q, want it lower-cased", c.q.Name)
	}
	c2, joined, ok := f.join(q, flightBlock, true, false)
	if c2 != c || !joined || !ok || c.done == nil {
		t.Fatal("a second asker must join the call and get its done channel")
	}
	f.finish(c, nil, nil)
	select {
	case <-c.done:
	default:
		t.Fatal("finish must close done for the waiters")
	}
}

// The fetch sees the first asker's address (wire.Query.From) as Asker,
// also for a question others join; a query without From (the transport
// records none) fetches with no asker.
func TestFetchSeesTheFirstAsker(t *testing.T) {
	var mu sync.Mutex
	var seen []netip.Addr
	e := newEnv(t, nil)
	inner := e.up.fetch
	e.r.cfg.Fetch = func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		mu.Lock()
		seen = append(seen, Asker(ctx))
		mu.Unlock()
		return inner(ctx, qname, query)
	}
	release := e.up.block()
	first := question(t, "asker.example.")
	first.From = netip.MustParseAddr("10.1.2.3")
	second := question(t, "asker.example.")
	second.From = netip.MustParseAddr("10.9.9.9")
	r1 := e.resolveAsync(first)
	waitFor(t, "the first fetch", func() bool { return e.up.calls.Load() == 1 })
	r2 := e.resolveAsync(second)
	waitFor(t, "the second asker to join", func() bool { return e.r.Stats().Coalesced.Load() == 1 })
	release()
	for _, ch := range []<-chan result{r1, r2} {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if res := <-e.resolveAsync(question(t, "nobody.example.")); res.err != nil {
		t.Fatal(res.err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []netip.Addr{netip.MustParseAddr("10.1.2.3"), {}}
	if len(seen) != 2 || seen[0] != want[0] || seen[1] != want[1] {
		t.Fatalf("fetches saw askers %v, want %v", seen, want)
	}
}

// flightBlock is the block the flights tests join with.
var flightBlock = &Block{Policy: testPolicy, Metric: -1}
