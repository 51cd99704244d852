package cache

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Kind is what an entry answers, for capacities, TTL caps and metrics.
type Kind uint8

// Kinds of entries.
const (
	// Success: NOERROR with records in the answer section.
	Success Kind = iota
	// Denial: NXDOMAIN, or NOERROR without answer records (NODATA), with
	// an SOA in the authority section (RFC 2308).
	Denial
	// ServFail: a SERVFAIL from the upstream, kept only briefly.
	ServFail
	// Uncacheable answers are relayed to the client and never stored.
	Uncacheable
	numKinds = Uncacheable
)

func (k Kind) String() string {
	switch k {
	case Success:
		return "success"
	case Denial:
		return "denial"
	case ServFail:
		return "servfail"
	}
	return "uncacheable"
}

// Flag bits that are part of the cache key.
const (
	keyDO = 1 << 0
	keyCD = 1 << 1
	// keyViewShift: the view (wire.Query.View, below 64) takes the
	// key's other 6 bits.
	keyViewShift = 2
)

// ErrMismatch means the upstream answered a different question: such an
// answer is neither cached nor relayed.
var ErrMismatch = errors.New("cache: answer does not match the question")

// rrField is the layout of one record of Entry.msg, recorded at build time
// so a hit needs no parsing: where its TTL is and the value to count down
// from (the received TTL, capped at the entry's lifetime), and where the
// record ends, which is where a truncated answer may be cut.
type rrField struct {
	off uint16 // offset of the 32-bit TTL field
	// name is the offset of the record's owner name when it is the
	// question name written out in full (an uncompressing upstream): hits
	// write the client's case there too. 0 when not.
	name uint16
	ttl  uint32
	end  uint16 // offset just past the rdata
}

// Entry is one cached answer: the upstream response as packed wire bytes
// (question name lower-cased, OPT removed, AA and TC cleared), plus the
// layout of its records (TTL offsets and record ends). Entries are immutable once built, so a reader
// may use one after the shard lock is released.
type Entry struct {
	msg  []byte
	rrs  []rrField // in message order: answer, authority, additional
	hash uint64
	// Unix nanoseconds: stored, expires; staleUntil ends the serve-stale
	// window (RFC 8767), equal to expires when the entry may not be
	// served stale.
	stored, expires, staleUntil int64
	// Owned by the shard lock: recency-list links, hits during the entry's life
	// (for prefetch), whether a prefetch was started, and the time before
	// which a stale entry is served without trying the upstream again
	// (set when a refresh failed).
	prev, next   *Entry
	lastUsed     int64 // unix ns of the last hit (eviction tie-break)
	refreshAfter int64
	// own: the client whose miss stored it (owner.go; the shard lock);
	// clients: the distinct clients that hit it, one bit per client's
	// hash (its popularity for eviction: the bits set).
	own     *owner
	clients uint64
	// lkg and kept: the zone's prefer_positive counters, and whether a
	// refresh that did not answer the question was refused in favour of
	// this entry (see Keep).
	lkg      *LastKnownGood
	hits     uint32
	pfHits   uint32 // Policy.PrefetchSet: the entry's own prefetch rule
	staleTTL uint32 // the TTL of every record when served stale
	nameLen  uint16
	qtype    uint16
	qclass   uint16
	tag      uint16 // Policy.Tag
	flags    uint8
	kind     Kind
	rcode    uint8
	pfPct    uint8
	pfSet    bool
	// prefetching: a prefetch was started (shard lock).
	prefetching bool
	keepTTL     bool // Policy.KeepTTL: no countdown
	// answering: a NOERROR whose answer section answers the question
	// (computed only under Policy.PreferPositive).
	answering bool
	kept      atomic.Bool
	// ede: the Extended DNS Error options (RFC 8914) of the answer, on the
	// entry a fetch's own clients get (BuildFetched, Pass), never cached.
	ede *[]byte
	// Fields ordered by size: 176 bytes, the 176-byte size class.
}

// Kind reports what the entry answers.
func (e *Entry) Kind() Kind { return e.kind }

// Rcode reports the entry's response code.
func (e *Entry) Rcode() int { return int(e.rcode) }

// TTL reports the entry's lifetime in the cache.
func (e *Entry) TTL() time.Duration { return time.Duration(e.expires - e.stored) }

// Expired reports whether the entry's lifetime is over at now (unix ns).
func (e *Entry) Expired(now int64) bool { return now >= e.expires }

// size is the memory the entry accounts for: its buffers plus the struct
// and a map slot. The struct and map overhead is an estimate measured with
// runtime.MemStats in TestMemoryBound.
func (e *Entry) size() int64 {
	return int64(cap(e.msg)) + int64(cap(e.rrs))*int64(unsafe.Sizeof(rrField{})) + entryOverhead
}

// entryOverhead is the Entry struct (176 B), the map slot (~24 B) and
// allocator rounding of the two buffers, rounded up (the owners, a few
// per shard, are in the rounding: TestMemoryBound).
const entryOverhead = 240

// Policy caps the lifetime of entries in one part of the name space.
type Policy struct {
	SuccessMax time.Duration // cap on positive answers
	DenialMax  time.Duration // cap on NXDOMAIN / NODATA (RFC 2308 §5)
	MinTTL     time.Duration // floor for both; 0 honours a TTL of 0 (not cached)
	// DenialMinTTL, when not negative, is the floor of denials instead of
	// MinTTL (a Corefile's `denial CAP TTL MINTTL`); the zero value keeps
	// MinTTL for both.
	DenialMinTTL time.Duration
	DenialMinSet bool
	// NoSuccess and NoDenial keep positive answers or denials out of the
	// cache (a Corefile's `disable success|denial`); they are still
	// answered.
	NoSuccess, NoDenial bool
	// Pass keeps every answer out of the cache and its TTLs as the
	// upstream gave them (a Corefile block without `cache`).
	Pass bool
	// DenialNoSOA stores a denial that carries no SOA as CoreDNS's cache
	// does (a Corefile block): for the smallest TTL of its answer and
	// authority records, or 5 s (CoreDNS's MinimalDefaultTTL) when it has
	// none, as a template's `rcode NOERROR` answer, clamped like any
	// denial. Off, such a denial has no stated lifetime and is not stored.
	DenialNoSOA bool
	// Uniform shows every record the entry's lifetime, as CoreDNS's cache
	// does: a TTL under the floor is shown raised to it, one over the cap
	// lowered to it, and all records of an answer count down together.
	// Off, each record keeps its own TTL, capped at the lifetime.
	Uniform bool
	// KeepTTL shows the stored TTLs without counting down (a Corefile's
	// `keepttl`).
	KeepTTL bool
	// PrefetchSet gives the entry its own prefetch rule instead of the
	// cache's (Config.PrefetchHits, last 10 %): refreshed once hit
	// PrefetchHits times (0: never) when PrefetchPercent % of its
	// lifetime or less is left (a Corefile's `prefetch AMOUNT [DURATION
	// [PERCENT%]]`).
	PrefetchSet     bool
	PrefetchHits    int
	PrefetchPercent int
	// PreferPositive marks the answers that answer their question (a
	// Corefile's `serve_stale_policy prefer_positive`, -last-known-good):
	// resolve then keeps such an answer over a refresh that does not
	// (Entry.Answering). LastKnownGood counts what it does for the zone.
	PreferPositive bool
	LastKnownGood  *LastKnownGood
	// StaleTTL, when StaleTTLSet, is the TTL of every record of an answer
	// served stale (a Corefile's serve_stale RESPONSE_TTL); else StaleTTL
	// (the package constant, 30 s).
	StaleTTL    uint32
	StaleTTLSet bool
	// Tag names the Corefile block whose cache the entry stands for
	// (0: none): entries, evictions and prefetches are counted per tag
	// (Cache.TagStats), as CoreDNS counts them per block's cache.
	Tag uint16
}

// Build makes an entry from the upstream response resp to the query q,
// deciding its kind and lifetime. An answer to another question returns
// ErrMismatch; a malformed one returns wire.ErrFormat. The returned entry
// can always answer the client, even when its kind is Uncacheable.
func Build(resp []byte, q *wire.Query, pol Policy, servfailTTL time.Duration, now int64) (*Entry, error) {
	return BuildStale(resp, q, pol, servfailTTL, 0, now)
}

// builder is the scratch of one BuildStale: the answer's layout and the
// compressor that re-packs it.
type builder struct {
	a   wire.Answer
	c   wire.Compressor
	buf []byte
}

// builderPool holds the builders of BuildStale.
var builderPool = sync.Pool{New: func() any { return new(builder) }}

// maxPooledRRs, maxPooledBytes: a builder's buffers that held a larger
// answer than this many records or bytes are left to the collector rather
// than pinned in the pool.
const (
	maxPooledRRs   = 64
	maxPooledBytes = 4096
)

// BuildStale is Build for a cache that serves stale answers: a positive or
// denial entry may be served for staleWindow past its expiry.
func BuildStale(resp []byte, q *wire.Query, pol Policy, servfailTTL, staleWindow time.Duration, now int64) (*Entry, error) {
	e, _, err := BuildFetched(resp, q, pol, servfailTTL, staleWindow, now)
	return e, err
}

// BuildFetched is BuildStale for the fetch that got resp: it also returns
// the entry the fetch's waiting clients are answered from. Under a Pass
// policy (a Corefile block without `cache`) an answer's Extended DNS Error
// options (RFC 8914: a template's ederror, an upstream's) reach them: that
// entry writes them in the client's OPT, as CoreDNS passes the answer's OPT
// on. Behind a cache CoreDNS drops every OPT of the answer before it is
// stored or written (plugin/cache filterRRSlice), the miss's answer too, so
// no client sees one: neither do ours. Otherwise both are e.
func BuildFetched(resp []byte, q *wire.Query, pol Policy, servfailTTL, staleWindow time.Duration, now int64) (e, fetched *Entry, err error) {
	// The records' layout, from a pool: ParseAnswer's slice of records
	// escapes, and every miss builds an entry (one allocation less each).
	bld := builderPool.Get().(*builder)
	a := &bld.a
	defer func() {
		// Large buffers are left to the collector, the rest is kept.
		rrs := a.RRs[:0]
		if cap(rrs) > maxPooledRRs {
			rrs = nil
		}
		*a = wire.Answer{RRs: rrs} // keeps no name of resp's
		if cap(bld.c.Layout) > maxPooledRRs {
			bld.c.Layout = nil
		}
		if cap(bld.buf) > maxPooledBytes {
			bld.buf = nil
		}
		builderPool.Put(bld)
	}()
	if err := wire.ParseAnswer(resp, a); err != nil {
		return nil, nil, err
	}
	if a.Flags&wire.FlagQR == 0 || a.Type != q.Type || a.Class != q.Class || !wire.EqualNameFold(a.Name, q.Name) {
		return nil, nil, ErrMismatch
	}
	msg, kept := storedMessage(bld, a, resp)
	e = &Entry{
		msg:     msg,
		nameLen: uint16(len(a.Name)),
		qtype:   a.Type,
		qclass:  a.Class,
		flags:   keyFlags(q),
		rcode:   uint8(a.Rcode4()),
		stored:  now,
		tag:     pol.Tag,
	}
	e.hash = hashQuestion(q.Name, q.Type, q.Class, e.flags)
	e.applyPolicy(a, kept, pol, servfailTTL, staleWindow, now)
	fetched = e
	if pol.Pass && a.OPTStart >= 0 {
		if ede := edeOptions(resp[a.OPTStart:a.OPTEnd]); ede != nil {
			fetched = e.withEDE(ede)
		}
	}
	return e, fetched, nil
}

// storedMessage is the message an entry stores of the answer resp
// (parsed into a): the records before its OPT, names compressed when that
// makes it smaller, the question name lower-cased (hits write the
// client's case), AA and TC cleared; kept is how many of a.RRs it holds
// (their offsets moved to the stored message's).
func storedMessage(bld *builder, a *wire.Answer, resp []byte) (msg []byte, kept int) {
	// Records past the OPT (rare) are dropped with it: their compression
	// pointers may point at names that would move.
	end := a.End
	_, an, ns, ar := wire.Counts(resp)
	if a.OPTStart >= 0 {
		end = a.OPTStart
		ar = 0
		for _, rr := range a.RRs {
			if rr.Section == wire.SectionAdditional && rr.Start < a.OPTStart {
				ar++
			}
		}
	}
	// Records kept: those before the OPT, a prefix of a.RRs.
	for kept < len(a.RRs) && a.RRs[kept].Start < end {
		kept++
	}
	// Names compressed when that makes the message smaller: kube-dns
	// writes them out in full over TCP, and a truncated answer would keep
	// fewer records than the stock node-local-dns's, which re-packs.
	// Most compressed answers are recognised without trying.
	if !wire.AlreadyCompressed(resp, a.RRs[:kept]) {
		if c, ok := bld.c.Compress(bld.buf[:0], resp, a.QEnd, a.RRs[:kept]); ok {
			bld.buf = c
			if len(c) < end {
				msg = make([]byte, len(c))
				copy(msg, c)
				for i, l := range bld.c.Layout {
					rr := &a.RRs[i]
					rr.Start, rr.TTLOff, rr.End = l.Start, l.TTLOff, l.End
				}
			}
		}
	}
	if msg == nil {
		msg = make([]byte, end)
		copy(msg, resp[:end])
	}
	wire.SetCounts(msg, 1, an, ns, ar)
	// Store the question name lower-cased: hits write the client's case.
	for i := wire.HeaderLen; i < wire.HeaderLen+len(a.Name); i++ {
		if c := msg[i]; 'A' <= c && c <= 'Z' {
			msg[i] = c + 'a' - 'A'
		}
	}
	wire.SetFlags(msg, a.Flags&^(wire.FlagAA|wire.FlagTC))
	return msg, kept
}

// applyPolicy sets what pol makes of the entry of the answer a (kept of
// its records stored): its kind and lifetime, what its hits show, its
// stale window, its prefetch, and under prefer_positive whether it
// answers its question.
func (e *Entry) applyPolicy(a *wire.Answer, kept int, pol Policy, servfailTTL, staleWindow time.Duration, now int64) {
	e.kind, e.expires = classify(a, pol, servfailTTL, now)
	// A disabled kind is not stored but shown as if cached, as CoreDNS
	// applies its caps to every answer passing its cache.
	shown := e.kind != Uncacheable && !pol.Pass && a.Rcode <= 0xF && a.Flags&wire.FlagTC == 0
	if (e.kind == Success && pol.NoSuccess) || (e.kind == Denial && pol.NoDenial) || pol.Pass {
		e.kind = Uncacheable
	}
	e.keepTTL = pol.KeepTTL
	e.staleTTL = StaleTTL
	if pol.StaleTTLSet {
		e.staleTTL = pol.StaleTTL
	}
	if pol.PrefetchSet {
		e.pfSet, e.pfHits, e.pfPct = true, uint32(max(0, pol.PrefetchHits)), uint8(min(100, max(0, pol.PrefetchPercent)))
	}
	if a.Rcode > 0xF || a.Flags&wire.FlagTC != 0 || e.expires <= now {
		// Extended rcodes live in the OPT we drop; a truncated answer is
		// not the whole answer; a lifetime of 0 means do not cache.
		e.kind = Uncacheable
	}
	e.staleUntil = e.expires
	if e.kind == Success || e.kind == Denial {
		e.staleUntil += int64(staleWindow)
	}
	msg := e.msg
	life := uint32((e.expires - now) / int64(time.Second))
	e.rrs = make([]rrField, 0, kept)
	for _, rr := range a.RRs[:kept] {
		t := rr.TTL
		if shown && e.expires > now && (t > life || pol.Uniform) {
			t = life
		}
		f := rrField{off: uint16(rr.TTLOff), ttl: t, end: uint16(rr.End)}
		if n := len(a.Name); rr.TTLOff-4-rr.Start == n && wire.EqualNameFold(msg[rr.Start:rr.Start+n], a.Name) {
			f.name = uint16(rr.Start)
		}
		e.rrs = append(e.rrs, f)
	}
	if pol.PreferPositive {
		e.lkg = pol.LastKnownGood
		if e.kind == Success && e.rcode == wire.RcodeSuccess && a.Flags&wire.FlagTC == 0 {
			e.answering = answersQuestion(msg, a.RRs[:kept], a.Type, a.Class, msg[wire.HeaderLen:wire.HeaderLen+len(a.Name)])
		}
	}
}

// maxEDEBytes bounds the Extended DNS Error options an answer passes on to
// its fetch's clients (a template's text is at most 255 bytes).
const maxEDEBytes = 512

// edeOptions copies the Extended DNS Error options (code 15, RFC 8914) of
// the OPT record opt, as written (code, length, data); nil when it has
// none, is malformed, or they pass maxEDEBytes.
func edeOptions(opt []byte) []byte {
	// Root owner (1), type (2), class (2), TTL (4), rdlength (2).
	if len(opt) < wire.OPTLen || opt[0] != 0 {
		return nil
	}
	rd := opt[wire.OPTLen:]
	if int(binary.BigEndian.Uint16(opt[9:])) != len(rd) {
		return nil
	}
	var out []byte
	for len(rd) >= 4 {
		code, n := binary.BigEndian.Uint16(rd), int(binary.BigEndian.Uint16(rd[2:]))
		if 4+n > len(rd) {
			return nil
		}
		if code == dnsOptionEDE && n >= 2 {
			if len(out)+4+n > maxEDEBytes {
				return nil
			}
			out = append(out, rd[:4+n]...)
		}
		rd = rd[4+n:]
	}
	return out
}

// dnsOptionEDE is the EDNS option code of an Extended DNS Error.
const dnsOptionEDE = 15

// withEDE is a copy of e that writes the options ede in the client's OPT;
// it shares e's immutable message and layout and is never cached.
func (e *Entry) withEDE(ede []byte) *Entry {
	return &Entry{
		msg: e.msg, rrs: e.rrs, hash: e.hash,
		stored: e.stored, expires: e.expires, staleUntil: e.staleUntil,
		lkg: e.lkg, pfHits: e.pfHits, staleTTL: e.staleTTL,
		nameLen: e.nameLen, qtype: e.qtype, qclass: e.qclass, tag: e.tag, flags: e.flags,
		kind: e.kind, rcode: e.rcode, pfPct: e.pfPct, pfSet: e.pfSet, keepTTL: e.keepTTL, answering: e.answering,
		ede: &ede,
	}
}

// classify decides the kind and the expiry time of an answer.
func classify(a *wire.Answer, pol Policy, servfailTTL time.Duration, now int64) (Kind, int64) {
	switch a.Rcode {
	case wire.RcodeServFail:
		if servfailTTL <= 0 {
			return Uncacheable, now
		}
		return ServFail, now + int64(servfailTTL)
	case wire.RcodeSuccess, wire.RcodeNXDomain:
	default:
		return Uncacheable, now
	}
	answers := 0
	minTTL := uint32(0xFFFFFFFF)
	var soa *wire.RR
	for i := range a.RRs {
		rr := &a.RRs[i]
		switch rr.Section {
		case wire.SectionAnswer:
			answers++
			minTTL = min(minTTL, rr.TTL)
		case wire.SectionAuthority:
			minTTL = min(minTTL, rr.TTL)
			if rr.Type == wire.TypeSOA && soa == nil {
				soa = rr
			}
		}
	}
	if a.Rcode == wire.RcodeSuccess && answers > 0 {
		return Success, now + int64(clamp(time.Duration(minTTL)*time.Second, pol.MinTTL, pol.SuccessMax))
	}
	// NXDOMAIN or NODATA: the SOA says how long the denial holds
	// (RFC 2308 §5: the lesser of its TTL and its MINIMUM field). Without
	// one there is no stated lifetime, so the denial is not stored, unless
	// the policy says to keep it as CoreDNS would (DenialNoSOA).
	var ttl uint32
	switch {
	case soa != nil:
		ttl = min(soa.TTL, soa.SOAMinimum)
	case !pol.DenialNoSOA:
		return Uncacheable, now
	case minTTL == 0xFFFFFFFF: // no record at all
		ttl = coreDNSFailSafeTTL
	default:
		ttl = minTTL
	}
	floor := pol.MinTTL
	if pol.DenialMinSet {
		floor = pol.DenialMinTTL
	}
	return Denial, now + int64(clamp(time.Duration(ttl)*time.Second, floor, pol.DenialMax))
}

// coreDNSFailSafeTTL is the lifetime CoreDNS's cache gives an answer with no
// records (dnsutil.MinimalDefaultTTL, 5 s).
const coreDNSFailSafeTTL = 5

func clamp(d, lo, hi time.Duration) time.Duration {
	if d > hi {
		d = hi
	}
	if d < lo {
		d = lo
	}
	return d
}

func keyFlags(q *wire.Query) uint8 {
	var f uint8
	if q.DO {
		f |= keyDO
	}
	if q.CD() {
		f |= keyCD
	}
	return f | q.View<<keyViewShift
}

// matches reports whether e answers the question of q (the guard against
// hash collisions).
func (e *Entry) matches(q *wire.Query, flags uint8) bool {
	return e.qtype == q.Type && e.qclass == q.Class && e.flags == flags &&
		int(e.nameLen) == len(q.Name) &&
		wire.EqualNameFold(e.msg[wire.HeaderLen:wire.HeaderLen+int(e.nameLen)], q.Name)
}

// Write appends the answer for the client query q to dst and returns it.
// It writes the client's ID, RD bit and qname case, the remaining TTLs at
// now (unix ns), and the client's OPT (advertising ednsSize). An answer
// larger than maxSize (raised to 512, RFC 6891 §6.2.5) is truncated as
// miekg/dns's Msg.Truncate and CoreDNS do: it keeps every whole record that
// fits in message order (answer, then authority, then additional; the first
// record that does not fit ends it), keeps the client's OPT, and sets TC.
// A resolver that cannot retry over TCP (musl before 1.2.4) uses what it
// got; the others retry over TCP and get the whole answer from this entry.
// It does not allocate when dst has room.
func (e *Entry) Write(dst []byte, q *wire.Query, now int64, maxSize int, ednsSize uint16) []byte {
	return e.write(dst, q, now, maxSize, ednsSize, false)
}

// StaleTTL is the TTL of a stale answer (RFC 8767 §4 recommends 30 s).
const StaleTTL = 30

// WriteStale is Write for an expired entry served stale: every TTL is
// StaleTTL, or the policy's (Policy.StaleTTLSet).
func (e *Entry) WriteStale(dst []byte, q *wire.Query, maxSize int, ednsSize uint16) []byte {
	return e.write(dst, q, 0, maxSize, ednsSize, true)
}

func (e *Entry) write(dst []byte, q *wire.Query, now int64, maxSize int, ednsSize uint16, stale bool) []byte {
	size := max(maxSize, wire.MinUDPSize)
	var ede []byte
	if q.EDNS {
		if e.ede != nil {
			ede = *e.ede
		}
		size -= wire.OPTLen + len(ede)
	}
	end, n := len(e.msg), len(e.rrs)
	truncated := end > size
	if truncated {
		end, n = e.cut(size)
	}
	start := len(dst)
	dst = append(dst, e.msg[:end]...)
	out := dst[start:]
	wire.SetID(out, q.ID)
	// The header is the query's (ReplyFlags: opcode, RD, CD) and ours (RA:
	// every name is resolved for the client; TC) with the stored rcode; the
	// upstream's own bits are not passed on: an upstream that does not
	// copy CD (Knot, NSD) or sets Z must not change what the client gets.
	flags := q.ReplyFlags() | wire.FlagRA | wire.Flags(e.msg)&0xF
	if q.DO || q.Flags&wire.FlagAD != 0 {
		// RFC 6840 §5.8: AD only for clients that asked about DNSSEC.
		flags |= wire.Flags(e.msg) & wire.FlagAD
	}
	if truncated {
		flags |= wire.FlagTC
	}
	wire.SetFlags(out, flags)
	copy(out[wire.HeaderLen:], q.Name)
	age := now - e.stored
	if age < 0 || e.keepTTL {
		age = 0
	}
	ageSec := uint32(age / int64(time.Second))
	rrs := e.rrs[:n]
	for i := range rrs {
		f := &rrs[i]
		t := uint32(0)
		switch {
		case stale:
			t = e.staleTTL
		case f.ttl > ageSec:
			t = f.ttl - ageSec
		}
		// Bounds checked, not trusted: an entry's layout is Build's own
		// or checked as such (checkImported), but a wrong one must cost
		// its record, not the process.
		if o := int(f.off); o+4 <= len(out) {
			binary.BigEndian.PutUint32(out[o:o+4], t)
		}
		if f.name != 0 && int(f.name) < len(out) {
			copy(out[f.name:], q.Name)
		}
	}
	if !truncated && !q.EDNS {
		return dst
	}
	_, an, ns, ar := wire.Counts(out)
	if truncated {
		// The kept records are the first n in message order.
		an = min(an, uint16(n))
		ns = min(ns, uint16(n)-an)
		ar = uint16(n) - an - ns
	}
	if q.EDNS {
		ar++
		dst = wire.AppendOPT(dst, ednsSize, q.DO, 0)
		if len(ede) > 0 {
			binary.BigEndian.PutUint16(dst[len(dst)-2:], uint16(len(ede)))
			dst = append(dst, ede...)
		}
		out = dst[start:]
	}
	wire.SetCounts(out, 1, an, ns, ar)
	return dst
}

// cut returns the end of the longest run of whole records, from the first
// one, that fits in size bytes (the header and question when none does),
// and how many records that is; size is less than the whole message. The
// stored message is prefix-closed (compression pointers only point
// backwards), so any such prefix is a valid message. No parsing: the record
// ends were recorded at build time.
func (e *Entry) cut(size int) (end, n int) {
	// Binary search for the first record that does not fit; ends grow.
	lo, hi := 0, len(e.rrs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int(e.rrs[mid].end) <= size {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return min(wire.HeaderLen+int(e.nameLen)+4, len(e.msg)), 0
	}
	return min(int(e.rrs[lo-1].end), len(e.msg)), lo
}
