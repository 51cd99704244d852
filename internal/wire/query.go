// Package wire reads and writes the few parts of DNS messages that the
// serving path needs, directly on the wire bytes: the header, the question,
// the client's OPT record, and the resource record layout of an answer.
//
// It exists so that the cache-hit path never unpacks a whole message. It
// owns no state and must not allocate on the query path; full message
// handling (building upstream answers in tests, parsing rdata) belongs to
// github.com/miekg/dns.
package wire

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strconv"
)

// Header sizes and field offsets (RFC 1035 §4.1.1).
const (
	HeaderLen = 12

	offID      = 0
	offFlags   = 2
	offQDCount = 4
	offANCount = 6
	offNSCount = 8
	offARCount = 10
)

// Header flag bits.
const (
	FlagQR = 1 << 15
	FlagAA = 1 << 10
	FlagTC = 1 << 9
	FlagRD = 1 << 8
	FlagRA = 1 << 7
	FlagAD = 1 << 5
	FlagCD = 1 << 4

	opcodeShift = 11
	opcodeMask  = 0xF
	rcodeMask   = 0xF
)

// Response codes used by the server.
const (
	RcodeSuccess  = 0
	RcodeFormErr  = 1
	RcodeServFail = 2
	RcodeNXDomain = 3
	RcodeNotImp   = 4
	RcodeRefused  = 5
	// RcodeBadVers is an extended rcode (RFC 6891 §6.1.3): upper 8 bits
	// travel in the OPT TTL, lower 4 in the header.
	RcodeBadVers = 16
)

// RcodeError is an error whose client gets this rcode instead of
// SERVFAIL (a forward's max_concurrent answers REFUSED, as CoreDNS's);
// like every fetch error it is never cached.
type RcodeError int

func (e RcodeError) Error() string {
	if e == RcodeRefused {
		return "answer REFUSED"
	}
	return "answer rcode " + strconv.Itoa(int(e))
}

// Record types and classes the package looks at.
const (
	TypeA     = 1
	TypeNS    = 2
	TypeCNAME = 5
	TypeSOA   = 6
	TypePTR   = 12
	TypeMX    = 15
	TypeTXT   = 16
	TypeAAAA  = 28
	TypeSRV   = 33
	TypeOPT   = 41
	TypeANY   = 255
	ClassINET = 1
)

// MinUDPSize is the size every DNS client accepts over UDP without EDNS
// (RFC 1035 §4.2.1), and the floor for an EDNS client's advertised size
// (RFC 6891 §6.2.5).
const MinUDPSize = 512

// MaxNameLen is the longest wire-format name (RFC 1035 §3.1).
const MaxNameLen = 255

// Errors from ParseQuery. The server answers ErrFormat with FORMERR,
// ErrNotImp with NOTIMP and ErrBadVers with BADVERS, and drops ErrDrop.
var (
	// ErrDrop: the message cannot be answered (header unreadable, or it is
	// itself a response, which must never be answered: that is how loops form).
	ErrDrop    = errors.New("dns: unanswerable message")
	ErrFormat  = errors.New("dns: malformed query")
	ErrNotImp  = errors.New("dns: opcode not implemented")
	ErrBadVers = errors.New("dns: unsupported EDNS version")
)

// Query is a client query parsed in place: the byte slices point into the
// buffer the query was read into, so a Query is valid only as long as that
// buffer is.
type Query struct {
	ID    uint16
	Flags uint16 // the header flags word as received
	// Name is the question name in wire format, exactly as the client
	// sent it (its case is echoed back in answers).
	Name   []byte
	Type   uint16
	Class  uint16
	QEnd   int // offset just past the question section
	EDNS   bool
	Size   uint16 // the client's advertised UDP payload size, MinUDPSize without EDNS
	DO     bool   // DNSSEC OK bit from the OPT record
	HasQ   bool   // the question section was read (so errors can echo it)
	Opcode uint8
	// From is the client's address, set by the transport after parsing
	// only when something behind the cache needs it (a template's
	// .Remote); ParseQuery clears it. A miss's copy carries it into the
	// one upstream fetch its question gets (the first asker's, as behind
	// CoreDNS's cache).
	From netip.Addr
	// FromPort is the client's port beside From, set with it for a miss
	// (the Corefile's dnstap names the first asker's address and port in
	// the upstream exchange's messages); ParseQuery clears it.
	FromPort uint16
	// Client is the client's key for fairness (package fair: its
	// address, or one of the node's keys for loopback and the node's own
	// addresses), set by the transport after parsing; ParseQuery clears
	// it. A hit counts it among the entry's clients (its popularity), a
	// miss's flight and the entry it stores are its.
	Client netip.Addr
	// View is not read from the packet (ParseQuery keeps it): the server
	// sets it from the address the query arrived on (the Corefile's blocks
	// seen there). It is part of the cache key, so two views keep separate
	// answers.
	View uint8
}

// Rebase points q's slices into b, a copy of the buffer q was parsed
// from (a query kept past its read buffer), instead of parsing b again.
func (q *Query) Rebase(b []byte) {
	if len(q.Name) > 0 && HeaderLen+len(q.Name) <= len(b) {
		q.Name = b[HeaderLen : HeaderLen+len(q.Name) : HeaderLen+len(q.Name)]
	}
}

// CD reports whether the client disabled DNSSEC checking.
func (q *Query) CD() bool { return q.Flags&FlagCD != 0 }

// ParseQuery reads b as a DNS query into q. It checks the header, reads
// exactly one question (no compression pointers: there is nothing before
// the question to point at), and finds the OPT record among the additional
// records. Answer and authority records in a query are skipped, as some
// clients send them (e.g. UPDATE prerequisites are not queries, but NOTIFY
// and odd stubs exist); anything that does not parse is ErrFormat.
func ParseQuery(b []byte, q *Query) error {
	*q = Query{Size: MinUDPSize, View: q.View}
	if len(b) < HeaderLen {
		return ErrDrop
	}
	q.ID = binary.BigEndian.Uint16(b[offID:])
	q.Flags = binary.BigEndian.Uint16(b[offFlags:])
	if q.Flags&FlagQR != 0 {
		return ErrDrop
	}
	q.Opcode = uint8(q.Flags>>opcodeShift) & opcodeMask
	qd := binary.BigEndian.Uint16(b[offQDCount:])
	an := binary.BigEndian.Uint16(b[offANCount:])
	ns := binary.BigEndian.Uint16(b[offNSCount:])
	ar := binary.BigEndian.Uint16(b[offARCount:])
	if q.Opcode != 0 {
		// Read the question if it is there, so NOTIMP can echo it.
		if qd == 1 {
			if end, err := readQuestion(b, HeaderLen, q); err == nil {
				q.QEnd = end
				q.HasQ = true
			}
		}
		return ErrNotImp
	}
	if qd != 1 {
		return ErrFormat
	}
	end, err := readQuestion(b, HeaderLen, q)
	if err != nil {
		return err
	}
	q.QEnd = end
	q.HasQ = true
	off := end
	for i := 0; i < int(an)+int(ns); i++ {
		if off, err = skipRR(b, off); err != nil {
			return ErrFormat
		}
	}
	sawOPT := false
	for i := 0; i < int(ar); i++ {
		start := off
		nameEnd, typ, end, err := readRR(b, off)
		if err != nil {
			return ErrFormat
		}
		off = end
		if typ != TypeOPT {
			continue
		}
		// RFC 6891 §6.1.1: one OPT, owned by the root name.
		if sawOPT || nameEnd != start+1 || b[start] != 0 {
			return ErrFormat
		}
		sawOPT = true
		q.EDNS = true
		size := binary.BigEndian.Uint16(b[nameEnd+2:])
		if size < MinUDPSize {
			size = MinUDPSize
		}
		q.Size = size
		ttl := binary.BigEndian.Uint32(b[nameEnd+4:])
		q.DO = ttl&(1<<15) != 0
		if version := uint8(ttl >> 16); version != 0 {
			return ErrBadVers
		}
	}
	return nil
}

func readQuestion(b []byte, off int, q *Query) (int, error) {
	end, err := readName(b, off)
	if err != nil {
		return 0, err
	}
	if end+4 > len(b) {
		return 0, ErrFormat
	}
	q.Name = b[off:end]
	q.Type = binary.BigEndian.Uint16(b[end:])
	q.Class = binary.BigEndian.Uint16(b[end+2:])
	return end + 4, nil
}

// readName checks an uncompressed wire name at off and returns the offset
// past it.
func readName(b []byte, off int) (int, error) {
	start := off
	for {
		if off >= len(b) {
			return 0, ErrFormat
		}
		l := int(b[off])
		if l == 0 {
			off++
			break
		}
		if l > 63 { // a pointer (0xC0) or a reserved label type
			return 0, ErrFormat
		}
		off += 1 + l
		if off-start >= MaxNameLen {
			return 0, ErrFormat
		}
	}
	if off-start > MaxNameLen {
		return 0, ErrFormat
	}
	return off, nil
}

// SkipName returns the offset just past the (possibly compressed) name at
// off. It does not follow pointers: a pointer ends the name in place, and
// must point backwards, past the header and before the name (CheckName
// follows the chain).
func SkipName(b []byte, off int) (int, error) {
	start := off
	for {
		if off >= len(b) {
			return 0, ErrFormat
		}
		l := int(b[off])
		switch {
		case l == 0:
			return off + 1, nil
		case l&0xC0 == 0xC0:
			if off+2 > len(b) {
				return 0, ErrFormat
			}
			if ptr := int(binary.BigEndian.Uint16(b[off:]) & 0x3FFF); ptr < HeaderLen || ptr >= start {
				return 0, ErrFormat
			}
			return off + 2, nil
		case l > 63:
			return 0, ErrFormat
		}
		off += 1 + l
		if off-start > MaxNameLen {
			return 0, ErrFormat
		}
	}
}

func skipRR(b []byte, off int) (int, error) {
	_, _, end, err := readRR(b, off)
	return end, err
}

// readRR reads the record at off: where its name ends (its type, class,
// TTL and length follow), its type, and where it ends, within b.
func readRR(b []byte, off int) (nameEnd int, typ uint16, end int, err error) {
	nameEnd, err = SkipName(b, off)
	if err != nil || nameEnd+10 > len(b) {
		return 0, 0, 0, ErrFormat
	}
	end = nameEnd + 10 + int(binary.BigEndian.Uint16(b[nameEnd+8:]))
	if end > len(b) {
		return 0, 0, 0, ErrFormat
	}
	return nameEnd, binary.BigEndian.Uint16(b[nameEnd:]), end, nil
}

// EqualNameFold reports whether two uncompressed wire names are equal
// ignoring ASCII case (RFC 4343). Label length bytes are below 64, so they
// are never changed by the folding.
func EqualNameFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// AppendLower appends the wire name with ASCII letters lower-cased.
func AppendLower(dst, name []byte) []byte {
	for _, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// NameString renders an uncompressed wire name in lower-case presentation
// form with a trailing dot ("www.example.com."), escaping bytes that are not
// letters, digits, '-' or '_' as \DDD. It allocates; it is for the miss path.
func NameString(name []byte) string {
	if len(name) <= 1 {
		return "."
	}
	// Built on the stack (255 bytes of name, each at most 4 characters as
	// \DDD: 1020), so the string is the one allocation.
	var b [1024]byte
	out := b[:0]
	off := 0
	for off < len(name) {
		l := int(name[off])
		if l == 0 {
			break
		}
		off++
		if off+l > len(name) {
			break
		}
		for _, c := range name[off : off+l] {
			switch {
			case 'A' <= c && c <= 'Z':
				out = append(out, c+'a'-'A')
			case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
				out = append(out, c)
			default:
				out = append(out, '\\', '0'+c/100, '0'+c/10%10, '0'+c%10)
			}
		}
		out = append(out, '.')
		off += l
	}
	return string(out)
}

// Rcode returns the 4-bit header rcode of a message.
func Rcode(b []byte) int {
	if len(b) < HeaderLen {
		return -1
	}
	return int(b[offFlags+1] & rcodeMask)
}

// InZone reports whether the uncompressed wire name lies in zone (also an
// uncompressed wire name), comparing on label boundaries and ignoring case.
// The root zone (a single zero byte) contains every name.
func InZone(name, zone []byte) bool {
	if len(zone) > len(name) {
		return false
	}
	off := 0
	for {
		if len(name)-off == len(zone) {
			return EqualNameFold(name[off:], zone)
		}
		if len(name)-off < len(zone) || off >= len(name) || name[off] == 0 {
			return false
		}
		off += 1 + int(name[off])
	}
}

// AppendNameWire appends the wire form of a presentation name such as
// "cluster.local" or "cluster.local." (no escapes: zone names from flags
// and config files). It reports false for an empty label or a label over
// 63 bytes.
func AppendNameWire(dst []byte, name string) ([]byte, bool) {
	if name == "." || name == "" {
		return append(dst, 0), true
	}
	if name[len(name)-1] == '.' {
		name = name[:len(name)-1]
	}
	start := len(dst)
	for len(name) > 0 {
		i := 0
		for i < len(name) && name[i] != '.' {
			i++
		}
		if i == 0 || i > 63 {
			return dst[:start], false
		}
		dst = append(dst, byte(i))
		dst = append(dst, name[:i]...)
		if i == len(name) {
			name = ""
		} else {
			name = name[i+1:]
			if name == "" {
				return dst[:start], false
			}
		}
	}
	dst = append(dst, 0)
	if len(dst)-start > MaxNameLen {
		return dst[:start], false
	}
	return dst, true
}
