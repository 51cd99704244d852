package dnslog

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Entry is one answered query, as the server saw it.
type Entry struct {
	Remote netip.AddrPort
	Local  netip.Addr
	TCP    bool
	// Q is the parsed query, Query the query as received.
	Q     *wire.Query
	Query []byte
	// Resp is the answer as sent (without TCP's length prefix).
	Resp     []byte
	Duration time.Duration
}

// The placeholders of CoreDNS's replacer (plugin/pkg/replacer).
const (
	phType = iota
	phName
	phClass
	phProto
	phSize
	phRemote
	phPort
	phLocal
	phID
	phOpcode
	phDO
	phBufsize
	phRcode
	phRsize
	phDuration
	phRflags
	phLiteral
	phMetadata  // {/label}: metadata no directive of ours sets: "-"
	phMetaType  // {/log/type} with metadata: the answer's response type
	phMetaClass // {/log/class} with metadata: the answer's class
)

var labels = map[string]int{
	"{type}": phType, "{name}": phName, "{class}": phClass, "{proto}": phProto, "{size}": phSize,
	"{remote}": phRemote, "{port}": phPort, "{local}": phLocal,
	"{>id}": phID, "{>opcode}": phOpcode, "{>do}": phDO, "{>bufsize}": phBufsize,
	"{rcode}": phRcode, "{rsize}": phRsize, "{duration}": phDuration, "{>rflags}": phRflags,
}

// emptyValue is what CoreDNS writes for a value it does not have.
const emptyValue = "-"

type node struct {
	typ int
	lit string
}

// format is a parsed format.
type format []node

// parseFormat splits s as CoreDNS's replacer does: each '}' is matched
// with the last '{' before it; a known label is a placeholder, {/x} is
// metadata, anything else (with what precedes it) is literal text.
func parseFormat(s string) format {
	var f format
	for {
		j := strings.IndexByte(s, '}')
		if j < 0 {
			break
		}
		i := strings.LastIndexByte(s[:j], '{')
		if i < 0 {
			f = append(f, node{typ: phLiteral, lit: s[:j+1]})
			s = s[j+1:]
			continue
		}
		val := s[i : j+1]
		typ, ok := labels[val]
		switch {
		case ok:
		case strings.HasPrefix(val, "{/"):
			typ = phMetadata
		default:
			typ, val = phLiteral, s[:j+1]
		}
		if i != 0 && typ != phLiteral {
			f = append(f, node{typ: phLiteral, lit: s[:i]})
		}
		f = append(f, node{typ: typ, lit: val})
		s = s[j+1:]
	}
	if s != "" {
		f = append(f, node{typ: phLiteral, lit: s})
	}
	return f
}

// withMetadata is f with the labels the log sets (log/type, log/class)
// given their values, as with the Corefile's metadata.
func (f format) withMetadata() format {
	out := slices.Clone(f)
	for i, n := range out {
		if n.typ != phMetadata {
			continue
		}
		switch n.lit {
		case "{/log/type}":
			out[i].typ = phMetaType
		case "{/log/class}":
			out[i].typ = phMetaClass
		}
	}
	return out
}

// typeNames are CoreDNS's response.Type names.
var typeNames = [...]string{tNoError: "NOERROR", tNameError: "NXDOMAIN", tServerError: "SERVERERROR", tNoData: "NODATA",
	tDelegation: "DELEGATION", tMeta: "META", tUpdate: "UPDATE", tOtherError: "OTHERERROR"}

// appendLine appends e formatted by f.
func (f format) appendLine(b []byte, e *Entry) []byte {
	for _, n := range f {
		b = n.appendValue(b, e)
	}
	return b
}

func (n node) appendValue(b []byte, e *Entry) []byte {
	q := e.Q
	switch n.typ {
	case phLiteral:
		return append(b, n.lit...)
	case phMetadata:
		return append(b, emptyValue...)
	case phMetaType:
		m := new(dns.Msg)
		if err := m.Unpack(e.Resp); err != nil {
			return append(b, typeNames[tOtherError]...)
		}
		return append(b, typeNames[typify(m, time.Now().UTC())]...)
	case phMetaClass:
		return append(b, Classify(e.Resp, time.Now().UTC()).String()...)
	case phType:
		if s, ok := dns.TypeToString[q.Type]; ok {
			return append(b, s...)
		}
		return strconv.AppendUint(append(b, "TYPE"...), uint64(q.Type), 10)
	case phName:
		return append(b, strings.ToLower(wire.NameString(q.Name))...)
	case phClass:
		if s, ok := dns.ClassToString[q.Class]; ok {
			return append(b, s...)
		}
		return strconv.AppendUint(append(b, "CLASS"...), uint64(q.Class), 10)
	case phProto:
		if e.TCP {
			return append(b, "tcp"...)
		}
		return append(b, "udp"...)
	case phSize:
		return strconv.AppendInt(b, int64(requestSize(e.Query)), 10)
	case phRemote:
		return appendAddr(b, e.Remote.Addr())
	case phPort:
		return strconv.AppendUint(b, uint64(e.Remote.Port()), 10)
	case phLocal:
		return appendAddr(b, e.Local)
	case phID:
		return strconv.AppendUint(b, uint64(q.ID), 10)
	case phOpcode:
		return strconv.AppendUint(b, uint64(q.Opcode), 10)
	case phDO:
		return strconv.AppendBool(b, q.DO)
	case phBufsize:
		// CoreDNS's request.Size: 65535 over TCP, else the EDNS size (512
		// without EDNS), at least 512.
		size := int(q.Size)
		if e.TCP {
			size = dns.MaxMsgSize
		} else if size < wire.MinUDPSize {
			size = wire.MinUDPSize
		}
		return strconv.AppendInt(b, int64(size), 10)
	case phRcode:
		if len(e.Resp) < wire.HeaderLen {
			return append(b, emptyValue...)
		}
		rc := int(e.Resp[3] & 0xF)
		if s, ok := dns.RcodeToString[rc]; ok {
			return append(b, s...)
		}
		return strconv.AppendInt(b, int64(rc), 10)
	case phRsize:
		return strconv.AppendInt(b, int64(responseSize(e.Resp)), 10)
	case phDuration:
		return append(strconv.AppendFloat(b, e.Duration.Seconds(), 'f', -1, 64), 's')
	case phRflags:
		if len(e.Resp) < wire.HeaderLen {
			return append(b, emptyValue...)
		}
		return appendFlags(b, binary.BigEndian.Uint16(e.Resp[2:4]))
	}
	return append(b, emptyValue...)
}

// appendFlags writes the set header flags as CoreDNS does: qr,aa,tc,rd,ra,z,ad,cd.
func appendFlags(b []byte, h uint16) []byte {
	start := len(b)
	for _, f := range [...]struct {
		bit uint16
		s   string
	}{{0x8000, "qr,"}, {0x0400, "aa,"}, {0x0200, "tc,"}, {0x0100, "rd,"}, {0x0080, "ra,"}, {0x0040, "z,"}, {0x0020, "ad,"}, {0x0010, "cd,"}} {
		if h&f.bit != 0 {
			b = append(b, f.s...)
		}
	}
	if len(b) > start {
		b = b[:len(b)-1]
	}
	return b
}

// appendAddr writes an address, an IPv6 one in brackets (RFC 3986).
func appendAddr(b []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return append(b, emptyValue...)
	}
	a = a.Unmap()
	if a.Is6() {
		return append(a.AppendTo(append(b, '[')), ']')
	}
	return a.AppendTo(b)
}

// requestSize is {size} as CoreDNS logs it: the query's length once the
// block has handled it, which has dropped the options of its OPT record
// (as CoreDNS 1.15 measured: dig's cookie, NSID, unknown options are not
// counted).
func requestSize(q []byte) int {
	if len(q) < wire.HeaderLen {
		return len(q)
	}
	n := 0 // the records after the question
	for i := 6; i < wire.HeaderLen; i += 2 {
		n += int(binary.BigEndian.Uint16(q[i:]))
	}
	off := wire.HeaderLen
	var err error
	for range int(binary.BigEndian.Uint16(q[4:])) { // the question
		if off, err = wire.SkipName(q, off); err != nil || off+4 > len(q) {
			return len(q)
		}
		off += 4
	}
	size := len(q)
	for range n {
		if off, err = wire.SkipName(q, off); err != nil || off+10 > len(q) {
			return len(q)
		}
		typ, rdlen := binary.BigEndian.Uint16(q[off:]), int(binary.BigEndian.Uint16(q[off+8:]))
		off += 10 + rdlen
		if off > len(q) {
			return len(q)
		}
		if typ == dns.TypeOPT {
			size -= rdlen
		}
	}
	return size
}

// responseSize is {rsize} as CoreDNS logs it: the length of the answer as
// the block's plugins wrote it, before the server added the OPT record
// and compressed it (what CoreDNS 1.15 logs for a block with cache).
func responseSize(resp []byte) int {
	m := new(dns.Msg)
	if m.Unpack(resp) != nil {
		return len(resp)
	}
	m.Extra = slices.DeleteFunc(m.Extra, func(rr dns.RR) bool { return rr.Header().Rrtype == dns.TypeOPT })
	m.Compress = false
	return m.Len()
}
