package loadbalance

import (
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
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
