package cache

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// A cache handed to a twin (a rollout's new instance; internal/daemon's
// control socket carries the bytes): Export writes the entries still
// usable, Import checks and keeps those whose policy has not changed. Both
// sides are the same build, or at least the same ExportVersion: Import
// refuses any other, and the twin then starts empty and says so.
//
// The stream is ExportVersion as 4 bytes, then per entry its length (4
// bytes) and its fields (appendEntry), then a length of 0.

// ExportVersion names the layout of an exported entry. Change it with
// Entry's fields (TestExportCoversEntry counts them).
const ExportVersion uint32 = 2

// ErrExportVersion: the stream is of another layout.
var ErrExportVersion = errors.New("cache: exported by another version")

// maxExportEntry bounds one entry's bytes on import: a message of at most
// 64 KiB and its layout.
const maxExportEntry = 1 << 18

// Fingerprint identifies the policy that a question (its name, lower-case
// wire format, and view) has, and gives that policy's tag (Policy.Tag):
// an entry is kept across a handover only when the policy that built it
// and the importer's for it agree, and then its tag must be the
// importer's (the tag sizes the cache's per-tag counters: one from
// outside must not).
type Fingerprint func(name []byte, view uint8) (fp uint64, tag uint16)

// Export writes, shard by shard and most recently used first, the entries that may still
// answer at now (fresh, or within their stale window), up to maxBytes of
// stream: each shard gets an equal share of what the shards before it
// left, so a bound below the cache's size keeps the most recently used
// entries of every shard rather than all of a few. It returns how many it
// wrote.
func (c *Cache) Export(w io.Writer, now int64, fp Fingerprint, maxBytes int64) (int, error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	var buf []byte
	buf = binary.BigEndian.AppendUint32(buf[:0], ExportVersion)
	written := int64(len(buf))
	if _, err := bw.Write(buf); err != nil {
		return 0, err
	}
	n := 0
	var batch []*Entry
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		batch = batch[:0] // copied out so the shard is not held while writing
		for k := range s.lru {
			head := &s.lru[k]
			for e := head.next; e != head; e = e.next {
				if now < e.staleUntil || now < e.expires {
					batch = append(batch, e)
				}
			}
		}
		s.mu.Unlock()
		// The 4 bytes of the final length stay free.
		limit := written + (maxBytes-written-4)/int64(len(c.shards)-i)
		for _, e := range batch {
			f, _ := fp(e.msg[12:12+int(e.nameLen)], e.flags>>keyViewShift)
			buf = appendEntry(buf[:0], e, f)
			if written+int64(len(buf)) > limit {
				break
			}
			written += int64(len(buf))
			if _, err := bw.Write(buf); err != nil {
				return n, err
			}
			n++
		}
	}
	clear(batch)
	if _, err := bw.Write([]byte{0, 0, 0, 0}); err != nil {
		return n, err
	}
	return n, bw.Flush()
}

// appendEntry appends e's length-prefixed record.
func appendEntry(b []byte, e *Entry, fp uint64) []byte {
	b = append(b, 0, 0, 0, 0) // length, below
	b = binary.BigEndian.AppendUint64(b, fp)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.msg)))
	b = append(b, e.msg...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.rrs)))
	for _, r := range e.rrs {
		b = binary.BigEndian.AppendUint16(b, r.off)
		b = binary.BigEndian.AppendUint16(b, r.name)
		b = binary.BigEndian.AppendUint32(b, r.ttl)
		b = binary.BigEndian.AppendUint16(b, r.end)
	}
	b = binary.BigEndian.AppendUint16(b, e.nameLen)
	b = binary.BigEndian.AppendUint16(b, e.qtype)
	b = binary.BigEndian.AppendUint16(b, e.qclass)
	b = append(b, e.flags, byte(e.kind), e.rcode)
	// Not refreshAfter, the shard's (a failed refresh's recheck restarts).
	for _, t := range [...]int64{e.stored, e.expires, e.staleUntil} {
		b = binary.BigEndian.AppendUint64(b, uint64(t))
	}
	b = append(b, boolByte(e.keepTTL), boolByte(e.pfSet), e.pfPct)
	b = binary.BigEndian.AppendUint32(b, e.pfHits)
	b = binary.BigEndian.AppendUint16(b, e.tag)
	// prefer_positive: whether it answers, whether a refresh was refused
	// for it, the stale TTL, and its zone's counters by zone name (the
	// twin's policy for the name is the same: the fingerprints agree).
	b = append(b, boolByte(e.answering), boolByte(e.kept.Load()))
	b = binary.BigEndian.AppendUint32(b, e.staleTTL)
	if e.lkg == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1, byte(min(len(e.lkg.Zone), 255)))
		b = append(b, e.lkg.Zone[:min(len(e.lkg.Zone), 255)]...)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// ImportStats says what Import did.
type ImportStats struct {
	Kept     int // entries put in the cache
	Changed  int // dropped: their policy is not the importer's
	Expired  int // dropped: no longer usable at now
	Rejected int // not kept by Put (kinds the cache does not keep, capacity)
	// Invalid: dropped, not what Build makes of a well-formed answer
	// (checkImported); InvalidErr says why for the first of them.
	Invalid    int
	InvalidErr error
}

// Dropped is every entry read and not kept.
func (st ImportStats) Dropped() int { return st.Changed + st.Expired + st.Rejected + st.Invalid }

// Import reads what Export wrote and keeps the entries whose policy is the
// importer's (fp) and that are still usable at now. A stream of another
// version is refused whole (ErrExportVersion); a stream that breaks its
// framing (a length over maxExportEntry, a short read) ends the import
// with an error, keeping what came before. Each entry is checked as
// strictly as an upstream answer before it is kept (checkImported): one
// that fails is dropped and counted (Invalid), and the import goes on.
func (c *Cache) Import(r io.Reader, now int64, fp Fingerprint) (ImportStats, error) {
	return c.ImportShifted(r, now, 0, fp)
}

// ImportShifted is Import for entries whose times were read on another
// clock: shift (ns) is added to each entry's times first (internal/snapshot
// computes it for a file written before a restart).
func (c *Cache) ImportShifted(r io.Reader, now, shift int64, fp Fingerprint) (ImportStats, error) {
	var st ImportStats
	br := bufio.NewReaderSize(r, 64<<10)
	var hdr [4]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return st, err
	}
	if v := binary.BigEndian.Uint32(hdr[:]); v != ExportVersion {
		return st, fmt.Errorf("%w: version %d, ours %d", ErrExportVersion, v, ExportVersion)
	}
	var buf []byte
	var a wire.Answer
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return st, err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			return st, nil
		}
		if n > maxExportEntry {
			return st, fmt.Errorf("cache import: an entry of %d bytes", n)
		}
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(br, buf); err != nil {
			return st, err
		}
		e, want, err := parseEntry(buf)
		if err == nil {
			e.stored, e.expires, e.staleUntil = e.stored+shift, e.expires+shift, e.staleUntil+shift
			err = checkImported(e, &a)
		}
		if err != nil {
			if st.Invalid++; st.InvalidErr == nil {
				st.InvalidErr = err
			}
			continue
		}
		got, tag := fp(e.msg[12:12+int(e.nameLen)], e.flags>>keyViewShift)
		switch {
		case now >= e.staleUntil && now >= e.expires:
			st.Expired++
		case got != want:
			st.Changed++
		case tag != e.tag:
			if st.Invalid++; st.InvalidErr == nil {
				st.InvalidErr = fmt.Errorf("tag %d, its policy's is %d", e.tag, tag)
			}
		case c.Put(e):
			st.Kept++
		default:
			st.Rejected++
		}
	}
}

// parseEntry reads one record of appendEntry (without its length) into a
// new entry; checkImported then checks what it says.
func parseEntry(b []byte) (*Entry, uint64, error) {
	r := reader{b: b}
	fp := r.u64()
	ml := int(r.u16())
	msg := r.bytes(ml)
	nrr := int(r.u16())
	if r.err || nrr > len(b)/10 || ml < wire.HeaderLen {
		return nil, 0, errMalformed
	}
	e := &Entry{msg: append([]byte(nil), msg...), rrs: make([]rrField, nrr)}
	for i := range e.rrs {
		e.rrs[i] = rrField{off: r.u16(), name: r.u16(), ttl: r.u32(), end: r.u16()}
	}
	e.nameLen, e.qtype, e.qclass = r.u16(), r.u16(), r.u16()
	e.flags, e.kind, e.rcode = r.u8(), Kind(r.u8()), r.u8()
	e.stored, e.expires, e.staleUntil = int64(r.u64()), int64(r.u64()), int64(r.u64())
	e.keepTTL, e.pfSet, e.pfPct = r.u8() == 1, r.u8() == 1, r.u8()
	e.pfHits, e.tag = r.u32(), r.u16()
	e.answering = r.u8() == 1
	e.kept.Store(r.u8() == 1)
	e.staleTTL = r.u32()
	if r.u8() == 1 {
		// Only a zone the importer's configuration counts: a name from
		// outside must not add a metrics series.
		e.lkg = knownLastKnownGood(string(r.bytes(int(r.u8()))))
	}
	if r.err || len(r.b) != 0 || len(e.msg) < wire.HeaderLen+int(e.nameLen) {
		return nil, 0, errMalformed
	}
	e.hash = hashQuestion(e.msg[12:12+int(e.nameLen)], e.qtype, e.qclass, e.flags)
	return e, fp, nil
}

// errMalformed: an entry's fields do not fill its record exactly.
var errMalformed = errors.New("cache import: malformed entry")

// reader reads big-endian fields, remembering a short read.
type reader struct {
	b   []byte
	err bool
}

func (r *reader) bytes(n int) []byte {
	if n > len(r.b) {
		r.err, r.b = true, nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.bytes(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.bytes(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.bytes(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.bytes(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}
