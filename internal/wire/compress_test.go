package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// compressCases are upstream answers with names in every place the
// Compressor looks (owners, the rdata of compressible types and of types
// whose names must stay whole) and types it copies as they are.
func compressCases(t testing.TB) map[string]*dns.Msg {
	t.Helper()
	mk := func(qname string, qtype uint16, ans, ns, extra []string) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(qname, qtype)
		m.Response = true
		for _, sec := range []struct {
			dst *[]dns.RR
			src []string
		}{{&m.Answer, ans}, {&m.Ns, ns}, {&m.Extra, extra}} {
			for _, s := range sec.src {
				rr, err := dns.NewRR(s)
				if err != nil {
					t.Fatal(s, err)
				}
				*sec.dst = append(*sec.dst, rr)
			}
		}
		return m
	}
	var headless, srv, srvA, ptr []string
	for i := range 100 {
		headless = append(headless, fmt.Sprintf("web.default.svc.cluster.local. 30 IN A 10.244.%d.%d", i/50, i%50+1))
	}
	for i := range 40 {
		host := fmt.Sprintf("web-%d.web.default.svc.cluster.local.", i)
		srv = append(srv, "_http._tcp.web.default.svc.cluster.local. 30 IN SRV 0 3 80 "+host)
		srvA = append(srvA, host+fmt.Sprintf(" 30 IN A 10.244.1.%d", i+1))
		ptr = append(ptr, fmt.Sprintf("10.0.96.10.in-addr.arpa. 30 IN PTR svc-%d.ns.svc.cluster.local.", i))
	}
	return map[string]*dns.Msg{
		"headless 100 A": mk("web.default.svc.cluster.local.", dns.TypeA, headless, nil, nil),
		"SRV 40 with A":  mk("_http._tcp.web.default.svc.cluster.local.", dns.TypeSRV, srv, nil, srvA),
		"PTR 40":         mk("10.0.96.10.in-addr.arpa.", dns.TypePTR, ptr, nil, nil),
		"mixed case": mk("Web.Default.svc.cluster.local.", dns.TypeA, []string{
			"Web.Default.svc.cluster.local. 30 IN CNAME Other.default.SVC.cluster.local.",
			"other.default.svc.cluster.local. 30 IN A 10.0.0.1",
			"OTHER.default.svc.cluster.local. 30 IN A 10.0.0.2",
		}, nil, nil),
		"CNAME chain across zones": mk("www.example.com.", dns.TypeA, []string{
			"www.example.com. 300 IN CNAME www.example.com.cdn.example.net.",
			"www.example.com.cdn.example.net. 60 IN CNAME e1.a.example.net.",
			"e1.a.example.net. 20 IN A 192.0.2.1",
		}, nil, nil),
		"every named type": mk("example.com.", dns.TypeANY, []string{
			"example.com. 60 IN NS ns1.example.com.",
			"example.com. 60 IN MX 10 mail.example.com.",
			"example.com. 60 IN SOA ns1.example.com. hostmaster.example.com. 1 2 3 4 5",
			"example.com. 60 IN TXT \"v=spf1 include:example.com -all\" \"second\"",
			"example.com. 60 IN DNAME example.net.",
			"example.com. 60 IN NAPTR 100 10 \"S\" \"SIP+D2U\" \"\" _sip._udp.example.com.",
			"example.com. 60 IN MINFO admin.example.com. errors.example.com.",
			"example.com. 60 IN RP admin.example.com. txt.example.com.",
			"example.com. 60 IN AFSDB 1 afs.example.com.",
			"example.com. 60 IN SRV 0 0 53 ns1.example.com.",
			"example.com. 60 IN AAAA 2001:db8::1",
			"example.com. 60 IN TYPE65280 \\# 4 01020304",
			"example.com. 60 IN CAA 0 issue \"ca.example.com\"",
		}, []string{"example.com. 60 IN SOA ns1.example.com. hostmaster.example.com. 1 2 3 4 5"},
			[]string{"ns1.example.com. 60 IN A 192.0.2.53", "mail.example.com. 60 IN A 192.0.2.25"}),
		"NXDOMAIN with SOA": mk("nope.default.svc.cluster.local.", dns.TypeA, nil,
			[]string{"cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"}, nil),
		"root owner": mk(".", dns.TypeNS, []string{". 60 IN NS a.root-servers.net."}, nil, nil),
	}
}

func packMsg(t testing.TB, m *dns.Msg, compress bool) []byte {
	t.Helper()
	m.Compress = compress
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lowerRecords is the message's records in order, lower-cased (compression
// matches names ignoring case, so a later name may show an earlier one's).
func lowerRecords(t testing.TB, b []byte) []string {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			out = append(out, strings.ToLower(rr.String()))
		}
	}
	return out
}

// TestCompressAtLeastAsMiekg re-packs every case, from miekg's uncompressed
// and compressed packing: the result holds the same records in the same
// order, passes CheckMessage, its layout points at each record's TTL and
// end, and every prefix of it (what a truncated answer keeps) is no longer
// than miekg/dns's compressed packing of the same records.
func TestCompressAtLeastAsMiekg(t *testing.T) {
	var c Compressor
	for name, m := range compressCases(t) {
		for _, compressed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/compressed=%v", name, compressed), func(t *testing.T) {
				in := packMsg(t, m, compressed)
				var a Answer
				if err := ParseAnswer(in, &a); err != nil {
					t.Fatal(err)
				}
				out, ok := c.Compress([]byte("prefix"), in, a.QEnd, a.RRs)
				if !ok {
					t.Fatal("not compressed")
				}
				if string(out[:6]) != "prefix" {
					t.Fatal("dst's bytes changed")
				}
				out = out[6:]
				if err := CheckMessage(out); err != nil {
					t.Fatal(err)
				}
				want, got := lowerRecords(t, in), lowerRecords(t, out)
				if strings.Join(want, "\n") != strings.Join(got, "\n") {
					t.Fatalf("records differ:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
				if len(c.Layout) != len(a.RRs) {
					t.Fatalf("%d layouts for %d records", len(c.Layout), len(a.RRs))
				}
				all := append(append(append([]dns.RR{}, m.Answer...), m.Ns...), m.Extra...)
				for k, l := range c.Layout {
					if got := binary.BigEndian.Uint32(out[l.TTLOff:]); got != a.RRs[k].TTL || l.TTL != got {
						t.Fatalf("record %d: TTL at %d is %d, want %d", k, l.TTLOff, got, a.RRs[k].TTL)
					}
					end, err := skipRR(out, l.Start)
					if err != nil || end != l.End {
						t.Fatalf("record %d: ends at %d (%v), layout says %d", k, end, err, l.End)
					}
					p := m.Copy()
					p.Answer, p.Ns, p.Extra = nil, nil, nil
					for _, rr := range all[:k+1] {
						switch {
						case len(p.Answer) < len(m.Answer) && len(p.Ns) == 0 && len(p.Extra) == 0:
							p.Answer = append(p.Answer, rr)
						case len(p.Ns) < len(m.Ns) && len(p.Extra) == 0:
							p.Ns = append(p.Ns, rr)
						default:
							p.Extra = append(p.Extra, rr)
						}
					}
					if ref := len(packMsg(t, p, true)); l.End > ref {
						t.Fatalf("first %d records: %d bytes, miekg compressed %d", k+1, l.End, ref)
					}
				}
				if AlreadyCompressed(in, a.RRs) && !bytes.Equal(out, in) {
					t.Fatalf("AlreadyCompressed, but re-packed to %d bytes from %d", len(out), len(in))
				}
				if ref := len(packMsg(t, m, true)); len(out) > ref {
					t.Fatalf("%d bytes, miekg compressed %d", len(out), ref)
				}
			})
		}
	}
}

// TestCompressRejectsMalformed: names that point forwards, loop, or rdata
// with bytes past its names fail without touching dst.
func TestCompressRejectsMalformed(t *testing.T) {
	m := compressCases(t)["CNAME chain across zones"]
	good := packMsg(t, m, true)
	var a Answer
	if err := ParseAnswer(good, &a); err != nil {
		t.Fatal(err)
	}
	target := a.RRs[0].TTLOff + 6 // the first CNAME's rdata
	for name, mutate := range map[string]func(b []byte){
		"forward pointer":            func(b []byte) { binary.BigEndian.PutUint16(b[target:], 0xC000|uint16(len(b)-2)) },
		"self pointer":               func(b []byte) { binary.BigEndian.PutUint16(b[target:], 0xC000|uint16(target)) },
		"label too long":             func(b []byte) { b[target] = 64 },
		"byte past the rdata's name": nil,
	} {
		t.Run(name, func(t *testing.T) {
			b := append([]byte(nil), good...)
			rrs := append([]RR(nil), a.RRs...)
			if mutate != nil {
				mutate(b)
			} else {
				rrs[0].End++ // the CNAME's rdata holds one byte after its name
			}
			var c Compressor
			dst := []byte("keep")
			out, ok := c.Compress(dst, b, a.QEnd, rrs)
			if ok || string(out) != "keep" {
				t.Fatalf("ok=%v out=%q", ok, out)
			}
		})
	}
}

// FuzzCompress: any answer CheckMessage accepts re-packs to one it accepts,
// with the same records; anything else fails cleanly or re-packs.
func FuzzCompress(f *testing.F) {
	for _, m := range compressCases(f) {
		f.Add(packMsg(f, m, false))
		f.Add(packMsg(f, m, true))
	}
	var c Compressor
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Answer
		if ParseAnswer(b, &a) != nil {
			return
		}
		rrs := a.RRs
		end := a.End
		if a.OPTStart >= 0 {
			end = a.OPTStart
		}
		for len(rrs) > 0 && rrs[len(rrs)-1].Start >= end {
			rrs = rrs[:len(rrs)-1]
		}
		out, ok := c.Compress(nil, b, a.QEnd, rrs)
		if !ok {
			return
		}
		var cnt [4]uint16
		for _, rr := range rrs {
			cnt[rr.Section]++
		}
		SetCounts(out, 1, cnt[SectionAnswer], cnt[SectionAuthority], cnt[SectionAdditional])
		if AlreadyCompressed(b, rrs) && !bytes.Equal(out[HeaderLen:], b[HeaderLen:end]) {
			t.Fatalf("AlreadyCompressed, but re-packed differently")
		}
		var a2 Answer
		if err := ParseAnswer(out, &a2); err != nil {
			t.Fatalf("re-packed message does not parse: %v", err)
		}
		valid := CheckMessage(b[:end]) == nil
		if valid {
			if err := CheckMessage(out); err != nil {
				t.Fatalf("re-packed message invalid: %v", err)
			}
		}
		if len(a2.RRs) != len(rrs) {
			t.Fatalf("%d records, want %d", len(a2.RRs), len(rrs))
		}
		for i, rr := range a2.RRs {
			if rr.Type != rrs[i].Type || rr.TTL != rrs[i].TTL || c.Layout[i].End != rr.End || c.Layout[i].TTLOff != rr.TTLOff {
				t.Fatalf("record %d: %+v, layout %+v, want type %d ttl %d", i, rr, c.Layout[i], rrs[i].Type, rrs[i].TTL)
			}
		}
	})
}

// TestAlreadyCompressed: answers whose owners all point at the question and
// whose rdata hold no names are recognised; the others are not.
func TestAlreadyCompressed(t *testing.T) {
	one := new(dns.Msg)
	one.SetQuestion("www.example.org.", dns.TypeA)
	one.Response = true
	for _, s := range []string{"www.example.org. 60 IN A 192.0.2.1", "www.example.org. 60 IN A 192.0.2.2"} {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		one.Answer = append(one.Answer, rr)
	}
	cname := one.Copy()
	rr, err := dns.NewRR("www.example.org. 60 IN CNAME www.example.org.cdn.example.net.")
	if err != nil {
		t.Fatal(err)
	}
	cname.Answer = append([]dns.RR{rr}, cname.Answer...)
	for _, c := range []struct {
		name     string
		m        *dns.Msg
		compress bool
		want     bool
	}{
		{"A records compressed", one, true, true},
		{"A records uncompressed", one, false, false},
		{"a CNAME, compressed", cname, true, false},
	} {
		b := packMsg(t, c.m, c.compress)
		var a Answer
		if err := ParseAnswer(b, &a); err != nil {
			t.Fatal(err)
		}
		if got := AlreadyCompressed(b, a.RRs); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
