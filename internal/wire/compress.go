package wire

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// Compressor re-packs a response with name compression (RFC 1035 §4.1.4).
// kube-dns (CoreDNS) compresses only what would not fit the client's size,
// so its TCP answers, and its UDP answers that fit 1232 bytes, come with
// every name written out in full; relayed as they came, a truncated answer
// keeps far fewer records than the stock node-local-dns, which re-packs them
// with miekg/dns and compression. The zero value is ready to use; a
// Compressor is not safe for concurrent use, reuse it (from a pool) to
// avoid allocating.
//
// It compresses as miekg/dns's Msg.Pack with Compress set does, or better:
// every name in place is matched, longest suffix first, against the suffixes
// of the names written before it (the question included), and the names
// inside the rdata of NS, MD, MF, CNAME, SOA, MB, MG, MR, PTR, MINFO and MX
// (RFC 3597 §4's list) likewise; the names inside other types' rdata (SRV,
// DNAME, NAPTR...) are written out in full but can be pointed at. Names
// match ignoring ASCII case (RFC 4343), where miekg/dns matches only equal
// case: a later name may show the case of an earlier equal one, and a name
// that points into the question shows the case the client asked in (the
// owner names equal to the question showed it before, written there on
// every hit). Only offsets below 0x4000 can be pointed at.
type Compressor struct {
	// Layout holds, after a successful Compress, the new offsets of the
	// records given, in the same order (Section, Type, TTL and SOAMinimum
	// unchanged).
	Layout []RR
	names  []byte     // the expanded names written, for comparisons
	slots  []slot     // open-addressed hash table of suffixes
	gen    uint32     // generation of slots in use; older ones are empty
	used   int        // slots used in this generation
	exp    [256]byte  // the name being written, expanded
	labels [128]uint8 // offsets of its labels in exp
}

type slot struct {
	gen  uint32
	hash uint32
	off  uint16 // where the suffix is in the output
	name uint16 // where its bytes are in names
	n    uint8  // its length
}

const (
	// numSlots bounds the suffixes recorded per message (three quarters
	// of it, maxUsed): far more than real answers have (a headless
	// Service's A records record the question's few; 100 SRV targets a
	// hundred or two). Past it, names are still written, uncompressed.
	numSlots = 1 << 11 // a power of two
	maxUsed  = numSlots * 3 / 4
	maxPtr   = 0x3FFF
)

// Compress appends to dst the message b (header and question from b, whose
// question ends at qEnd and is written out in full) followed by the records
// rrs (laid out in b as ParseAnswer records them, in message order) with
// their names compressed, and records their new offsets in c.Layout. The
// header's counts are copied as they are in b: the caller sets them. It
// returns false, and dst as it was, when a name is malformed (a pointer
// that does not point backwards, a loop, a name or label too long) or the
// rdata of a type with names does not hold them exactly, or the result
// would exceed 65535 bytes.
func (c *Compressor) Compress(dst, b []byte, qEnd int, rrs []RR) ([]byte, bool) {
	start := len(dst)
	if c.slots == nil {
		c.slots = make([]slot, numSlots)
	}
	c.gen++
	if c.gen == 0 { // wrapped: clear the old generations for good
		clear(c.slots)
		c.gen = 1
	}
	c.used = 0
	c.names = c.names[:0]
	if cap(c.Layout) < len(rrs) {
		c.Layout = make([]RR, 0, len(rrs))
	}
	c.Layout = c.Layout[:0]
	if qEnd < HeaderLen+5 || qEnd > len(b) {
		return dst[:start], false
	}
	dst = append(dst, b[:HeaderLen]...)
	var ok bool
	var end int
	if dst, end, ok = c.name(dst, start, b[:qEnd], HeaderLen, false); !ok || end != qEnd-4 {
		return dst[:start], false
	}
	dst = append(dst, b[qEnd-4:qEnd]...)
	qname := b[HeaderLen : qEnd-4]
	for _, rr := range rrs {
		nameEnd := rr.TTLOff - 4
		if rr.Start < qEnd || nameEnd < rr.Start || rr.End > len(b) || nameEnd+10 > rr.End {
			return dst[:start], false
		}
		out := RR{Section: rr.Section, Type: rr.Type, TTL: rr.TTL, SOAMinimum: rr.SOAMinimum, Start: len(dst) - start}
		if owner := b[rr.Start:nameEnd]; isName(owner, qname) {
			// The owner is the question's name (most records are): the
			// longest match is the question itself, no need to look.
			dst = append(dst, 0xC0, HeaderLen)
		} else if dst, end, ok = c.name(dst, start, b[:nameEnd], rr.Start, true); !ok || end != nameEnd {
			return dst[:start], false
		}
		out.TTLOff = len(dst) - start + 4
		dst = append(dst, b[nameEnd:nameEnd+8]...)
		lenAt := len(dst)
		dst = append(dst, 0, 0)
		rd := nameEnd + 10
		if dst, ok = c.rdata(dst, start, b[:rr.End], rd, rr.Type); !ok {
			return dst[:start], false
		}
		rdlen := len(dst) - lenAt - 2
		if rdlen > 0xFFFF || len(dst)-start > 0xFFFF {
			return dst[:start], false
		}
		binary.BigEndian.PutUint16(dst[lenAt:], uint16(rdlen))
		out.End = len(dst) - start
		c.Layout = append(c.Layout, out)
	}
	return dst, true
}

// rdata writes the rdata b[off:] of a record of type typ.
func (c *Compressor) rdata(dst []byte, start int, b []byte, off int, typ uint16) ([]byte, bool) {
	fields := rdataFields(typ)
	if fields == "" || typ == TypeTXT || typ == TypeA || typ == TypeAAAA || typ == TypeOPT {
		// No names (or opaque, RFC 3597): copied as it is.
		return append(dst, b[off:]...), true
	}
	compress := compressible(typ)
	var ok bool
	for i := 0; i < len(fields); i++ {
		n := 0
		switch fields[i] {
		case 'n':
			if dst, off, ok = c.name(dst, start, b, off, compress); !ok {
				return dst, false
			}
			continue
		case '2':
			n = 2
		case 'S':
			n = 20
		case 's':
			if off < len(b) {
				n = 1 + int(b[off])
			} else {
				n = 1
			}
		default:
			return dst, false
		}
		if off+n > len(b) {
			return dst, false
		}
		dst = append(dst, b[off:off+n]...)
		off += n
	}
	return dst, off == len(b)
}

// isName reports whether the name in place owner (the bytes of an owner
// name, up to its type) is the question's name qname (uncompressed, at
// HeaderLen): written out in full, ignoring case, or a pointer to it. The
// root (one byte) is never pointed at.
func isName(owner, qname []byte) bool {
	if len(qname) < 2 {
		return false
	}
	if len(owner) == 2 {
		return owner[0] == 0xC0 && owner[1] == HeaderLen
	}
	return len(owner) == len(qname) && (bytes.Equal(owner, qname) || EqualNameFold(owner, qname))
}

// AlreadyCompressed reports whether re-packing the records rrs of b could
// not make it smaller, without trying: every owner name is a pointer to
// the question (or the root) and no rdata holds a name. Most answers of
// upstreams that compress (A, AAAA, TXT records of the name asked) are so.
func AlreadyCompressed(b []byte, rrs []RR) bool {
	for _, rr := range rrs {
		if rr.Start+2 > len(b) || strings.IndexByte(rdataFields(rr.Type), 'n') >= 0 {
			return false
		}
		if b[rr.Start] != 0 && binary.BigEndian.Uint16(b[rr.Start:]) != 0xC000|HeaderLen {
			return false
		}
	}
	return true
}

// compressible reports whether names in the rdata of typ may be compressed
// (RFC 3597 §4: only RFC 1035's types; miekg/dns compresses the same).
func compressible(typ uint16) bool {
	switch typ {
	case TypeNS, typeMD, typeMF, TypeCNAME, TypeSOA, typeMB, typeMG, typeMR, TypePTR, typeMINFO, TypeMX:
		return true
	}
	return false
}

// name writes the possibly compressed name at b[off:] (pointers followed
// within b, CheckName's rules) to dst, compressed when compress is set, and
// records the suffixes it writes out. It returns the offset past the name
// in b.
func (c *Compressor) name(dst []byte, start int, b []byte, off int, compress bool) ([]byte, int, bool) {
	// Expand the name.
	end := -1
	seg := off
	n, nl, hops := 0, 0, 0
	for {
		if off >= len(b) {
			return dst, 0, false
		}
		l := int(b[off])
		if l == 0 {
			if end < 0 {
				end = off + 1
			}
			break
		}
		if l&0xC0 == 0xC0 {
			if off+2 > len(b) {
				return dst, 0, false
			}
			ptr := int(binary.BigEndian.Uint16(b[off:]) & 0x3FFF)
			if ptr < HeaderLen || ptr >= seg {
				return dst, 0, false
			}
			if hops++; hops > maxPointers {
				return dst, 0, false
			}
			if end < 0 {
				end = off + 2
			}
			off, seg = ptr, ptr
			continue
		}
		if l > 63 || off+1+l > len(b) || n+1+l+1 > MaxNameLen {
			return dst, 0, false
		}
		c.labels[nl] = uint8(n)
		nl++
		n += copy(c.exp[n:], b[off:off+1+l])
		off += 1 + l
	}
	exp := c.exp[:n]
	// Write it: each suffix, longest first, is either found (a pointer ends
	// the name) or written out and recorded.
	nameAt := -1
	for i := 0; i < nl; i++ {
		suffix := exp[c.labels[i]:]
		h := hashFold(suffix)
		if s := c.find(h, suffix); s != nil && compress {
			dst = binary.BigEndian.AppendUint16(dst, 0xC000|s.off)
			return dst, end, true
		} else if s == nil && len(dst)-start <= maxPtr && c.used < maxUsed && len(c.names)+n <= 0xFFFF {
			if nameAt < 0 {
				nameAt = len(c.names)
				c.names = append(c.names, exp...)
			}
			c.insert(h, uint16(len(dst)-start), uint16(nameAt+int(c.labels[i])), uint8(len(suffix)))
		}
		dst = append(dst, suffix[:1+suffix[0]]...)
	}
	return append(dst, 0), end, true
}

func (c *Compressor) find(h uint32, suffix []byte) *slot {
	for i := h & (numSlots - 1); ; i = (i + 1) & (numSlots - 1) {
		s := &c.slots[i]
		if s.gen != c.gen {
			return nil
		}
		if s.hash == h && int(s.n) == len(suffix) && EqualNameFold(c.names[s.name:int(s.name)+int(s.n)], suffix) {
			return s
		}
	}
}

func (c *Compressor) insert(h uint32, off, name uint16, n uint8) {
	i := h & (numSlots - 1)
	for c.slots[i].gen == c.gen {
		i = (i + 1) & (numSlots - 1)
	}
	c.slots[i] = slot{gen: c.gen, hash: h, off: off, name: name, n: n}
	c.used++
}

// hashFold is FNV-1a over the name with ASCII letters lower-cased.
func hashFold(name []byte) uint32 {
	h := uint32(2166136261)
	for _, ch := range name {
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		h ^= uint32(ch)
		h *= 16777619
	}
	return h
}
