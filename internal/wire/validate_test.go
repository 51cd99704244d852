package wire

import (
	"encoding/binary"
	"testing"

	"github.com/miekg/dns"
)

// answerMsg is a response with a record of every kind CheckMessage looks into, compressed.
func answerMsg(t testing.TB) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.Response = true
	m.Compress = true
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	m.Answer = []dns.RR{
		rr("www.example.com. 30 IN CNAME web.example.com."),
		rr("web.example.com. 30 IN A 192.0.2.1"),
		rr("web.example.com. 30 IN AAAA 2001:db8::1"),
		rr("web.example.com. 30 IN TXT \"a\" \"bc\""),
		rr("web.example.com. 30 IN MX 10 mail.example.com."),
		rr("_s._tcp.example.com. 30 IN SRV 1 2 3 web.example.com."),
		rr("1.2.0.192.in-addr.arpa. 30 IN PTR web.example.com."),
		rr("example.com. 30 IN NAPTR 100 10 \"S\" \"SIP+D2U\" \"\" _sip._udp.example.com."),
		rr("example.com. 30 IN DNAME example.net."),
	}
	m.Ns = []dns.RR{
		rr("example.com. 30 IN NS ns1.example.com."),
		rr("example.com. 30 IN SOA ns1.example.com. host.example.com. 1 2 3 4 5"),
	}
	m.SetEdns0(1232, true)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rdataStart returns the offset of the rdata of the i-th record (0-based, all sections).
func rdataStart(t testing.TB, b []byte, i int) int {
	t.Helper()
	off := HeaderLen
	off, _ = CheckName(b, off)
	off += 4
	for j := 0; ; j++ {
		var err error
		if off, err = CheckName(b, off); err != nil {
			t.Fatal(err)
		}
		if j == i {
			return off + 10
		}
		off += 10 + int(binary.BigEndian.Uint16(b[off+8:]))
	}
}

func TestCheckMessage(t *testing.T) {
	good := answerMsg(t)
	if err := CheckMessage(good); err != nil {
		t.Fatalf("valid answer rejected: %v", err)
	}
	with := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	ptr := func(to int) []byte { return []byte{0xC0 | byte(to>>8), byte(to)} }
	tests := map[string][]byte{
		"truncated header": good[:11],
		"truncated record": good[:len(good)-3],
		// The CNAME target is "web" + pointer to "example.com." in the question; make the
		// pointer point at itself, then past the end, then into the header.
		"pointer to itself": with(func(b []byte) []byte {
			o := rdataStart(t, b, 0) + 4
			copy(b[o:], ptr(o))
			return b
		}),
		"pointer forwards past the end": with(func(b []byte) []byte {
			copy(b[rdataStart(t, b, 0)+4:], ptr(len(b)+10))
			return b
		}),
		"pointer into the header": with(func(b []byte) []byte {
			copy(b[rdataStart(t, b, 0)+4:], ptr(2))
			return b
		}),
		// A loop through two names: the owner of the A record points at the CNAME target,
		// whose pointer is made to point at the A record's owner.
		"pointer loop": with(func(b []byte) []byte {
			cname := rdataStart(t, b, 0)
			owner := cname + int(binary.BigEndian.Uint16(b[cname-2:]))
			copy(b[cname+4:], ptr(owner))
			return b
		}),
		"MX exchange pointing forward": with(func(b []byte) []byte {
			o := rdataStart(t, b, 4) + 2 // after the preference
			copy(b[o:], ptr(len(b)-20))
			return b
		}),
		"A of 5 bytes": with(func(b []byte) []byte {
			o := rdataStart(t, b, 1)
			binary.BigEndian.PutUint16(b[o-2:], 5)
			return b
		}),
		"TXT string past its rdata": with(func(b []byte) []byte {
			b[rdataStart(t, b, 3)] = 200
			return b
		}),
		"label of 64": with(func(b []byte) []byte {
			b[HeaderLen] = 64
			return b
		}),
	}
	for name, b := range tests {
		if err := CheckMessage(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A chain of pointers that only moves backwards is fine; a name whose expansion
	// passes 255 bytes is not.
	long := make([]byte, HeaderLen, 600)
	binary.BigEndian.PutUint16(long[4:], 0)
	binary.BigEndian.PutUint16(long[6:], 1)
	first := len(long)
	for range 4 {
		long = append(long, 63)
		long = append(long, make([]byte, 63)...)
	}
	long = append(long, 0)
	long = append(long, ptr(first)...)
	long = append(long, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 1, 2, 3, 4)
	if err := CheckMessage(long); err == nil {
		t.Error("name of 257 bytes accepted")
	}
}

// SkipName refuses pointers that point forwards or into the header.
func BenchmarkCheckMessage(b *testing.B) {
	msg := answerMsg(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckMessage(msg); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSkipNamePointers(t *testing.T) {
	b := make([]byte, 40)
	b[20], b[21] = 0xC0, 12
	if _, err := SkipName(b, 20); err != nil {
		t.Errorf("backward pointer: %v", err)
	}
	for _, to := range []byte{20, 30, 2} {
		b[21] = to
		if _, err := SkipName(b, 20); err == nil {
			t.Errorf("pointer to %d from 20 accepted", to)
		}
	}
}

// FuzzCheckMessage: what CheckMessage accepts, miekg/dns unpacks too (for messages whose
// records are all of types whose rdata CheckMessage interprets; OPT without options, whose
// content miekg/dns interprets option by option), and ParseAnswer reads without panicking.
// The Makefile runs it: go test -run '^$' -fuzz '^FuzzCheckMessage$' ./internal/wire
func FuzzCheckMessage(f *testing.F) {
	f.Add(answerMsg(f))
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	m.Response = true
	m.Rcode = dns.RcodeNameError
	b, _ := m.Pack()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Answer
		_ = ParseAnswer(b, &a)
		if CheckMessage(b) != nil {
			return
		}
		if !onlyCheckedTypes(b) {
			return
		}
		var m dns.Msg
		if err := m.Unpack(b); err != nil {
			t.Fatalf("accepted a message miekg/dns rejects: %v", err)
		}
	})
}

// onlyCheckedTypes reports whether every record of the valid message b has a type whose
// rdata CheckMessage interprets, and every OPT is without options.
func onlyCheckedTypes(b []byte) bool {
	qd, an, ns, ar := Counts(b)
	off := HeaderLen
	for range int(qd) {
		off, _ = CheckName(b, off)
		off += 4
	}
	for range int(an) + int(ns) + int(ar) {
		off, _ = CheckName(b, off)
		typ := binary.BigEndian.Uint16(b[off:])
		rdlen := int(binary.BigEndian.Uint16(b[off+8:]))
		if !CheckedType(typ) || typ == TypeOPT && rdlen > 0 {
			return false
		}
		off += 10 + rdlen
	}
	return true
}
