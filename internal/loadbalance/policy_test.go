package loadbalance

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func fourA(t testing.TB, qtype uint16) []byte {
	return packAnswer(t, qtype, dns.RcodeSuccess, []string{
		"www.example.org. 30 IN A 192.0.2.1", "www.example.org. 30 IN A 192.0.2.2",
		"www.example.org. 30 IN A 192.0.2.3", "www.example.org. 30 IN A 192.0.2.4",
	}, nil)
}

func weightFile(t testing.TB, s string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "weights")
	if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// The weight file's format, as CoreDNS reads it, with its errors; a file
// past MaxWeightFile is refused.
func TestWeightFile(t *testing.T) {
	w, err := NewWeights(weightFile(t, "# c\n\nwww.example.org\n192.0.2.1 3\n  192.0.2.2 255  \nother.example.\n2001:db8::1 1\n"), 0)
	if err != nil || w.Names() != 2 {
		t.Fatalf("%v, %d names", err, w.Names())
	}
	if it := w.cur.Load().names["www.example.org."]; len(it) != 2 || it[1].value != 255 {
		t.Errorf("www.example.org.: %+v", it)
	}
	for _, tc := range []struct{ text, want string }{
		{"192.0.2.1\n", "wrong domain name"},
		{"a..b\n", "wrong domain name"},
		{"192.0.2.1 3\n", "missing domain name"},
		{"www.example.org\nnot-ip 3\n", "wrong IP address"},
		{"www.example.org\n192.0.2.1 0\n", "wrong weight value"},
		{"www.example.org\n192.0.2.1 256\n", "wrong weight value"},
		{"www.example.org\n192.0.2.1 3 4\n", "could not parse weight line"},
		{strings.Repeat("#", MaxWeightFile+1), "larger than"},
	} {
		if _, err := NewWeights(weightFile(t, tc.text), time.Second); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.40q: %v, want %q", tc.text, err, tc.want)
		}
	}
	if _, err := NewWeights("/nonexistent/w", 0); !errors.Is(err, ErrWeightFileOpen) {
		t.Errorf("missing file without reload: %v", err)
	}
	if w, err := NewWeights("/nonexistent/w", time.Second); w == nil || !errors.Is(err, ErrWeightFileOpen) {
		t.Errorf("missing file with reload: %v %v", w, err)
	}
}

// top returns the first address of each of n weighted answers, counted.
func tops(t *testing.T, p *Policy, qtype uint16, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	orig := fourA(t, qtype)
	for range n {
		ans, _ := sections(t, p.Apply(orig))
		out[strings.Fields(ans[0])[4]]++
	}
	return out
}

// weighted: one address drawn by weight (unlisted ones weigh 1) goes
// first, the others stay in place; only A, AAAA and SRV answers. A change
// of the file applies after Reload; a bad one keeps the weights.
func TestWeighted(t *testing.T) {
	f := weightFile(t, "www.example.org\n192.0.2.3 7\n")
	w, err := NewWeights(f, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	p := &Policy{Weights: w}
	got := tops(t, p, dns.TypeA, 2000)
	if f := float64(got["192.0.2.3"]) / 2000; f < 0.64 || f > 0.76 { // 7 of 10
		t.Errorf("192.0.2.3 first in %.2f, want 0.7: %v", f, got)
	}
	ans, _ := sections(t, p.Apply(fourA(t, dns.TypeA)))
	if first := strings.Fields(ans[0])[4]; first != "192.0.2.1" {
		// the others keep their places around the swap
		want := map[string][]string{"192.0.2.2": {"192.0.2.2", "192.0.2.1", "192.0.2.3", "192.0.2.4"}, "192.0.2.3": {"192.0.2.3", "192.0.2.2", "192.0.2.1", "192.0.2.4"}, "192.0.2.4": {"192.0.2.4", "192.0.2.2", "192.0.2.3", "192.0.2.1"}}[first]
		for i, a := range ans {
			if strings.Fields(a)[4] != want[i] {
				t.Errorf("order %v, want %v", ans, want)
				break
			}
		}
	}
	if got := tops(t, p, dns.TypeTXT, 50); got["192.0.2.1"] != 50 {
		t.Errorf("a TXT question's answer was weighted: %v", got)
	}
	if err := os.WriteFile(f, []byte("www.example.org\n192.0.2.4 255\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for tops(t, p, dns.TypeA, 100)["192.0.2.4"] < 90 {
		if time.Now().After(deadline) {
			t.Fatal("the changed weight file did not apply")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(f, []byte("garbage line here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	tops(t, p, dns.TypeA, 10) // starts the read
	time.Sleep(100 * time.Millisecond)
	if got := tops(t, p, dns.TypeA, 100); got["192.0.2.4"] < 90 {
		t.Errorf("a bad weight file changed the weights: %v", got)
	}
}

// prefer: after round_robin, the addresses of each subnet in turn, then
// the rest; CNAMEs first, then MX, then the other records (CoreDNS's
// reorderRecords); OPT stays last.
func TestPrefer(t *testing.T) {
	_, a, _ := net.ParseCIDR("192.0.2.3/32")
	_, b, _ := net.ParseCIDR("192.0.2.0/31")
	p := &Policy{Prefer: []*net.IPNet{a, b}}
	seen := map[string]bool{}
	for range 200 {
		ans, extra := sections(t, p.Apply(fourA(t, dns.TypeA)))
		var order []string
		for _, r := range ans {
			order = append(order, strings.Fields(r)[4])
		}
		o := strings.Join(order, " ")
		seen[o] = true
		if !strings.HasPrefix(o, "192.0.2.3 192.0.2.1 ") || len(extra) != 1 || !strings.Contains(extra[0], "OPT") {
			t.Fatalf("order %s, extra %v", o, extra)
		}
	}
	if len(seen) != 2 {
		t.Errorf("orders %v, want the two of .2 and .4", seen)
	}
	mixed := packAnswer(t, dns.TypeA, dns.RcodeSuccess, []string{"www.example.org. 30 IN TXT \"t\"", "www.example.org. 30 IN MX 10 mx.example.org.", "www.example.org. 30 IN A 192.0.2.9", "www.example.org. 30 IN CNAME x.example.org."}, nil)
	ans, _ := sections(t, p.Apply(mixed))
	var types []string
	for _, r := range ans {
		types = append(types, strings.Fields(r)[3])
	}
	if strings.Join(types, " ") != "CNAME A MX TXT" {
		t.Errorf("types in order %v, want CNAME A MX TXT", types)
	}
	nx := packAnswer(t, dns.TypeA, dns.RcodeNameError, nil, nil)
	if got := p.Apply(nx); &got[0] != &nx[0] {
		t.Error("NXDOMAIN repacked")
	}
}

// BenchmarkPolicy: what weighted and prefer cost per answer (they unpack
// and pack; plain round_robin is BenchmarkShuffleInPlace).
func BenchmarkPolicy(b *testing.B) {
	_, n, _ := net.ParseCIDR("192.0.2.2/32")
	w, err := NewWeights(weightFile(b, "www.example.org\n192.0.2.3 7\n"), 0)
	if err != nil {
		b.Fatal(err)
	}
	orig := fourA(b, dns.TypeA)
	for _, tc := range []struct {
		name string
		p    *Policy
	}{{"prefer", &Policy{Prefer: []*net.IPNet{n}}}, {"weighted", &Policy{Weights: w}}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.p.Apply(orig)
			}
		})
	}
}
