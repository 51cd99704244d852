package trace

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// zipkinEncoder writes Zipkin v2 JSON (a list of spans), as zipkin-go's
// HTTP reporter posts them: per query the child spans innermost first
// (the order they finish), then the root.
type zipkinEncoder struct{}

func (zipkinEncoder) path() string { return "" }

// header: zipkin-go's reporter sends "b3: 0" so that its own POST is not
// traced.
func (zipkinEncoder) header(h http.Header, _ int) {
	h.Set("Content-Type", "application/json")
	h.Set("B3", "0")
}

func (zipkinEncoder) encode(b *bytes.Buffer, spans []Span) {
	b.WriteByte('[')
	first := true
	for i := range spans {
		s := &spans[i]
		chain := s.t.hit
		if s.Miss {
			chain = s.t.miss
		}
		traceID := nonzero()
		var idBuf [16]uint64 // the root, each handler plugin (13 at most), connect
		ids := idBuf[:0]
		if len(chain)+1 > len(idBuf) {
			ids = make([]uint64, 0, len(chain)+1)
		}
		ids = ids[:len(chain)+1]
		ids[0] = traceID
		for j := 1; j < len(ids); j++ {
			ids[j] = nonzero()
		}
		for j := len(chain) - 1; j >= -1; j-- {
			if !first {
				b.WriteByte(',')
			}
			first = false
			name, parent := defaultTopLevelSpanName, uint64(0)
			if j >= 0 {
				name, parent = chain[j], ids[j]
			}
			writeZipkinSpan(b, s, traceID, ids[j+1], parent, name, j < 0)
		}
	}
	b.WriteByte(']')
}

// defaultTopLevelSpanName is the root span's name (plugin/trace).
const defaultTopLevelSpanName = "servedns"

func nonzero() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

func writeID(b *bytes.Buffer, id uint64) {
	var raw [8]byte
	for i := 7; i >= 0; i-- {
		raw[i] = byte(id)
		id >>= 8
	}
	var h [16]byte
	hex.Encode(h[:], raw[:])
	b.WriteByte('"')
	b.Write(h[:])
	b.WriteByte('"')
}

func writeZipkinSpan(b *bytes.Buffer, s *Span, traceID, id, parent uint64, name string, root bool) {
	b.WriteString(`{"timestamp":`)
	b.Write(strconv.AppendInt(b.AvailableBuffer(), s.Start.UnixMicro(), 10))
	b.WriteString(`,"duration":`)
	b.Write(strconv.AppendInt(b.AvailableBuffer(), max(s.Duration.Microseconds(), 1), 10))
	b.WriteString(`,"traceId":`)
	writeID(b, traceID)
	b.WriteString(`,"id":`)
	writeID(b, id)
	if parent != 0 {
		b.WriteString(`,"parentId":`)
		writeID(b, parent)
	}
	b.WriteString(`,"name":`)
	writeJSONString(b, name)
	if root {
		b.WriteString(`,"kind":"SERVER"`)
	}
	b.WriteString(s.t.endpoint)
	if root {
		// Sorted, as Go's JSON encoding of zipkin-go's tag map.
		b.WriteString(`,"tags":{"coredns.io/name":`)
		writeJSONString(b, s.Name)
		b.WriteString(`,"coredns.io/proto":`)
		writeJSONString(b, proto(s.TCP))
		b.WriteString(`,"coredns.io/rcode":`)
		writeJSONString(b, rcodeString(s.Rcode))
		b.WriteString(`,"coredns.io/remote":"`)
		b.Write(s.Remote.AppendTo(b.AvailableBuffer()))
		b.WriteByte('"')
		b.WriteString(`,"coredns.io/type":`)
		writeJSONString(b, typeString(s.QType))
		b.WriteByte('}')
	}
	b.WriteByte('}')
}

func proto(tcp bool) string {
	if tcp {
		return "tcp"
	}
	return "udp"
}

// rcodeString is CoreDNS's rcode.ToString.
func rcodeString(rc int) string {
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return "RCODE" + strconv.Itoa(rc)
}

// typeString is CoreDNS's request.Type: miekg/dns's Type.String.
func typeString(t uint16) string { return dns.Type(t).String() }

// writeJSONString writes s as a JSON string (names may hold any byte as
// \DDD escapes; those are printable ASCII already, the rest is escaped).
func writeJSONString(b *bytes.Buffer, s string) {
	const hexd = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			b.WriteString(`\u00`)
			b.WriteByte(hexd[c>>4])
			b.WriteByte(hexd[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// zipkinEndpoint is the localEndpoint field of every span of a block:
// the service name lower-cased (zipkin-go's Endpoint.MarshalJSON) and, as
// zipkin-go's NewEndpoint makes it from CoreDNS's serviceEndpoint, the
// block's first bind address (0.0.0.0 too) and its port; none for a
// block without bind. (With an IPv6 first address the stock sends no
// localEndpoint at all: CoreDNS joins address and port without brackets,
// which NewEndpoint cannot parse; we send it.)
func zipkinEndpoint(service string, local netip.AddrPort) string {
	var b bytes.Buffer
	b.WriteString(`,"localEndpoint":{"serviceName":`)
	writeJSONString(&b, strings.ToLower(service))
	if l := local; l.Addr().IsValid() {
		if l.Addr().Is4() {
			b.WriteString(`,"ipv4":"`)
		} else {
			b.WriteString(`,"ipv6":"`)
		}
		b.WriteString(l.Addr().String())
		b.WriteByte('"')
		if l.Port() != 0 {
			b.WriteString(`,"port":`)
			b.WriteString(strconv.Itoa(int(l.Port())))
		}
	}
	b.WriteByte('}')
	return b.String()
}
