// Package whoami is the Corefile's `whoami` directive: each client is
// answered its own address, port and transport, as CoreDNS's whoami
// plugin answers (plugin/whoami): NOERROR, authoritative, no answer
// records, and in the additional section an A (IPv4 client) or AAAA
// (IPv6) record of the client's address owned by the name as asked, and
// an SRV record owned by "_udp." or "_tcp." before that name whose port
// is the client's; TTL 0, the question's class, for every query type.
//
// The answer is the client's alone: the server writes it where it sends
// local answers, before the cache, so it is never cached, never coalesced
// with another client's question and never forwarded. Which block answers
// with whoami is internal/blocks' to say. It opens no sockets and
// allocates nothing beyond the bytes it appends.
package whoami

import (
	"encoding/binary"
	"net/netip"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Append appends to dst the whoami answer to the query raw (parsed into q,
// with a question) from client over TCP (tcp) or UDP. An OPT advertising
// ednsSize, with the client's DO bit, ends it when the client sent one.
// The owner names point at the question (the answer is at most 60 bytes
// longer than it), so it fits any client's size.
func Append(dst, raw []byte, q *wire.Query, client netip.AddrPort, tcp bool, ednsSize uint16) []byte {
	flags := q.ReplyFlags() | wire.FlagAA // the opcode, RD and CD; no RA, as CoreDNS's whoami
	ar := uint16(2)
	if q.EDNS {
		ar++
	}
	dst = append(dst, byte(q.ID>>8), byte(q.ID), byte(flags>>8), byte(flags), 0, 1, 0, 0, 0, 0, byte(ar>>8), byte(ar))
	dst = append(dst, raw[wire.HeaderLen:q.QEnd]...)
	const question = 0xC000 | wire.HeaderLen // a pointer to the question's name
	a := client.Addr()
	if a.Is4In6() {
		a = a.Unmap()
	}
	typ, addr := uint16(wire.TypeAAAA), a.AsSlice()
	if a.Is4() {
		typ = wire.TypeA
	}
	dst = binary.BigEndian.AppendUint16(dst, question)
	dst = appendRRHeader(dst, typ, q.Class, len(addr))
	dst = append(dst, addr...)
	proto := "_udp"
	if tcp {
		proto = "_tcp"
	}
	dst = append(dst, byte(len(proto)))
	dst = append(dst, proto...)
	if len(q.Name) == 1 { // the root: "_udp."
		dst = append(dst, 0)
	} else {
		dst = binary.BigEndian.AppendUint16(dst, question)
	}
	dst = appendRRHeader(dst, wire.TypeSRV, q.Class, 7)
	dst = append(dst, 0, 0, 0, 0) // priority, weight
	dst = binary.BigEndian.AppendUint16(dst, client.Port())
	dst = append(dst, 0) // target "."
	if q.EDNS {
		dst = wire.AppendOPT(dst, ednsSize, q.DO, 0)
	}
	return dst
}

// appendRRHeader appends a record's type, class, TTL 0 and rdlength.
func appendRRHeader(dst []byte, typ, class uint16, rdlen int) []byte {
	dst = binary.BigEndian.AppendUint16(dst, typ)
	dst = binary.BigEndian.AppendUint16(dst, class)
	dst = append(dst, 0, 0, 0, 0) // TTL 0
	return binary.BigEndian.AppendUint16(dst, uint16(rdlen))
}
