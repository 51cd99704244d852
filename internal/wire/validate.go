package wire

import (
	"encoding/binary"
	"strings"
)

// maxPointers bounds the compression pointers followed in one name, as
// miekg/dns does: a name of at most 255 bytes has at most 127 labels, so a
// longer chain of pointers is a loop or an attack, never a real name.
const maxPointers = 126

// CheckName validates the possibly compressed name at off and returns the
// offset just past it in place. Every label is at most 63 bytes, the name
// expanded is at most MaxNameLen bytes, and every compression pointer points
// backwards: past the header and before the labels it continues (so a chain
// of pointers always moves towards the start of the message and cannot loop),
// and the labels reached through pointers end before the name itself.
// Reads stay within b: to bound a name to rdata, pass b sliced at the rdata's
// end.
func CheckName(b []byte, off int) (int, error) {
	end := -1     // offset past the name in place, set at the first pointer
	seg := off    // start of the run of labels being read
	start := off  // where the name is: what a pointer reaches lies before it
	expanded := 0 // length of the name expanded so far
	hops := 0
	for {
		if off >= len(b) {
			return 0, ErrFormat
		}
		l := int(b[off])
		switch {
		case l == 0:
			if expanded+1 > MaxNameLen {
				return 0, ErrFormat
			}
			if end < 0 {
				end = off + 1
			}
			return end, nil
		case l&0xC0 == 0xC0:
			if off+2 > len(b) {
				return 0, ErrFormat
			}
			ptr := int(binary.BigEndian.Uint16(b[off:]) & 0x3FFF)
			if ptr < HeaderLen || ptr >= seg {
				return 0, ErrFormat
			}
			if hops++; hops > maxPointers {
				return 0, ErrFormat
			}
			if end < 0 {
				end = off + 2
			}
			off, seg = ptr, ptr
		case l > 63: // 0x40 and 0x80: extended label types (RFC 6891 §5), none in use
			return 0, ErrFormat
		default:
			expanded += 1 + l
			if expanded+1 > MaxNameLen {
				return 0, ErrFormat
			}
			// Labels reached through a pointer end before the name itself:
			// a pointer's run that reads on into the name, or the record
			// after it, names bytes that are also its type, class or TTL,
			// and rewriting a TTL would change the name.
			if end >= 0 && off+1+l >= start {
				return 0, ErrFormat
			}
			off += 1 + l
		}
	}
}

// CheckMessage validates the structure of a whole DNS message before it is
// cached or relayed: a header, the questions the header counts, and every
// record it counts, each within the message; every name checked by
// CheckName, including the names inside the rdata of the types that carry
// them (NS, CNAME, PTR, DNAME, MX, SOA, SRV, NAPTR and the rest of RFC 1035's
// and RFC 3597 §4's list); fixed-size rdata (A, AAAA, SOA's counters) of its
// size; character strings (TXT, NAPTR) within their rdata; EDNS options
// within the OPT. The rdata of other types is not interpreted (RFC 3597):
// it is relayed as opaque bytes. Trailing bytes after the last record are
// allowed, as most resolvers allow them.
func CheckMessage(b []byte) error {
	if len(b) < HeaderLen {
		return ErrFormat
	}
	qd, an, ns, ar := Counts(b)
	off := HeaderLen
	var err error
	for range int(qd) {
		if off, err = CheckName(b, off); err != nil {
			return err
		}
		if off += 4; off > len(b) {
			return ErrFormat
		}
	}
	for range int(an) + int(ns) + int(ar) {
		if off, err = CheckName(b, off); err != nil {
			return err
		}
		if off+10 > len(b) {
			return ErrFormat
		}
		typ := binary.BigEndian.Uint16(b[off:])
		rdlen := int(binary.BigEndian.Uint16(b[off+8:]))
		start, end := off+10, off+10+rdlen
		if end > len(b) {
			return ErrFormat
		}
		if err := checkRdata(b[:end], start, typ); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// Record types CheckMessage looks inside, beyond those the server uses.
const (
	typeMD    = 3
	typeMF    = 4
	typeMB    = 7
	typeMG    = 8
	typeMR    = 9
	typeMINFO = 14
	typeRP    = 17
	typeAFSDB = 18
	typeRT    = 21
	typePX    = 26
	typeNAPTR = 35
	typeKX    = 36
	typeDNAME = 39
)

// rdataFields describes the rdata of the types CheckMessage interprets:
// 'n' a name, '2' a 16-bit field, 'S' SOA's five 32-bit fields, 's' a
// character string, 'T' character strings to the end, 'a'/'6' an IPv4/IPv6
// address, 'o' EDNS options to the end; "" for the types it does not.
func rdataFields(typ uint16) string {
	switch typ {
	case TypeA:
		return "a"
	case TypeAAAA:
		return "6"
	case TypeNS, typeMD, typeMF, TypeCNAME, typeMB, typeMG, typeMR, TypePTR, typeDNAME:
		return "n"
	case TypeSOA:
		return "nnS"
	case typeMINFO, typeRP:
		return "nn"
	case TypeMX, typeAFSDB, typeRT, typeKX:
		return "2n"
	case typePX:
		return "2nn"
	case TypeSRV:
		return "222n"
	case typeNAPTR:
		return "22sssn"
	case TypeTXT:
		return "T"
	case TypeOPT:
		return "o"
	}
	return ""
}

// CheckedType reports whether CheckMessage interprets the rdata of typ.
func CheckedType(typ uint16) bool { return rdataFields(typ) != "" }

// RdataHasNames reports whether the rdata of typ holds names CheckMessage
// follows (and so may hold compression pointers).
func RdataHasNames(typ uint16) bool { return strings.IndexByte(rdataFields(typ), 'n') >= 0 }

// checkRdata checks the rdata from off to len(b) (b is cut at its end).
func checkRdata(b []byte, off int, typ uint16) error {
	fields := rdataFields(typ)
	if fields == "" {
		return nil
	}
	var err error
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		switch f {
		case 'n':
			off, err = CheckName(b, off)
		case '2':
			off += 2
		case 'S':
			off += 20
		case 'a':
			off += 4
		case '6':
			off += 16
		case 's':
			if off < len(b) {
				off += 1 + int(b[off])
			} else {
				off++
			}
		case 'T':
			for off < len(b) {
				off += 1 + int(b[off])
			}
		case 'o':
			for off+4 <= len(b) {
				off += 4 + int(binary.BigEndian.Uint16(b[off+2:]))
			}
		}
		if err != nil {
			return err
		}
		if off > len(b) {
			return ErrFormat
		}
	}
	if off != len(b) {
		return ErrFormat
	}
	return nil
}
