package wire

import "encoding/binary"

// Sections of a message, as recorded in RR.Section.
const (
	SectionAnswer     = 1
	SectionAuthority  = 2
	SectionAdditional = 3
)

// RR is the layout of one resource record inside a message.
type RR struct {
	Section uint8
	Type    uint16
	Start   int    // offset of the owner name
	TTLOff  int    // offset of the 32-bit TTL field
	End     int    // offset just past the rdata
	TTL     uint32 // the TTL as received
	// SOAMinimum is the MINIMUM field of an SOA record (RFC 2308 §4), 0
	// for other types.
	SOAMinimum uint32
}

// Answer is the layout of an upstream response: its question and every
// record except the OPT, which is recorded separately because it is
// hop-by-hop and never stored.
type Answer struct {
	ID       uint16
	Flags    uint16
	Name     []byte // question name, uncompressed, pointing into the message
	Type     uint16
	Class    uint16
	QEnd     int
	RRs      []RR
	OPTStart int // -1 when there is no OPT
	OPTEnd   int
	End      int // offset past the last record; trailing bytes are ignored
	// Rcode is the full rcode: the header's 4 bits plus the OPT's upper 8.
	Rcode int
}

// Rcode4 returns the header rcode bits.
func (a *Answer) Rcode4() int { return int(a.Flags & rcodeMask) }

// ParseAnswer reads the layout of the response b into a, reusing a.RRs.
// It requires exactly one question and a well-formed record structure;
// rdata is not interpreted except for the SOA MINIMUM field.
func ParseAnswer(b []byte, a *Answer) error {
	rrs := a.RRs[:0]
	*a = Answer{RRs: rrs, OPTStart: -1}
	if len(b) < HeaderLen {
		return ErrFormat
	}
	a.ID = binary.BigEndian.Uint16(b[offID:])
	a.Flags = binary.BigEndian.Uint16(b[offFlags:])
	qd, an, ns, ar := Counts(b)
	if qd != 1 {
		return ErrFormat
	}
	var q Query
	end, err := readQuestion(b, HeaderLen, &q)
	if err != nil {
		return err
	}
	a.Name, a.Type, a.Class, a.QEnd = q.Name, q.Type, q.Class, end
	a.Rcode = int(a.Flags & rcodeMask)
	off := end
	total := int(an) + int(ns) + int(ar)
	for i := 0; i < total; i++ {
		sec := uint8(SectionAnswer)
		switch {
		case i >= int(an)+int(ns):
			sec = SectionAdditional
		case i >= int(an):
			sec = SectionAuthority
		}
		start := off
		nameEnd, typ, end, err := readRR(b, off)
		if err != nil {
			return ErrFormat
		}
		off = end
		if typ == TypeOPT {
			if sec != SectionAdditional || a.OPTStart >= 0 {
				return ErrFormat
			}
			a.OPTStart, a.OPTEnd = start, off
			a.Rcode |= int(b[nameEnd+4]) << 4
			continue
		}
		rr := RR{
			Section: sec,
			Type:    typ,
			Start:   start,
			TTLOff:  nameEnd + 4,
			End:     off,
			TTL:     binary.BigEndian.Uint32(b[nameEnd+4:]),
		}
		if typ == TypeSOA {
			// MNAME and RNAME (at least one byte each), then five 32-bit
			// fields: MINIMUM is the last four bytes of the rdata.
			if off-nameEnd-10 < 22 { // the rdata
				return ErrFormat
			}
			rr.SOAMinimum = binary.BigEndian.Uint32(b[off-4:])
		}
		rrs = append(rrs, rr)
	}
	a.RRs = rrs
	a.End = off
	return nil
}
