package dnstap

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Type is a dnstap Message's type (dnstap.proto's Message.Type).
type Type int

// The message types CoreDNS sends: its dnstap plugin the client's, its
// forward the upstream's.
const (
	ClientQuery       Type = 5
	ClientResponse    Type = 6
	ForwarderQuery    Type = 7
	ForwarderResponse Type = 8
)

func (t Type) String() string {
	switch t {
	case ClientQuery:
		return "CLIENT_QUERY"
	case ClientResponse:
		return "CLIENT_RESPONSE"
	case ForwarderQuery:
		return "FORWARDER_QUERY"
	case ForwarderResponse:
		return "FORWARDER_RESPONSE"
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// dnstap.proto's field numbers and values.
const (
	// Dnstap
	fIdentity = 1
	fVersion  = 2
	fExtra    = 3
	fMessage  = 14
	fType     = 15
	typeMsg   = 1 // Dnstap.Type MESSAGE

	// Message
	mType         = 1
	mFamily       = 2
	mProtocol     = 3
	mQueryAddr    = 4
	mRespAddr     = 5
	mQueryPort    = 6
	mRespPort     = 7
	mQuerySec     = 8
	mQueryNsec    = 9
	mQueryMessage = 10
	mRespSec      = 12
	mRespNsec     = 13
	mRespMessage  = 14

	familyINET  = 1
	familyINET6 = 2
	protoUDP    = 1
	protoTCP    = 2
)

// Message is what one dnstap message says, as CoreDNS fills it: the
// client's address and port are the query address (for the forwarder's
// messages too: they are "from the perspective of the downstream
// server"), the upstream's the response address; the socket family is the
// query address's (INET6 only for an address that is not IPv4), the
// protocol TCP or UDP. A zero address, time or nil message is left out.
type Message struct {
	Type         Type
	TCP          bool
	Query        netip.AddrPort // the client
	Response     netip.AddrPort // the upstream (forwarder messages)
	QueryTime    time.Time
	ResponseTime time.Time
	// QueryMessage and ResponseMessage are the wire messages, sent only
	// with `full`.
	QueryMessage, ResponseMessage []byte
}

// appendMessage appends the Dnstap frame of m (identity, version and
// extra as given; nil: left out) to b.
func appendMessage(b []byte, m *Message, identity, version, extra []byte, full bool) []byte {
	if identity != nil {
		b = protowire.AppendTag(b, fIdentity, protowire.BytesType)
		b = protowire.AppendBytes(b, identity)
	}
	if version != nil {
		b = protowire.AppendTag(b, fVersion, protowire.BytesType)
		b = protowire.AppendBytes(b, version)
	}
	if extra != nil {
		b = protowire.AppendTag(b, fExtra, protowire.BytesType)
		b = protowire.AppendBytes(b, extra)
	}
	b = protowire.AppendTag(b, fMessage, protowire.BytesType)
	// The embedded message's length comes first: write it after, then
	// move it in front (one copy of the message's own bytes).
	at := len(b)
	b = appendInner(b, m, full)
	n := len(b) - at
	var lenBuf [binary.MaxVarintLen64]byte
	l := protowire.AppendVarint(lenBuf[:0], uint64(n))
	b = append(b, l...)
	copy(b[at+len(l):], b[at:at+n])
	copy(b[at:], l)
	b = protowire.AppendTag(b, fType, protowire.VarintType)
	b = protowire.AppendVarint(b, typeMsg)
	return b
}

func appendInner(b []byte, m *Message, full bool) []byte {
	b = protowire.AppendTag(b, mType, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(m.Type))
	family := uint64(familyINET)
	if m.Query.IsValid() && !m.Query.Addr().Unmap().Is4() {
		family = familyINET6
	}
	b = protowire.AppendTag(b, mFamily, protowire.VarintType)
	b = protowire.AppendVarint(b, family)
	proto := uint64(protoUDP)
	if m.TCP {
		proto = protoTCP
	}
	b = protowire.AppendTag(b, mProtocol, protowire.VarintType)
	b = protowire.AppendVarint(b, proto)
	if m.Query.IsValid() {
		b = protowire.AppendTag(b, mQueryAddr, protowire.BytesType)
		b = appendAddr(b, m.Query.Addr())
	}
	if m.Response.IsValid() {
		b = protowire.AppendTag(b, mRespAddr, protowire.BytesType)
		b = appendAddr(b, m.Response.Addr())
	}
	if m.Query.IsValid() {
		b = protowire.AppendTag(b, mQueryPort, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.Query.Port()))
	}
	if m.Response.IsValid() {
		b = protowire.AppendTag(b, mRespPort, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.Response.Port()))
	}
	if !m.QueryTime.IsZero() {
		b = protowire.AppendTag(b, mQuerySec, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.QueryTime.Unix()))
		b = protowire.AppendTag(b, mQueryNsec, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, uint32(m.QueryTime.Nanosecond()))
	}
	if full && m.QueryMessage != nil {
		b = protowire.AppendTag(b, mQueryMessage, protowire.BytesType)
		b = protowire.AppendBytes(b, m.QueryMessage)
	}
	if !m.ResponseTime.IsZero() {
		b = protowire.AppendTag(b, mRespSec, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.ResponseTime.Unix()))
		b = protowire.AppendTag(b, mRespNsec, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, uint32(m.ResponseTime.Nanosecond()))
	}
	if full && m.ResponseMessage != nil {
		b = protowire.AppendTag(b, mRespMessage, protowire.BytesType)
		b = protowire.AppendBytes(b, m.ResponseMessage)
	}
	return b
}

// appendAddr appends a as CoreDNS's msg package does (net.IP of a
// net.UDPAddr or net.TCPAddr): 4 bytes for IPv4, 16 for IPv6.
func appendAddr(b []byte, a netip.Addr) []byte {
	a = a.Unmap()
	if a.Is4() {
		v := a.As4()
		return protowire.AppendBytes(b, v[:])
	}
	v := a.As16()
	return protowire.AppendBytes(b, v[:])
}

// Decoded is one Dnstap frame decoded (Decode): for tests and tools.
type Decoded struct {
	Identity, Version, Extra []byte
	Message
	HasQueryMessage, HasResponseMessage bool
}

// Decode decodes a Dnstap frame's payload; unknown fields are skipped.
func Decode(b []byte) (Decoded, error) {
	var d Decoded
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch num {
		case fIdentity:
			d.Identity = v
		case fVersion:
			d.Version = v
		case fExtra:
			d.Extra = v
		case fMessage:
			return decodeInner(v, &d)
		}
		return nil
	})
	return d, err
}

func decodeInner(b []byte, d *Decoded) error {
	var qa, ra netip.Addr
	var qp, rp uint16
	var qs, rs uint64
	var qn, rn uint32
	var hasQT, hasRT bool
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch num {
		case mType:
			d.Type = Type(x)
		case mProtocol:
			d.TCP = x == protoTCP
		case mQueryAddr:
			qa, _ = netip.AddrFromSlice(v)
		case mRespAddr:
			ra, _ = netip.AddrFromSlice(v)
		case mQueryPort:
			qp = uint16(x)
		case mRespPort:
			rp = uint16(x)
		case mQuerySec:
			qs, hasQT = x, true
		case mQueryNsec:
			qn = uint32(x)
		case mRespSec:
			rs, hasRT = x, true
		case mRespNsec:
			rn = uint32(x)
		case mQueryMessage:
			d.QueryMessage, d.HasQueryMessage = v, true
		case mRespMessage:
			d.ResponseMessage, d.HasResponseMessage = v, true
		}
		return nil
	})
	if qa.IsValid() {
		d.Query = netip.AddrPortFrom(qa, qp)
	}
	if ra.IsValid() {
		d.Response = netip.AddrPortFrom(ra, rp)
	}
	if hasQT {
		d.QueryTime = time.Unix(int64(qs), int64(qn))
	}
	if hasRT {
		d.ResponseTime = time.Unix(int64(rs), int64(rn))
	}
	return err
}

// walk calls f for each field of the protobuf message b: v for a
// length-delimited field, x for a number.
func walk(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var y uint32
			y, n = protowire.ConsumeFixed32(b)
			x = uint64(y)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
