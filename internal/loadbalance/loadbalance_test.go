package loadbalance

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func packAnswer(t testing.TB, qtype uint16, rcode int, answers, extra []string) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("www.example.org.", qtype)
	m.Response, m.Rcode = true, rcode
	for _, s := range answers {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	for _, s := range extra {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		m.Extra = append(m.Extra, rr)
	}
	m.SetEdns0(1232, false)
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sections unpacks b into each section's records as text, in order.
func sections(t testing.TB, b []byte) (ans, extra []string) {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatal(err)
	}
	for _, rr := range m.Answer {
		ans = append(ans, rr.String())
	}
	for _, rr := range m.Extra {
		extra = append(extra, rr.String())
	}
	return ans, extra
}

// Shuffling keeps every record and gives every order of the addresses;
// CNAMEs stay first, MX records are shuffled too, OPT stays last; an
// answer that is not NOERROR is left alone.
func TestShuffle(t *testing.T) {
	for _, tc := range []struct {
		name          string
		qtype         uint16
		answers       []string
		extra         []string
		orders        int // distinct orders expected
		inPlace       bool
		firstFixedLen int // leading records that never move
	}{
		{"four A", dns.TypeA, []string{"www.example.org. 30 IN A 192.0.2.1", "www.example.org. 30 IN A 192.0.2.2", "www.example.org. 30 IN A 192.0.2.3", "www.example.org. 30 IN A 192.0.2.4"}, nil, 24, true, 0},
		{"CNAME then AAAA", dns.TypeAAAA, []string{"www.example.org. 30 IN CNAME web.example.net.", "web.example.net. 30 IN AAAA 2001:db8::1", "web.example.net. 30 IN AAAA 2001:db8::2"}, nil, 2, false, 1},
		{"MX with glue", dns.TypeMX, []string{"www.example.org. 30 IN MX 10 mx1.example.org.", "www.example.org. 30 IN MX 20 mx2.example.org.", "www.example.org. 30 IN MX 30 mx3.example.org."},
			[]string{"mx1.example.org. 30 IN A 192.0.2.25", "mx2.example.org. 30 IN A 192.0.2.26"}, 6, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := packAnswer(t, tc.qtype, dns.RcodeSuccess, tc.answers, tc.extra)
			wantAns, wantExtra := sections(t, orig)
			seen := map[string]bool{}
			for range 400 {
				b := Shuffle(slices.Clone(orig))
				ans, extra := sections(t, b)
				if !slices.Equal(sorted(ans), sorted(wantAns)) || !slices.Equal(sorted(extra), sorted(wantExtra)) {
					t.Fatalf("records changed:\n%v %v\nwant\n%v %v", ans, extra, wantAns, wantExtra)
				}
				if !slices.Equal(ans[:tc.firstFixedLen], wantAns[:tc.firstFixedLen]) || !strings.Contains(extra[len(extra)-1], "OPT") {
					t.Fatalf("order: %v %v", ans, extra)
				}
				seen[strings.Join(ans, "|")] = true
			}
			if len(seen) != tc.orders {
				t.Errorf("%d orders, want %d", len(seen), tc.orders)
			}
			if tc.inPlace {
				b := slices.Clone(orig)
				if n := testing.AllocsPerRun(100, func() { Shuffle(b) }); n != 0 {
					t.Errorf("%v allocations in place", n)
				}
			}
		})
	}
	nx := packAnswer(t, dns.TypeA, dns.RcodeNameError, nil, nil)
	if got := Shuffle(slices.Clone(nx)); !slices.Equal(got, nx) {
		t.Error("NXDOMAIN changed")
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// BenchmarkShuffleInPlace: the common answer, four A records.
func BenchmarkShuffleInPlace(b *testing.B) {
	orig := packAnswer(b, dns.TypeA, dns.RcodeSuccess, []string{"www.example.org. 30 IN A 192.0.2.1", "www.example.org. 30 IN A 192.0.2.2", "www.example.org. 30 IN A 192.0.2.3", "www.example.org. 30 IN A 192.0.2.4"}, nil)
	b.ReportAllocs()
	for b.Loop() {
		Shuffle(orig)
	}
}

// withRdataLen rewrites every answer record of b (A or AAAA records with
// pointer owners, as answer packs them) to carry n bytes of data.
func withRdataLen(t *testing.T, b []byte, n int) []byte {
	t.Helper()
	m := unpackMsg(t, b)
	off := 12 + len("www.example.org.") + 1 + 4
	out := slices.Clone(b[:off])
	for range m.Answer {
		rdlen := int(binary.BigEndian.Uint16(b[off+10:]))
		out = append(out, b[off:off+10]...)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
		out = append(out, make([]byte, n)...)
		off += 12 + rdlen
	}
	return append(out, b[off:]...) // the OPT
}

func unpackMsg(t *testing.T, b []byte) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestShuffleLeavesMalformedAddressRecords: a stored answer whose A or
// AAAA records do not hold 4 or 16 bytes (an unchecked import once made
// one) is left as it is, without a panic: the in-place shuffle checks each
// record's length, and the repack refuses what does not unpack.
func TestShuffleLeavesMalformedAddressRecords(t *testing.T) {
	a := packAnswer(t, dns.TypeA, dns.RcodeSuccess, []string{"www.example.org. 30 IN A 192.0.2.1", "www.example.org. 30 IN A 192.0.2.2"}, nil)
	aaaa := packAnswer(t, dns.TypeAAAA, dns.RcodeSuccess, []string{"www.example.org. 30 IN AAAA 2001:db8::1", "www.example.org. 30 IN AAAA 2001:db8::2"}, nil)
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"A of 3 bytes", withRdataLen(t, a, 3)},
		{"A of 20 bytes", withRdataLen(t, a, 20)},
		{"A of 0 bytes", withRdataLen(t, a, 0)},
		{"AAAA of 4 bytes", withRdataLen(t, aaaa, 4)},
		{"AAAA of 40 bytes", withRdataLen(t, aaaa, 40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 40 {
				if got := Shuffle(slices.Clone(tc.msg)); !slices.Equal(got, tc.msg) {
					t.Fatalf("changed:\n%x\n%x", tc.msg, got)
				}
			}
		})
	}
}

// FuzzShuffle: no message makes the shuffle panic, and one that
// wire.CheckMessage accepts comes out with the same records, still
// accepted.
func FuzzShuffle(f *testing.F) {
	f.Add(packAnswer(f, dns.TypeA, dns.RcodeSuccess, []string{"www.example.org. 30 IN A 192.0.2.1", "www.example.org. 30 IN A 192.0.2.2", "www.example.org. 30 IN A 192.0.2.3"}, nil))
	f.Add(packAnswer(f, dns.TypeAAAA, dns.RcodeSuccess, []string{"www.example.org. 30 IN CNAME web.example.net.", "web.example.net. 30 IN AAAA 2001:db8::1", "web.example.net. 30 IN AAAA 2001:db8::2"}, nil))
	f.Add(packAnswer(f, dns.TypeMX, dns.RcodeSuccess, []string{"www.example.org. 30 IN MX 10 mx1.example.org.", "www.example.org. 30 IN MX 20 mx2.example.org."},
		[]string{"mx1.example.org. 30 IN A 192.0.2.25", "mx2.example.org. 30 IN A 192.0.2.26"}))
	f.Add(pointedInto(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := slices.Clone(b)
		out := Shuffle(b)
		if wire.CheckMessage(in) != nil {
			return
		}
		if err := wire.CheckMessage(out); err != nil {
			t.Fatalf("a well-formed message shuffled into a malformed one: %v\n%x\n%x", err, in, out)
		}
		mi, mo := new(dns.Msg), new(dns.Msg)
		if mi.Unpack(in) != nil {
			return
		}
		if err := mo.Unpack(out); err != nil {
			t.Fatalf("shuffled message does not unpack: %v", err)
		}
		if len(mi.Answer) != len(mo.Answer) || len(mi.Ns) != len(mo.Ns) || len(mi.Extra) != len(mo.Extra) {
			t.Fatalf("sections changed: %v\n%v", mi, mo)
		}
	})
}

// pointedInto is an answer whose second A record's owner is a pointer
// into the first (at its length field's 0 byte: the root), which
// wire.CheckMessage accepts.
func pointedInto(t testing.TB) []byte {
	t.Helper()
	b := packAnswer(t, dns.TypeA, dns.RcodeSuccess, []string{"www.example.org. 30 IN A 192.0.2.1", "www.example.org. 30 IN A 192.0.2.2"}, nil)
	first := 12 + len("www.example.org.") + 1 + 4
	rdlen := first + 2 + 8
	binary.BigEndian.PutUint16(b[first+16:], uint16(0xC000|rdlen))
	if err := wire.CheckMessage(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestShuffleKeepsWhatIsPointedInto: records that a compression pointer
// points into are not moved in place (the name would change, or stop
// being one): the message is repacked, and stays well-formed. FuzzImport
// found it, through an entry a twin could hand over.
func TestShuffleKeepsWhatIsPointedInto(t *testing.T) {
	in := pointedInto(t)
	want := unpackMsg(t, in)
	for range 40 {
		out := Shuffle(slices.Clone(in))
		if err := wire.CheckMessage(out); err != nil {
			t.Fatalf("shuffled into a malformed message: %v\n%x\n%x", err, in, out)
		}
		if got := unpackMsg(t, out); len(got.Answer) != len(want.Answer) {
			t.Fatalf("records changed: %v", got)
		}
	}
}
