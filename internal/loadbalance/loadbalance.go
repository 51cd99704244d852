// Package loadbalance is the Corefile's `loadbalance` directive. Its
// round_robin policy (the default): each NOERROR answer of a block with it
// has its A, AAAA and MX records shuffled, as CoreDNS's loadbalance plugin
// shuffles them. CoreDNS's plugin.cfg puts loadbalance before cache, so
// every answer is shuffled, cache hits too: the server applies Shuffle to
// every answer it sends whose block has loadbalance (a property of the
// block in internal/blocks' table, which decides which block answers).
//
// The common answers (a section of A or AAAA records, maybe after CNAMEs,
// whose owner names are compression pointers) are shuffled in place, with
// no allocation; anything else is unpacked, shuffled as CoreDNS's
// roundRobin does (CNAMEs, other records, addresses, MX) and packed again.
//
// Its other policies (Policy): weighted, a weight file naming addresses
// whose chance to come first it raises (read again on a change), and
// prefer, subnets whose addresses come first; their answers are always
// unpacked and packed again, and only blocks with them pay for it. It
// opens no sockets; the only file it reads is a weight file.
package loadbalance

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Shuffle shuffles the A, AAAA and MX records of each section of a NOERROR
// answer as CoreDNS's round_robin does.
func Shuffle(resp []byte) []byte {
	if len(resp) < wire.HeaderLen || resp[3]&0xF != 0 || resp[2]&0x78 != 0 { // NOERROR, opcode QUERY
		return resp
	}
	if ok, done := shuffleInPlace(resp); ok {
		return resp
	} else if done {
		return resp // not an answer worth shuffling (a zone transfer, nothing to move)
	}
	m, opt, ok := unpackAnswer(resp)
	if !ok {
		return resp
	}
	m.Answer, m.Ns, m.Extra = roundRobin(m.Answer), roundRobin(m.Ns), roundRobin(m.Extra)
	return repack(m, opt, resp)
}

// unpackAnswer unpacks a NOERROR answer to reorder its records: not a
// zone transfer; its OPT record taken out of the additional section
// (CoreDNS adds the OPT after loadbalance: it stays last). ok is false
// when there is nothing to reorder.
func unpackAnswer(resp []byte) (m *dns.Msg, opt []dns.RR, ok bool) {
	m = new(dns.Msg)
	if err := m.Unpack(resp); err != nil || len(m.Question) == 0 {
		return nil, nil, false
	}
	if q := m.Question[0].Qtype; q == dns.TypeAXFR || q == dns.TypeIXFR {
		return nil, nil, false
	}
	m.Extra = slices.DeleteFunc(m.Extra, func(rr dns.RR) bool {
		if rr.Header().Rrtype == dns.TypeOPT {
			opt = append(opt, rr)
			return true
		}
		return false
	})
	return m, opt, true
}

// repack packs m, reordered, with its OPT last again (resp, the answer as
// it was, when it does not pack).
func repack(m *dns.Msg, opt []dns.RR, resp []byte) []byte {
	m.Extra = append(m.Extra, opt...)
	m.Compress = true
	out, err := m.Pack()
	if err != nil {
		return resp
	}
	return out
}

// byKind splits records as CoreDNS's balancing orders them: CNAMEs,
// addresses (A, AAAA), MX and the rest.
func byKind(in []dns.RR) (cname, address, mx, rest []dns.RR) {
	for _, r := range in {
		switch r.Header().Rrtype {
		case dns.TypeCNAME:
			cname = append(cname, r)
		case dns.TypeA, dns.TypeAAAA:
			address = append(address, r)
		case dns.TypeMX:
			mx = append(mx, r)
		default:
			rest = append(rest, r)
		}
	}
	return
}

// rec is one record's place in a message.
type rec struct {
	start, end int
	typ        uint16
	ptrOwner   bool
	ptr        int // where the owner's compression pointer points, -1 when it has none
}

// span is the run of address records one section shuffles in place: n
// records of size bytes from base.
type span struct{ base, size, n int }

func (s span) holds(off int) bool { return s.n > 1 && off >= s.base && off < s.base+s.n*s.size }

// shuffleInPlace shuffles a message whose every section with more than
// one record is CNAMEs then A or AAAA records with pointer owners, when
// nothing points into the records it moves: no owner name, and no name in
// the rdata of a record after them (such a record sends the message to
// the repack). ok: done in place; done without ok: nothing to do
// (AXFR/IXFR); neither: the caller repacks.
func shuffleInPlace(b []byte) (ok, done bool) {
	off := wire.HeaderLen
	qd := int(binary.BigEndian.Uint16(b[4:]))
	if qd != 1 {
		return false, false
	}
	var err error
	if off, err = wire.SkipName(b, off); err != nil || off+4 > len(b) {
		return false, false
	}
	if qt := binary.BigEndian.Uint16(b[off:]); qt == dns.TypeAXFR || qt == dns.TypeIXFR {
		return false, true
	}
	off += 4
	// Every section is planned before anything moves.
	var spans [3]span
	moved := false // a span of an earlier section moves
	for s := range spans {
		n := int(binary.BigEndian.Uint16(b[6+2*s:]))
		var p planner
		for i := range n {
			r := rec{start: off}
			r.ptrOwner = off+2 <= len(b) && b[off]&0xC0 == 0xC0
			if off, r.ptr = skipName(b, off); off < 0 || off+10 > len(b) {
				return false, false
			}
			r.typ = binary.BigEndian.Uint16(b[off:])
			off += 10 + int(binary.BigEndian.Uint16(b[off+8:]))
			if off > len(b) {
				return false, false
			}
			r.end = off
			if moved && (wire.RdataHasNames(r.typ) || pointsInto(r.ptr, spans[:s])) {
				return false, false
			}
			p.add(r, i == n-1)
		}
		var ok bool
		if spans[s], ok = p.plan(); !ok {
			return false, false
		}
		moved = moved || spans[s].n > 1
	}
	for _, sp := range spans {
		shuffleSpan(b, sp)
	}
	return true, true
}

// skipName returns the offset just past the name at off, as
// wire.SkipName, and where its pointer points (-1: none); end is -1 when
// the name is malformed.
func skipName(b []byte, off int) (end, ptr int) {
	start := off
	for off < len(b) && off-start <= wire.MaxNameLen {
		l := int(b[off])
		switch {
		case l == 0:
			return off + 1, -1
		case l&0xC0 == 0xC0:
			if off+2 > len(b) {
				return -1, -1
			}
			if ptr = int(binary.BigEndian.Uint16(b[off:]) & 0x3FFF); ptr < wire.HeaderLen || ptr >= start {
				return -1, -1
			}
			return off + 2, ptr
		case l > 63:
			return -1, -1
		}
		off += 1 + l
	}
	return -1, -1
}

// pointsInto reports whether ptr is inside one of spans.
func pointsInto(ptr int, spans []span) bool {
	for _, s := range spans {
		if s.holds(ptr) {
			return true
		}
	}
	return false
}

// planner finds, record by record, the address records one section
// shuffles in place: when its records are already in the order CoreDNS's
// roundRobin puts them (CNAMEs, other records, addresses), the addresses
// all of one type, with pointer owners, no record pointing into them, and
// no MX. An OPT record at the end is left there (CoreDNS adds it after
// loadbalance). A section of one record is left as it is.
type planner struct {
	sp    span
	typ   uint16 // the addresses'
	rank  int    // the category reached: CNAMEs 0, others 1, addresses 2
	count int    // records, less a last OPT
	bad   bool   // the section must be repacked, if it has two records or more
}

func (p *planner) add(r rec, last bool) {
	if p.sp.n > 0 && r.ptr >= p.sp.base {
		p.bad = true // points into the addresses
	}
	if r.typ == dns.TypeOPT && last {
		return
	}
	p.count++
	k := 1 // other records
	switch r.typ {
	case dns.TypeCNAME:
		k = 0
	case dns.TypeA, dns.TypeAAAA:
		k = 2
		if p.sp.n == 0 {
			p.sp, p.typ = span{base: r.start, size: r.end - r.start}, r.typ
		}
		// A pointer owner, type, class, TTL, length and the address
		// (4 or 16 bytes): anything else (a stored answer that is not
		// what Build makes) is left to the repack, which checks.
		if !r.ptrOwner || r.typ != p.typ || r.end-r.start != addrRecordLen(r.typ) {
			p.bad = true
		}
		p.sp.n++
	case dns.TypeMX, dns.TypeOPT:
		p.bad = true
	}
	if k < p.rank {
		p.bad = true
	}
	p.rank = max(p.rank, k)
}

// plan is the section's span (none to move when it has no two records);
// false: the caller must repack.
func (p *planner) plan() (span, bool) {
	switch {
	case p.count <= 1:
		return span{}, true
	case p.bad:
		return span{}, false
	}
	return p.sp, true
}

// shuffleSpan shuffles the address records of sp in place, as CoreDNS's
// roundRobinShuffle does: two records swap half the time; more are walked
// with a random swap at each place.
func shuffleSpan(b []byte, sp span) {
	var tmp [2 + 10 + 16]byte
	swap := func(i, j int) {
		if i == j {
			return
		}
		a, c := b[sp.base+i*sp.size:sp.base+(i+1)*sp.size], b[sp.base+j*sp.size:sp.base+(j+1)*sp.size]
		copy(tmp[:sp.size], a)
		copy(a, c)
		copy(c, tmp[:sp.size])
	}
	switch sp.n {
	case 0, 1:
	case 2:
		if rand.IntN(2) == 0 {
			swap(0, 1)
		}
	default:
		for j := range sp.n {
			swap(j, j+rand.IntN(sp.n-j))
		}
	}
}

// addrRecordLen is the length of an A or AAAA record whose owner is a
// compression pointer.
func addrRecordLen(typ uint16) int {
	if typ == dns.TypeAAAA {
		return 2 + 10 + 16
	}
	return 2 + 10 + 4
}

// roundRobin is CoreDNS's: CNAMEs, the other records, the addresses
// shuffled, the MX records shuffled.
func roundRobin(in []dns.RR) []dns.RR {
	if len(in) <= 1 {
		return in
	}
	cname, address, mx, rest := byKind(in)
	shuffle(address)
	shuffle(mx)
	out := append(cname, rest...)
	out = append(out, address...)
	return append(out, mx...)
}

func shuffle(rs []dns.RR) {
	switch l := len(rs); l {
	case 0, 1:
	case 2:
		if rand.IntN(2) == 0 {
			rs[0], rs[1] = rs[1], rs[0]
		}
	default:
		for j := range l {
			p := j + rand.IntN(l-j)
			rs[j], rs[p] = rs[p], rs[j]
		}
	}
}
