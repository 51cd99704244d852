package cache

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// owner is a client's part of one shard: the entries its misses stored
// (wire.Query.Client of the flight's first asker, as package fair keys
// it), counted so that eviction knows who holds more than its share of
// the shard. Under the shard lock.
type owner struct {
	key   netip.Addr
	bytes int64
	count [numKinds]int
}

// ownerOf returns key's owner in s, made on its first entry.
func (s *shard) ownerOf(key netip.Addr) *owner {
	o := s.owners[key]
	if o == nil {
		o = &owner{key: key}
		s.owners[key] = o
	}
	return o
}

// own counts e, about to be stored, as o's.
func (s *shard) own(e *Entry, o *owner, size int64) {
	e.own = o
	o.bytes += size
	o.count[e.kind]++
}

// disown takes e out of its owner's count; an owner left with nothing is
// forgotten.
func (s *shard) disown(e *Entry, size int64) {
	o := e.own
	o.bytes -= size
	o.count[e.kind]--
	if o.bytes == 0 {
		delete(s.owners, o.key)
	}
}

// heavy reports whether o holds at least its equal part of the shard's
// bytes (the shard's bytes over the number of its owners): a client that
// holds less is not evicted from for another's insert while a heavier one
// has entries to give.
func (s *shard) heavy(o *owner) bool {
	return o.bytes*int64(len(s.owners)) >= s.bytes
}

// target is whose entry of kind k makes room for an insert of ins's (nil:
// an owner nobody tracks, an import): ins's own when it holds its equal
// part or more, so one client's new names push out only its own while
// others use the cache; else the owner holding the most bytes that has an
// entry of the kind. A walk over the shard's owners (a node's pods: a few
// hundred at most), only when the inserting client is a light one.
func (s *shard) target(k Kind, ins *owner) *owner {
	if ins != nil && ins.count[k] > 0 && s.heavy(ins) {
		return ins
	}
	var top *owner
	for _, o := range s.owners {
		if o.count[k] > 0 && (top == nil || o.bytes > top.bytes) {
			top = o
		}
	}
	return top
}

// clientBit is the bit of a client in an entry's clients: a hash of its
// key. Two clients share a bit now and then, which only makes an entry
// look a little less popular than it is.
func clientBit(c netip.Addr) uint64 {
	b := c.As16()
	x := binary.LittleEndian.Uint64(b[:8]) ^ binary.LittleEndian.Uint64(b[8:])
	x *= 0x9e3779b97f4a7c15
	return 1 << (x >> 58)
}

// popularity is how many distinct clients hit e (at most 64).
func (e *Entry) popularity() int { return bits.OnesCount64(e.clients) }

// lessValuable reports whether a is the better one to evict than b: less
// popular, or as popular and less recently used.
func lessValuable(a, b *Entry) bool {
	pa, pb := a.popularity(), b.popularity()
	return pa < pb || (pa == pb && a.lastUsed < b.lastUsed)
}

// evictScan is how many entries of the shard eviction looks at, at most,
// for evictSample of the target owner's; an owner with fewer among them
// gives its least recently used entry.
const evictScan = 64
