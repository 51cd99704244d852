package wire

import "encoding/binary"

// OPTLen is the size of an OPT record without options.
const OPTLen = 11

// AppendOPT appends an OPT pseudo-record (RFC 6891 §6.1.2) advertising size,
// with the DO bit and the upper 8 bits of an extended rcode.
func AppendOPT(dst []byte, size uint16, do bool, rcode int) []byte {
	var flags uint16
	if do {
		flags = 1 << 15
	}
	return append(dst,
		0,          // root name
		0, TypeOPT, // type
		byte(size>>8), byte(size), // class: UDP payload size
		byte(rcode>>4), 0, // extended rcode, version 0
		byte(flags>>8), byte(flags),
		0, 0, // rdlength
	)
}

// ReplyFlags is the header flags word every answer to q starts from: QR
// set, and of the query's flags what a reply copies: the opcode (RFC 1035
// §4.1.1), RD (RFC 1035 §4.1.1) and CD (RFC 4035 §3.2.2: a security-aware
// server MUST copy it; RFC 6895 §2: only RD and CD are copied). AA, TC, RA,
// Z and AD say something of the answer, never of the query: the writer of
// the answer sets them (AppendError, the cache's entries, whoami).
func (q *Query) ReplyFlags() uint16 {
	return FlagQR | q.Flags&(opcodeMask<<opcodeShift|FlagRD|FlagCD)
}

// AppendError appends an answer to the query in raw (parsed into q) that
// carries rcode and no records: the question is echoed when it was read,
// the header is ReplyFlags' with rcode, and an OPT is added when the
// client sent one (or when rcode is BADVERS, which only exists in an OPT).
//
// RA is set on every error answer to a query we understood, and on none
// to a message we could not read as one (FORMERR) or whose opcode we do not
// implement (NOTIMP): recursion is offered for QUERY, and the stock
// node-cache and Unbound leave it clear there too. AA, TC, Z and AD are
// never set: an error answer holds no data, authoritative, authentic or
// cut short (RFC 1035 §4.1.1, RFC 4035 §3.2.3), whatever the query's
// header held.
func AppendError(dst, raw []byte, q *Query, rcode int, ednsSize uint16) []byte {
	flags := q.ReplyFlags() | uint16(rcode&rcodeMask)
	if rcode != RcodeFormErr && rcode != RcodeNotImp {
		flags |= FlagRA
	}
	qd := uint16(0)
	if q.HasQ {
		qd = 1
	}
	ar := uint16(0)
	withOPT := q.EDNS || rcode > 0xF
	if withOPT {
		ar = 1
	}
	dst = append(dst, byte(q.ID>>8), byte(q.ID), byte(flags>>8), byte(flags),
		byte(qd>>8), byte(qd), 0, 0, 0, 0, byte(ar>>8), byte(ar))
	if q.HasQ {
		dst = append(dst, raw[HeaderLen:q.QEnd]...)
	}
	if withOPT {
		dst = AppendOPT(dst, ednsSize, q.DO, rcode)
	}
	return dst
}

// AppendUpstreamQuery appends the query sent upstream for q: ID 0 (the
// transport assigns one), RD set, the client's CD bit, the question with
// the name lower-cased (so every client's spelling shares one cache entry
// and one upstream query), and an OPT advertising size with the client's
// DO bit.
func AppendUpstreamQuery(dst []byte, q *Query, size uint16) []byte {
	flags := uint16(FlagRD) | q.Flags&FlagCD
	dst = append(dst, 0, 0, byte(flags>>8), byte(flags), 0, 1, 0, 0, 0, 0, 0, 1)
	dst = AppendLower(dst, q.Name)
	dst = binary.BigEndian.AppendUint16(dst, q.Type)
	dst = binary.BigEndian.AppendUint16(dst, q.Class)
	return AppendOPT(dst, size, q.DO, 0)
}

// SetID writes id into the header of b.
func SetID(b []byte, id uint16) { binary.BigEndian.PutUint16(b[offID:], id) }

// ID reads the header ID of b.
func ID(b []byte) uint16 { return binary.BigEndian.Uint16(b[offID:]) }

// Flags reads the header flags word of b.
func Flags(b []byte) uint16 { return binary.BigEndian.Uint16(b[offFlags:]) }

// SetFlags writes the header flags word of b.
func SetFlags(b []byte, f uint16) { binary.BigEndian.PutUint16(b[offFlags:], f) }

// Counts returns the four section counts of the header of b.
func Counts(b []byte) (qd, an, ns, ar uint16) {
	return binary.BigEndian.Uint16(b[offQDCount:]), binary.BigEndian.Uint16(b[offANCount:]),
		binary.BigEndian.Uint16(b[offNSCount:]), binary.BigEndian.Uint16(b[offARCount:])
}

// SetCounts writes the four section counts into the header of b.
func SetCounts(b []byte, qd, an, ns, ar uint16) {
	binary.BigEndian.PutUint16(b[offQDCount:], qd)
	binary.BigEndian.PutUint16(b[offANCount:], an)
	binary.BigEndian.PutUint16(b[offNSCount:], ns)
	binary.BigEndian.PutUint16(b[offARCount:], ar)
}

// Opcode reads the header opcode of b.
func Opcode(b []byte) uint8 { return uint8(Flags(b)>>opcodeShift) & opcodeMask }

// ReadQuestion reads the first question of b, which must be uncompressed
// (nothing precedes it to point at): its name in wire format, sliced from
// b, its type and class, and the offset past it.
func ReadQuestion(b []byte) (name []byte, qtype, qclass uint16, end int, err error) {
	if len(b) < HeaderLen {
		return nil, 0, 0, 0, ErrFormat
	}
	var q Query
	if end, err = readQuestion(b, HeaderLen, &q); err != nil {
		return nil, 0, 0, 0, err
	}
	return q.Name, q.Type, q.Class, end, nil
}
