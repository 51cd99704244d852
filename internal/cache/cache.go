package cache

import (
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// DefaultCapacity is the default bound on entries of each kind (success,
// denial): the stock node-local-dns Corefile's 9984, so the drop-in holds
// as much as the image it replaces.
const DefaultCapacity = 9984

// Config sizes a Cache.
type Config struct {
	// SuccessCapacity and DenialCapacity bound the number of entries of
	// each kind (SERVFAIL entries count as denials; 0:
	// DefaultCapacity).
	SuccessCapacity int
	DenialCapacity  int
	// MaxBytes bounds the memory held by entries (see Entry.size); 0 means
	// no byte bound.
	MaxBytes int64
	// Shards is the number of independently locked parts, a power of two;
	// 0 picks a default.
	Shards int
	// PrefetchHits is how many hits during its life make an entry
	// popular enough to be refreshed before it expires; 0 disables
	// prefetching.
	PrefetchHits int
}

// defaultShards: enough that two to eight serving goroutines rarely meet on
// one lock, few enough that per-shard capacities stay large (9984 / 64 =
// 156 entries per shard, so a shard's recency order and a sample of its
// entries still say something about the whole).
const defaultShards = 64

// shardSkew bounds how far above its fair share one shard may grow.
const shardSkew = 2

// evictSample is how many random entries eviction compares (Redis's
// approximated LRU uses 5 as well).
const evictSample = 5

// sweepEvery is how often at most a shard walks all its entries of a kind
// for expired ones when it must make room (see evict). A walk touches every
// entry of the shard (a few hundred, cold in the CPU's caches: tens of µs);
// once a second per shard keeps that under 1% of a core with every shard
// evicting, and an expired entry waits at most that long before a sweep
// (or a sample that meets it) removes it.
const sweepEvery = int64(time.Second)

// Cache is a sharded, bounded store of answers keyed by the question
// (lower-cased name, type, class, DO and CD bits); eviction samples (see
// evict). It is safe for concurrent use.
type Cache struct {
	shards       []shard
	mask         uint64
	prefetchHits uint32
	capacity     [numKinds]int64
	maxBytes     int64
	// gauges, kept exactly on every insert and removal.
	entries [numKinds]atomic.Int64
	bytes   atomic.Int64
}

type shard struct {
	mu    sync.Mutex
	items map[uint64]*Entry
	// lru[k] is a circular list per kind (head.next is the most recent).
	lru   [numKinds]Entry
	count [numKinds]int
	// soonest[k] is at or before the expiry of every entry of kind k (a
	// bound: lowered by Put, made exact by a sweep, MaxInt64 when the kind
	// is empty); lastSweep[k] is when the kind was last swept.
	soonest   [numKinds]int64
	lastSweep [numKinds]int64
	bytes     int64
	capacity  [numKinds]int
	stats     shardStats
	// tags[t] counts the entries of Policy.Tag t (grown by Put).
	tags []TagStats
	// owners: the clients whose misses stored the shard's entries
	// (owner.go).
	owners map[netip.Addr]*owner
	_      [64]byte // keep neighbouring shards' locks off one cache line
}

type shardStats struct {
	hits       [numKinds]uint64
	prefetches uint64
	inserts    uint64
	evictions  uint64
}

// New returns an empty cache.
func New(cfg Config) *Cache {
	n := cfg.Shards
	if n <= 0 {
		n = defaultShards
	}
	for n&(n-1) != 0 {
		n++
	}
	if cfg.SuccessCapacity <= 0 {
		cfg.SuccessCapacity = DefaultCapacity
	}
	if cfg.DenialCapacity <= 0 {
		cfg.DenialCapacity = DefaultCapacity
	}
	c := &Cache{shards: make([]shard, n), mask: uint64(n - 1), prefetchHits: uint32(max(0, cfg.PrefetchHits)), maxBytes: cfg.MaxBytes}
	c.capacity[Success] = int64(cfg.SuccessCapacity)
	c.capacity[Denial] = int64(cfg.DenialCapacity)
	// SERVFAIL entries are few and short-lived; a quarter of the denial
	// budget, so an upstream outage cannot grow the cache.
	c.capacity[ServFail] = max(1, int64(cfg.DenialCapacity)/4)
	// The capacities and the byte budget are global; a shard may hold up
	// to shardSkew times its fair share, so uneven hashing of a working set
	// that fits the cache does not make one shard thrash.
	per := func(total int64) int { return int(max(1, shardSkew*(total+int64(n)-1)/int64(n))) }
	for i := range c.shards {
		s := &c.shards[i]
		s.items = make(map[uint64]*Entry)
		s.owners = make(map[netip.Addr]*owner)
		for k := range s.lru {
			s.lru[k].next, s.lru[k].prev = &s.lru[k], &s.lru[k]
		}
		for k := range s.capacity {
			s.capacity[k] = per(c.capacity[k])
			s.soonest[k] = math.MaxInt64
		}
	}
	return c
}

// Status says what Lookup found.
type Status uint8

// Lookup results.
const (
	Miss  Status = iota // nothing usable
	Fresh               // within its TTL
	Stale               // expired, within the serve-stale window
)

// Get returns the fresh entry answering q at now (unix ns), or nil, and
// counts a hit of q.Client's (one more client of the entry's, if it is
// new: its popularity). A miss is not counted here: only the caller knows whether
// it is answered stale, from the upstream or not at all. prefetch is true, once per entry, when this hit
// makes a popular entry (PrefetchHits hits) that is in the last tenth of
// its lifetime due for a background refresh. The returned entry is
// immutable and may be used after Get returns.
func (c *Cache) Get(q *wire.Query, now int64) (e *Entry, prefetch bool) {
	flags := keyFlags(q)
	h := hashQuestion(q.Name, q.Type, q.Class, flags)
	s := &c.shards[h&c.mask]
	s.mu.Lock()
	e = s.items[h]
	if e == nil || !e.matches(q, flags) || now >= e.expires {
		if e != nil && now >= e.staleUntil && e.matches(q, flags) {
			c.remove(s, e)
		}
		s.mu.Unlock()
		return nil, false
	}
	s.moveToFront(e)
	s.stats.hits[e.kind]++
	if e.lkg != nil {
		e.CountServed() // a hit that a denial would have replaced but for prefer_positive
	}
	e.hits++
	e.clients |= clientBit(q.Client)
	e.lastUsed = now
	need, pct := c.prefetchHits, int64(10)
	if e.pfSet {
		need, pct = e.pfHits, int64(e.pfPct)
	}
	if need > 0 && e.hits >= need && !e.prefetching &&
		(e.expires-now)*100 <= (e.expires-e.stored)*pct {
		e.prefetching = true
		prefetch = true
		s.stats.prefetches++
		s.tags[e.tag].Prefetches++
	}
	s.mu.Unlock()
	return e, prefetch
}

// Lookup finds the entry answering q at now without counting anything or
// touching the recency order. For a stale entry, refresh says whether the
// upstream should be asked again now: false while a failed refresh's
// recheck interval runs (see RefreshFailed).
func (c *Cache) Lookup(q *wire.Query, now int64) (e *Entry, st Status, refresh bool) {
	flags := keyFlags(q)
	h := hashQuestion(q.Name, q.Type, q.Class, flags)
	s := &c.shards[h&c.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	e = s.items[h]
	switch {
	case e == nil || !e.matches(q, flags) || now >= e.staleUntil:
		return nil, Miss, true
	case now < e.expires:
		return e, Fresh, false
	default:
		return e, Stale, now >= e.refreshAfter
	}
}

// RefreshFailed records that refreshing the stale entry for q failed at
// now: until the recheck time it is served stale without asking upstream.
func (c *Cache) RefreshFailed(q *wire.Query, now, recheck int64) {
	flags := keyFlags(q)
	h := hashQuestion(q.Name, q.Type, q.Class, flags)
	s := &c.shards[h&c.mask]
	s.mu.Lock()
	if e := s.items[h]; e != nil && e.matches(q, flags) && now >= e.expires {
		e.refreshAfter = recheck
	}
	s.mu.Unlock()
}

// Put stores e, replacing any entry for the same question (whose owner
// and clients it keeps: a refresh, an import), and evicts entries (evict)
// to stay within the capacities. Uncacheable entries are ignored. It
// reports whether e was stored.
func (c *Cache) Put(e *Entry) bool { return c.put(e, netip.Addr{}, false) }

// PutFor is Put of an entry that the miss of client (its key, package
// fair) fetched: it is the client's, whatever it replaces, and makes room
// from the client's own entries when the client holds its equal part of
// the shard or more (evict).
func (c *Cache) PutFor(e *Entry, client netip.Addr) bool { return c.put(e, client, true) }

func (c *Cache) put(e *Entry, client netip.Addr, owned bool) bool {
	if e.kind >= numKinds || e.expires <= e.stored {
		return false
	}
	s := &c.shards[e.hash&c.mask]
	size := e.size()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.maxBytes > 0 && size > c.maxBytes/int64(len(c.shards)) {
		return false // one answer may not take more than a shard's share
	}
	if old := s.items[e.hash]; old != nil {
		// A SERVFAIL never shadows an answer that can still be served,
		// fresh or stale.
		if e.kind == ServFail && old.kind != ServFail && e.stored < old.staleUntil {
			return false
		}
		if !owned {
			client = old.own.key
		}
		e.clients |= old.clients
		c.remove(s, old)
	}
	ins := s.owners[client]
	// Make room in this shard. The global bounds may be exceeded by at
	// most one entry per shard (when this shard has nothing of the kind to
	// give back) and by concurrent inserts in other shards.
	k := e.kind
	for s.count[k] > 0 && (s.count[k] >= s.capacity[k] || c.entries[k].Load() >= c.capacity[k]) {
		c.evict(s, k, e.stored, ins)
		ins = s.owners[client] // gone when its last entry was
	}
	for c.maxBytes > 0 && c.bytes.Load()+size > c.maxBytes {
		victim := s.largestKind()
		if victim >= numKinds {
			break
		}
		c.evict(s, victim, e.stored, ins)
		ins = s.owners[client]
	}
	s.items[e.hash] = e
	s.pushFront(e)
	s.own(e, s.ownerOf(client), size)
	if int(e.tag) >= len(s.tags) {
		s.tags = append(s.tags, make([]TagStats, int(e.tag)+1-len(s.tags))...)
	}
	s.tags[e.tag].Entries[e.kind]++
	s.count[e.kind]++
	s.soonest[e.kind] = min(s.soonest[e.kind], e.expires)
	s.bytes += size
	s.stats.inserts++
	c.entries[e.kind].Add(1)
	c.bytes.Add(size)
	return true
}

// evict removes entries of kind k to make room for an insert of ins's
// (nil: a client with nothing in the shard): every expired one of the
// shard when a sweep is due (see sweep), else one of the target owner's
// (target: ins's own when it holds its equal part of the shard or more,
// else the heaviest owner's), sampled at random (Go map iteration starts
// at a random slot): the first expired one the sample meets, or the least
// valuable of evictSample, fewest distinct clients first, least recently
// used on a tie. An owner the sample does not meet gives its least
// recently used entry.
//
// Plain LRU evicts exactly the entry a cyclic workload (clients walking a
// list of names slightly longer than the cache) asks for next, so every
// query of it misses; sampling breaks the cycle, and the client counts
// keep names many clients use in. Counting clients, not hits, and making
// room from the heavy owner's entries, keeps one client that asks its own
// new names many times (issue 37: 2,000 a second, 12 times each) from
// pushing out what the other clients use.
//
// Eviction used to look at the eight least recently used entries for an
// expired one first: thirteen entries read per eviction, each a cache miss
// once the cache is larger than the CPU's caches (4% of a miss's CPU time at
// 10k misses/s, bench/MISS-PROFILE.md). The bound on the soonest expiry says
// when there can be no expired entry at all, which under a storm of new
// names (every entry younger than its TTL) is always.
func (c *Cache) evict(s *shard, k Kind, now int64, ins *owner) {
	head := &s.lru[k]
	if head.prev == head {
		return
	}
	if now >= s.soonest[k] && now-s.lastSweep[k] >= sweepEvery && c.sweep(s, k, now) > 0 {
		return
	}
	o := s.target(k, ins)
	var victim *Entry
	seen, scanned := 0, 0
	for _, e := range s.items {
		if scanned++; scanned > evictScan {
			break
		}
		if e.kind != k || e.own != o {
			continue
		}
		if e.Expired(now) {
			victim = e
			break
		}
		if victim == nil || lessValuable(e, victim) {
			victim = e
		}
		if seen++; seen == evictSample {
			break
		}
	}
	for e := head.prev; victim == nil && e != head; e = e.prev {
		if e.own == o {
			victim = e
		}
	}
	if victim == nil { // o has an entry of the kind: not reached
		victim = head.prev
	}
	s.tags[victim.tag].Evictions[victim.kind]++
	c.remove(s, victim)
	s.stats.evictions++
}

// sweep removes every expired entry of kind k from the shard (past its TTL:
// such an entry goes before any live one, as it always did, even when it
// could still be served stale), makes soonest[k] exact and reports how many
// it removed.
func (c *Cache) sweep(s *shard, k Kind, now int64) int {
	head := &s.lru[k]
	soonest := int64(math.MaxInt64)
	n := 0
	for e := head.next; e != head; {
		next := e.next
		if e.Expired(now) {
			s.tags[e.tag].Evictions[e.kind]++
			c.remove(s, e)
			s.stats.evictions++
			n++
		} else {
			soonest = min(soonest, e.expires)
		}
		e = next
	}
	s.soonest[k] = soonest
	s.lastSweep[k] = now
	return n
}

// largestKind picks the list to evict from under byte pressure: the kind
// holding most entries.
func (s *shard) largestKind() Kind {
	best, n := numKinds, 0
	for k := Kind(0); k < numKinds; k++ {
		if s.count[k] > n {
			best, n = k, s.count[k]
		}
	}
	return best
}

func (c *Cache) remove(s *shard, e *Entry) {
	delete(s.items, e.hash)
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
	s.tags[e.tag].Entries[e.kind]--
	if s.count[e.kind]--; s.count[e.kind] == 0 {
		s.soonest[e.kind] = math.MaxInt64
	}
	size := e.size()
	s.bytes -= size
	s.disown(e, size)
	c.entries[e.kind].Add(-1)
	c.bytes.Add(-size)
}

func (s *shard) pushFront(e *Entry) {
	head := &s.lru[e.kind]
	e.prev = head
	e.next = head.next
	head.next.prev = e
	head.next = e
}

func (s *shard) moveToFront(e *Entry) {
	head := &s.lru[e.kind]
	if head.next == e {
		return
	}
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev = head
	e.next = head.next
	head.next.prev = e
	head.next = e
}

// Stats is a snapshot of the cache's counters and gauges.
type Stats struct {
	Hits [numKinds]uint64 // by Kind
	// Prefetches counts hits that started a background refresh.
	Prefetches uint64
	Inserts    uint64
	Evictions  uint64
	Entries    [numKinds]int64 // by Kind
	Bytes      int64
}

// Stats sums the per-shard counters. It takes each shard lock briefly; call
// it from a metrics scrape, not per query.
func (c *Cache) Stats() Stats {
	var st Stats
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for k := range st.Hits {
			st.Hits[k] += s.stats.hits[k]
		}
		st.Prefetches += s.stats.prefetches
		st.Inserts += s.stats.inserts
		st.Evictions += s.stats.evictions
		s.mu.Unlock()
	}
	for k := range st.Entries {
		st.Entries[k] = c.entries[k].Load()
	}
	st.Bytes = c.bytes.Load()
	return st
}

// TagStats are the counts of the entries stored under one Policy.Tag.
type TagStats struct {
	Entries    [numKinds]int64  // now, by Kind
	Evictions  [numKinds]uint64 // removed to make room, by Kind
	Prefetches uint64           // hits that started a background refresh
}

// TagStats sums the per-tag counts of every shard, indexed by tag (tags
// never stored are absent or zero). Like Stats, for a metrics scrape.
func (c *Cache) TagStats() []TagStats {
	var out []TagStats
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		if len(s.tags) > len(out) {
			out = append(out, make([]TagStats, len(s.tags)-len(out))...)
		}
		for t, ts := range s.tags {
			for k := range ts.Entries {
				out[t].Entries[k] += ts.Entries[k]
			}
			for k := range ts.Evictions {
				out[t].Evictions[k] += ts.Evictions[k]
			}
			out[t].Prefetches += ts.Prefetches
		}
		s.mu.Unlock()
	}
	return out
}

// Kinds lists the kinds that are stored, for metrics labels.
func Kinds() []Kind { return []Kind{Success, Denial, ServFail} }

// hashQuestion is FNV-1a over the lower-cased name, type, class and key
// flags. Collisions are harmless: Get compares the stored question.
func hashQuestion(name []byte, qtype, qclass uint16, flags uint8) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for _, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		h ^= uint64(c)
		h *= prime
	}
	h ^= uint64(qtype)
	h *= prime
	h ^= uint64(qclass)
	h *= prime
	h ^= uint64(flags)
	h *= prime
	return h
}
