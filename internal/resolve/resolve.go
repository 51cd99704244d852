// Package resolve decides where the answer to a question comes from: the
// cache, a stale entry, or the upstream. Given a cache, a fetch function
// and a clock, a Resolver answers "give me the entry for this question"
// with coalescing (one upstream query per question however many clients
// ask), serve-stale (RFC 8767), a recheck interval after a failed refresh,
// prefetch of popular entries and SERVFAIL caching, all under the Policy
// of the question's Block (zones.go), which the server looks up once when
// the query arrives and hands to Hit, Start and Resolve; the flight
// carries it to the fetch.
//
// It is also the admission of misses: a bound on distinct questions being
// fetched (flights) and on the clients waiting for one question. It knows
// no sockets and writes no bytes: the server asks Hit on its hot path and
// Resolve for a miss, and writes the entry it gets.
package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// FetchFunc sends query (wire format, ID chosen by the transport) for the
// lower-case FQDN qname upstream and returns the answer. ctx carries the
// fetch's deadline (Config.FetchTimeout).
type FetchFunc func(ctx context.Context, qname string, query []byte) ([]byte, error)

// StartFunc is the Resolver's Fetcher.Start for the blocks without a
// Fetch of their own (Config.Start).
type StartFunc func(b *Block, name, query []byte, asker netip.AddrPort, timeout time.Duration, done FetchDone) bool

// FetchDone receives the result of a StartFunc. resp may be the transport's buffer: it is
// valid only until Fetched returns.
type FetchDone interface {
	Fetched(resp []byte, err error)
}

// Waiter receives the answer to a miss started with Resolver.Start: the entry, or the error
// (the client gets SERVFAIL), exactly once.
type Waiter interface {
	Resolved(e *cache.Entry, err error)
}

// askerKey is the context key of the client whose question a fetch asks.
type askerKey struct{}

// Asker returns the address of the client whose question ctx's fetch asks
// (wire.Query.From of the flight's first asker): what a template's .Remote
// shows. It is the zero Addr when the transport did not record it, or for
// a prefetch, which no client is waiting on.
func Asker(ctx context.Context) netip.Addr { return AskerPort(ctx).Addr() }

// AskerPort is Asker with the client's port (wire.Query.FromPort; 0 when
// the transport did not record it).
func AskerPort(ctx context.Context) netip.AddrPort {
	a, _ := ctx.Value(askerKey{}).(netip.AddrPort)
	return a
}

// WithAsker returns ctx carrying a as the asker, for a caller that resolves
// on a client's behalf through Resolve with a query it built itself
// (autopath's candidates): it sets the query's From from Asker(ctx).
func WithAsker(ctx context.Context, a netip.Addr) context.Context {
	return context.WithValue(ctx, askerKey{}, netip.AddrPortFrom(a, 0))
}

// Policy is the cache policy of one part of the name space.
type Policy struct {
	// TTL caps and floors the lifetime of answers.
	TTL cache.Policy
	// ServFailTTL is how long an upstream SERVFAIL is cached (0: not).
	ServFailTTL time.Duration
	// StaleWindow is how long past expiry an answer may be served stale
	// (RFC 8767) when the upstream fails or is slow; 0 disables.
	StaleWindow time.Duration
	// StaleClientTimeout is how long a client whose answer is stale waits
	// for the refresh before it gets the stale answer (0:
	// DefaultStaleClientTimeout; negative: not at all, the stale answer
	// at once and the refresh behind, as CoreDNS's `immediate`).
	StaleClientTimeout time.Duration
	// StaleRecheck is how long after a failed refresh a stale answer is
	// served without asking the upstream again (0:
	// DefaultStaleRecheck; negative: none, every stale answer may start a
	// refresh, as CoreDNS's FAILURE_RECHECK 0).
	StaleRecheck time.Duration
}

// PreferPositive reports whether the policy keeps the last good answer
// (TTL.PreferPositive, within a stale window): a refresh that does not
// answer the question (NXDOMAIN, NODATA, an empty NOERROR, a referral,
// additional data only, SERVFAIL, an error) does not replace an answer
// that does, fresh or stale, until the stale window ends; a refresh that
// answers replaces it.
func (p *Policy) PreferPositive() bool { return p.TTL.PreferPositive && p.StaleWindow > 0 }

// Config configures a Resolver.
type Config struct {
	Cache *cache.Cache
	// Fetch and Start fetch the misses of the blocks without a Fetch of
	// their own (Block.Fetcher). Start, if set, fetches without a goroutine
	// waiting (Resolver.Start); nil: Start reports Blocking for them.
	Fetch FetchFunc
	Start StartFunc
	// Blocks finds the block of a question name (see Zones) for a
	// caller that has none (Resolve of a question built apart: autopath's
	// candidates).
	Blocks BlockFunc
	// Clock is the time source (nil: clock.Real).
	Clock clock.Clock
	// FetchTimeout bounds one upstream fetch (0:
	// DefaultFetchTimeout).
	FetchTimeout time.Duration
	// UDPSize is the EDNS payload size advertised upstream (0:
	// DefaultUDPSize).
	UDPSize uint16
	// MaxFlights bounds the distinct questions being fetched at once,
	// prefetches and refreshes included (0: DefaultMaxInflight).
	MaxFlights int
	// MaxWaiters caps the clients waiting on one question (0:
	// DefaultMaxWaitersPerQuestion).
	MaxWaiters int
	// Logger gets one line per name and state change of the
	// prefer_positive policy (nil: slog.Default()).
	Logger *slog.Logger
}

// ErrOverloaded is returned by Resolve when the question could not be
// admitted (MaxFlights questions in flight, or MaxWaiters clients waiting
// on this one) and there was no stale answer to give instead.
var ErrOverloaded = errors.New("resolve: overloaded")

// Stats counts what a Resolver did. Every client question that reached the
// cache is exactly one of: a hit (counted by the cache, by kind), Stale, or
// a Miss. Rejected misses are a part of Misses.
type Stats struct {
	// Misses: client questions the cache could not answer; they waited
	// for the upstream, or were rejected (admission).
	Misses atomic.Uint64
	// Stale: client questions answered with a stale entry (RFC 8767).
	Stale atomic.Uint64
	// Coalesced: misses that waited on another asker's upstream query.
	Coalesced atomic.Uint64
	// Rejected: misses not admitted (flight bound or waiter cap) and with
	// no stale answer: the client gets SERVFAIL at once.
	Rejected atomic.Uint64
	// ShareRejected: new questions not admitted because their client
	// held its share of the flight bound while only the reserve was free
	// (package fair); the client gets its stale answer or SERVFAIL.
	ShareRejected atomic.Uint64
	// PrefetchSkipped: prefetches not started: the prefetches' share of
	// the flight bound was held, the bound was full, or the question's
	// last prefetch stalled (stall.go).
	PrefetchSkipped atomic.Uint64
	// UpstreamErrors: fetches that failed or returned an unusable answer.
	UpstreamErrors atomic.Uint64
}

// Resolver answers questions from the cache and the upstream. It is safe
// for concurrent use.
type Resolver struct {
	cfg     Config
	clk     clock.Clock
	flights flights
	stats   Stats
}

// New checks cfg and returns a Resolver.
func New(cfg Config) (*Resolver, error) {
	if cfg.Cache == nil || cfg.Fetch == nil || cfg.Blocks == nil {
		return nil, errors.New("resolve: Cache, Fetch and Blocks are required")
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
	}
	if cfg.UDPSize < wire.MinUDPSize {
		cfg.UDPSize = DefaultUDPSize
	}
	if cfg.MaxFlights <= 0 {
		cfg.MaxFlights = DefaultMaxInflight
	}
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = DefaultMaxWaitersPerQuestion
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Resolver{cfg: cfg, clk: clock.Or(cfg.Clock)}
	r.flights = newFlights(cfg.MaxFlights, cfg.MaxWaiters, &r.stats.ShareRejected, r.clk)
	return r, nil
}

// Stats returns the resolver's counters (read them with Load).
func (r *Resolver) Stats() *Stats { return &r.stats }

// InFlight reports how many distinct questions are being fetched.
func (r *Resolver) InFlight() int { return r.flights.inFlight() }

// Block is the block serving a question name (Config.Blocks): the
// server asks it once per query and hands it to Hit, Start or Resolve.
func (r *Resolver) Block(name []byte) *Block { return r.cfg.Blocks(name) }

// Hit returns the fresh entry answering q at now (unix ns), or nil for a
// miss, which the caller then gives to Start or Resolve. b is q's block
// (nil: looked up). A hit on a popular entry near its expiry starts its
// refresh in the background (once per entry). It allocates nothing
// unless it starts a prefetch.
func (r *Resolver) Hit(q *wire.Query, b *Block, now int64) *cache.Entry {
	e, prefetch := r.cfg.Cache.Get(q, now)
	if prefetch {
		if b == nil {
			b = r.cfg.Blocks(q.Name)
		}
		r.prefetch(q, b)
	}
	return e
}

// Resolve answers a miss: it returns the entry for q, and whether it is
// served stale. It blocks until the upstream answers, the fetch fails, or,
// when a stale entry exists, StaleClientTimeout passes; ctx ends the wait
// early (the fetch goes on for the other askers and the cache).
//
// There is at most one upstream query per question. When the entry is
// stale the client gets the refresh if it comes in time and succeeds, else
// the stale entry; while a failed refresh's recheck interval runs it gets
// the stale entry at once. A refresh fails when the fetch fails or the
// upstream answers anything but NOERROR or NXDOMAIN (SERVFAIL, REFUSED,
// ...: RFC 8767 §4). Without a stale entry, a failed fetch is an error
// (the client gets SERVFAIL) and ErrOverloaded means it was not admitted.
func (r *Resolver) Resolve(ctx context.Context, q *wire.Query, b *Block) (e *cache.Entry, stale bool, err error) {
	if b == nil {
		b = r.cfg.Blocks(q.Name)
	}
	now := r.clk.Now().UnixNano()
	if e := r.Hit(q, b, now); e != nil {
		return e, false, nil // inserted since the caller looked
	}
	e, status, refresh := r.cfg.Cache.Lookup(q, now)
	if status == cache.Stale && !refresh {
		return r.stale(e), true, nil
	}
	if status != cache.Stale {
		e = nil
	}
	c, joined, ok := r.flights.join(q, b, true, status == cache.Stale)
	if !ok {
		if e != nil {
			return r.stale(e), true, nil
		}
		r.stats.Misses.Add(1)
		r.stats.Rejected.Add(1)
		return nil, false, ErrOverloaded
	}
	defer r.flights.leave(c)
	if joined {
		r.stats.Coalesced.Add(1)
	}
	if e == nil {
		// Nothing to fall back on: the first asker fetches in its own
		// goroutine, the others wait for it.
		r.stats.Misses.Add(1)
		if !joined {
			r.runMiss(c)
		} else {
			select {
			case <-c.done:
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		}
		if c.err != nil {
			return nil, false, c.err
		}
		if c.kept {
			// The policy kept an entry put meanwhile (a race): stale if
			// it has expired.
			return c.entry, c.entry.Expired(r.clk.Now().UnixNano()), nil
		}
		return c.entry, false, nil
	}
	if !joined {
		go r.runMiss(c)
	}
	timeout := b.Policy.StaleClientTimeout
	if timeout < 0 {
		return r.stale(e), true, nil // immediate: the refresh goes on behind
	}
	if timeout == 0 {
		timeout = DefaultStaleClientTimeout
	}
	t := r.clk.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C():
		// The refresh goes on in the background and updates the cache.
		return r.stale(e), true, nil
	case <-ctx.Done():
		return r.stale(e), true, nil
	}
	if c.err != nil || c.kept || !refreshed(c.entry) {
		return r.stale(e), true, nil
	}
	r.stats.Misses.Add(1)
	return c.entry, false, nil
}

// Started says how Start took a miss.
type Started int

const (
	// Now: the result is what Start returned (an entry inserted since the caller looked, or
	// ErrOverloaded).
	Now Started = iota
	// Later: the Waiter gets the result, from another goroutine or before Start returned.
	Later
	// Blocking: Start did nothing; the caller resolves with Resolve (a stale entry is there
	// to be weighed against its refresh, or the resolver has no StartFunc).
	Blocking
)

// Start resolves a miss without blocking the caller and without a goroutine waiting for it:
// the question joins the flight for it, or starts one whose fetch (Config.Start) hands the
// answer to the goroutine that reads it from the upstream, which caches it and calls every
// Waiter of the flight. b is q's block (nil: looked up); its Fetcher, or Config.Start, starts
// the fetch. Coalescing, admission (MaxFlights, MaxWaiters) and caching are Resolve's. A question with a stale entry is Resolve's alone (Blocking): its client may get
// the stale entry when the refresh is slow, which needs a timer per client.
//
// w may be called before Start returns (Later): the caller must not touch what w's call
// gives away.
func (r *Resolver) Start(q *wire.Query, b *Block, w Waiter) (*cache.Entry, Started, error) {
	if b == nil {
		b = r.cfg.Blocks(q.Name)
	}
	if b.Fetcher == nil && r.cfg.Start == nil {
		return nil, Blocking, nil
	}
	now := r.clk.Now().UnixNano()
	if e := r.Hit(q, b, now); e != nil {
		return e, Now, nil // inserted since the caller looked
	}
	if _, status, _ := r.cfg.Cache.Lookup(q, now); status == cache.Stale {
		return nil, Blocking, nil
	}
	c, joined, ok := r.flights.joinAsync(q, b, w)
	r.stats.Misses.Add(1)
	if !ok {
		r.stats.Rejected.Add(1)
		return nil, Now, ErrOverloaded
	}
	if joined {
		r.stats.Coalesced.Add(1)
		return nil, Later, nil
	}
	if r.finishedMeanwhile(c) {
		return nil, Later, nil
	}
	r.startFetch(c)
	return nil, Later, nil
}

// startFetch starts c's fetch (Start): asynchronous, or in a goroutine of
// its own. A panic on the way finishes c with an error (guard.go).
func (r *Resolver) startFetch(c *call) {
	defer r.recoverFlight(c)
	c.r = r
	c.uq = wire.AppendUpstreamQuery(c.buf[len(c.buf):], &c.q, r.cfg.UDPSize)
	var asker netip.AddrPort
	if c.q.From.IsValid() {
		asker = netip.AddrPortFrom(c.q.From, c.q.FromPort)
	}
	started, b := false, c.blk
	if b.Fetcher != nil {
		started = b.Fetcher.Start(b, c.q.Name, c.uq, asker, r.cfg.FetchTimeout, c)
	} else {
		started = r.cfg.Start(b, c.q.Name, c.uq, asker, r.cfg.FetchTimeout, c)
	}
	if !started {
		go r.run(c) // not a plain forward: the fetch blocks, in a goroutine of its own
	}
}

// Fetched finishes a call started by Start: it caches the answer and hands it to the waiters.
func (c *call) Fetched(resp []byte, err error) {
	r := c.r
	defer r.recoverFlight(c)
	e, kept, err := r.store(&c.q, &c.blk.Policy, resp, err)
	c.kept = kept
	r.flights.finish(c, e, err)
}

// Shed answers a miss the caller could not admit (its own bound on waiting
// clients): the stale entry for q if there is one, counted as stale, else
// nil, counted as a rejected miss (the client gets SERVFAIL).
func (r *Resolver) Shed(q *wire.Query, now int64) *cache.Entry {
	if e, status, _ := r.cfg.Cache.Lookup(q, now); status == cache.Stale {
		return r.stale(e)
	}
	r.stats.Misses.Add(1)
	r.stats.Rejected.Add(1)
	return nil
}

// stale counts e, about to be served stale, and returns it.
func (r *Resolver) stale(e *cache.Entry) *cache.Entry {
	r.stats.Stale.Add(1)
	e.CountServed()
	return e
}

// refreshed reports whether an upstream answer replaces a stale entry:
// NOERROR or NXDOMAIN does; SERVFAIL, REFUSED and other errors do not.
func refreshed(e *cache.Entry) bool {
	rc := e.Rcode()
	return rc == wire.RcodeSuccess || rc == wire.RcodeNXDomain
}

// prefetch refreshes a popular entry near its expiry in the background,
// through the flights so a concurrent miss shares it. Prefetches are the
// daemon's own work, not the client's whose hit started one: they take
// the prefetch key's share of the flights (package fair: a share, never
// the reserve). Past it, or while the question's last prefetch stalled
// (stall.go), it is skipped (counted): the entry is then fetched on its
// first miss.
func (r *Resolver) prefetch(q *wire.Query, b *Block) {
	pq := *q
	pq.From, pq.FromPort, pq.Client = netip.Addr{}, 0, fair.Prefetch
	c, joined, ok := r.flights.join(&pq, b, false, false)
	switch {
	case !ok:
		r.stats.PrefetchSkipped.Add(1)
	case !joined:
		go r.run(c)
	}
}

// run fetches the question of c and finishes it.
// runMiss is run for a client's miss. A flight for the same question that
// finished between the client's cache lookup and its join has put its
// answer in the cache already (fetch puts before finish removes the
// flight), so it is taken from there instead of asked again: one upstream
// query per question, however the askers interleave. A prefetch does not
// come here: its entry is still fresh by design.
func (r *Resolver) runMiss(c *call) {
	defer r.recoverFlight(c) // also a goroutine of its own (a stale entry's refresh)
	if r.finishedMeanwhile(c) {
		return
	}
	r.run(c)
}

// finishedMeanwhile finishes a new flight c with the fresh entry a flight for the same
// question put in the cache between its first asker's lookup and its join (runMiss), and
// reports whether it did.
func (r *Resolver) finishedMeanwhile(c *call) bool {
	e, status, _ := r.cfg.Cache.Lookup(&c.q, r.clk.Now().UnixNano())
	if status != cache.Fresh {
		return false
	}
	r.flights.finish(c, e, nil)
	return true
}

func (r *Resolver) run(c *call) {
	defer r.recoverFlight(c)
	e, kept, err := r.fetch(&c.q, c.blk)
	c.kept = kept
	r.flights.finish(c, e, err)
}

// fetch asks the upstream for q, builds the entry and caches it when it may
// be cached. A failed refresh of a stale entry (an error, or an answer
// that is not NOERROR or NXDOMAIN) starts its recheck interval.
func (r *Resolver) fetch(q *wire.Query, b *Block) (*cache.Entry, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.FetchTimeout)
	defer cancel()
	if q.From.IsValid() {
		ctx = context.WithValue(ctx, askerKey{}, netip.AddrPortFrom(q.From, q.FromPort))
	}
	uq := wire.AppendUpstreamQuery(make([]byte, 0, 64+len(q.Name)), q, r.cfg.UDPSize)
	var resp []byte
	var err error
	if b.Fetcher != nil {
		resp, err = b.Fetcher.Fetch(ctx, b, wire.NameString(q.Name), uq)
	} else {
		resp, err = r.cfg.Fetch(ctx, wire.NameString(q.Name), uq)
	}
	return r.store(q, &b.Policy, resp, err)
}

// store builds the entry from a fetch's result and caches it when it may be cached, as fetch
// describes. Under a prefer_positive policy an answer that does not answer the question does not
// replace one that does (fresh or within its stale window): that one is returned, kept true,
// and the refresh counts as failed.
//
// A panic while the answer is built or cached (a hostile answer the parser
// does not survive) is recovered: the fetch failed (guard.go).
func (r *Resolver) store(q *wire.Query, pol *Policy, resp []byte, err error) (_ *cache.Entry, _ bool, rerr error) {
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Resolve, p, resp)
			r.stats.UpstreamErrors.Add(1)
			rerr = fmt.Errorf("resolve %s: %w", wire.NameString(q.Name), errRecovered)
		}
	}()
	var e, fetched *cache.Entry
	if err == nil {
		e, fetched, err = cache.BuildFetched(resp, q, pol.TTL, pol.ServFailTTL, pol.StaleWindow, r.clk.Now().UnixNano())
	}
	if err != nil {
		r.stats.UpstreamErrors.Add(1)
		r.refreshFailed(q, pol)
		return nil, false, fmt.Errorf("resolve %s: %w", wire.NameString(q.Name), err)
	}
	if pol.PreferPositive() {
		if old := r.keep(q, e); old != nil {
			r.refreshFailed(q, pol)
			return old, true, nil
		}
	}
	if who := owner(q); who.IsValid() && who != fair.Prefetch {
		r.cfg.Cache.PutFor(e, fair.Owner(who)) // the first asker's entry
	} else {
		r.cfg.Cache.Put(e) // a prefetch: the entry it refreshes keeps its owner
	}
	if !refreshed(e) {
		r.refreshFailed(q, pol)
	}
	// The clients of this fetch get the answer's Extended DNS Errors when
	// the block has no cache, as from CoreDNS (cache.BuildFetched).
	return fetched, false, nil
}

// keep returns the entry the prefer_positive policy keeps instead of e: the cached one for q,
// fresh or stale, when it answers its question and e does not. It logs once per name and
// state change: when an answer is first kept, and when an answer replaces a kept one.
func (r *Resolver) keep(q *wire.Query, e *cache.Entry) *cache.Entry {
	old, st, _ := r.cfg.Cache.Lookup(q, r.clk.Now().UnixNano())
	if st == cache.Miss || !old.Answering() {
		return nil
	}
	if e.Kind() == cache.Success && e.Answering() {
		if old.Kept() {
			r.cfg.Logger.Info("serve_stale_policy prefer_positive: the upstream answers again, the last good answer is replaced",
				"name", wire.NameString(q.Name), "type", q.Type)
		}
		return nil
	}
	if old.Keep() {
		r.cfg.Logger.Warn("serve_stale_policy prefer_positive: the upstream's answer does not answer the question; serving the last good answer until it answers again or the stale window ends",
			"name", wire.NameString(q.Name), "type", q.Type, "rcode", e.Rcode(), "stale_until", time.Unix(0, old.StaleUntil()).UTC().Format(time.RFC3339))
	}
	return old
}

func (r *Resolver) refreshFailed(q *wire.Query, pol *Policy) {
	recheck := pol.StaleRecheck
	if recheck < 0 {
		return // none: the next stale answer may refresh at once
	}
	if recheck == 0 {
		recheck = DefaultStaleRecheck
	}
	now := r.clk.Now().UnixNano()
	r.cfg.Cache.RefreshFailed(q, now, now+int64(recheck))
}
