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
}

// shuffleInPlace shuffles a message whose every section with more than
// one record is CNAMEs then A or AAAA records with pointer owners (the
// records moved are then pointed to by nothing). ok: done in place; done
// without ok: nothing to do (AXFR/IXFR); neither: the caller repacks.
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
	var recs [64]rec
	for s := 0; s < 3; s++ {
		n := int(binary.BigEndian.Uint16(b[6+2*s:]))
		if n > len(recs) {
			return false, false
		}
		rs := recs[:0]
		for range n {
			r := rec{start: off}
			r.ptrOwner = off+2 <= len(b) && b[off]&0xC0 == 0xC0
			if off, err = wire.SkipName(b, off); err != nil || off+10 > len(b) {
				return false, false
			}
			r.typ = binary.BigEndian.Uint16(b[off:])
			off += 10 + int(binary.BigEndian.Uint16(b[off+8:]))
			if off > len(b) {
				return false, false
			}
			r.end = off
			rs = append(rs, r)
		}
		if !shuffleSection(b, rs) {
			return false, false
		}
	}
	return true, true
}

// shuffleSection shuffles the records of one section in place when they
// are already in the order CoreDNS's roundRobin puts them (CNAMEs, other
// records, addresses), the addresses all of one type with pointer owners,
// and no MX; false: the caller must repack. An OPT record at the end is
// left there (CoreDNS adds it after loadbalance).
func shuffleSection(b []byte, rs []rec) bool {
	if n := len(rs); n > 0 && rs[n-1].typ == dns.TypeOPT {
		rs = rs[:n-1]
	}
	if len(rs) <= 1 {
		return true
	}
	first, rank := -1, 0 // the first address record; the category reached
	for i, r := range rs {
		k := 1 // other records
		switch r.typ {
		case dns.TypeCNAME:
			k = 0
		case dns.TypeA, dns.TypeAAAA:
			k = 2
			if first < 0 {
				first = i
			}
			// A pointer owner, type, class, TTL, length and the address
			// (4 or 16 bytes): anything else (a stored answer that is
			// not what Build makes) is left to the repack, which checks.
			if !r.ptrOwner || r.typ != rs[first].typ || r.end-r.start != addrRecordLen(r.typ) {
				return false
			}
		case dns.TypeMX, dns.TypeOPT:
			return false
		}
		if k < rank {
			return false
		}
		rank = k
	}
	if first < 0 {
		return true
	}
	addrs := rs[first:]
	size := addrs[0].end - addrs[0].start
	base := addrs[0].start
	var tmp [2 + 10 + 16]byte
	// CoreDNS's roundRobinShuffle: two records swap half the time; more
	// are walked with a random swap at each place.
	swap := func(i, j int) {
		if i == j {
			return
		}
		a, c := b[base+i*size:base+(i+1)*size], b[base+j*size:base+(j+1)*size]
		copy(tmp[:size], a)
		copy(a, c)
		copy(c, tmp[:size])
	}
	switch l := len(addrs); l {
	case 1:
	case 2:
		if rand.IntN(2) == 0 {
			swap(0, 1)
		}
	default:
		for j := range l {
			swap(j, j+rand.IntN(l-j))
		}
	}
	return true
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
