package rwanswer

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func ttlStep(name string, lo, hi uint32, stop bool) Step {
	return Step{Kind: TTL, Stop: stop, Min: lo, Max: hi, Match: func(q string) bool { return q == name }}
}

func rcodeStep(name string, from, to uint16, stop bool) Step {
	return Step{Kind: Rcode, Stop: stop, From: from, To: to, Match: func(q string) bool { return q == name }}
}

func packAnswer(t testing.TB, q string, rcode int, recs ...string) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(q, dns.TypeA)
	m.Response, m.Rcode = true, rcode
	for _, s := range recs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	m.SetEdns0(1232, true)
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNilWithoutAnswerRules(t *testing.T) {
	if New(nil) != nil || New([]Step{{Kind: Name, Rename: func(s string) (string, bool) { return s, false }}}) != nil {
		t.Fatal("rules without ttl or rcode are not nil")
	}
	var r *Rules
	b := packAnswer(t, "a.test.", 0, "a.test. 300 IN A 10.0.0.1")
	if got := r.Apply(b); !bytes.Equal(got, b) {
		t.Fatal("nil rules changed the answer")
	}
}

// TestWireAndMessageAgree: the in-place path gives what the repacking
// path (CoreDNS's way, on a dns.Msg) gives, for random answers.
func TestWireAndMessageAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rules := New([]Step{
		{Kind: Name, Stop: false, Rename: func(s string) (string, bool) { return strings.Replace(s, "x", "y", 1), strings.Contains(s, "x") }},
		ttlStep("ay.test.", 10, 100, false),
		rcodeStep("ay.test.", 0, 3, false),
		rcodeStep("ay.test.", 3, 5, false),
		ttlStep("b.test.", 0, 0, true),
	})
	for i := 0; i < 500; i++ {
		q := []string{"ax.test.", "b.test.", "c.test."}[rng.IntN(3)]
		var recs []string
		for range rng.IntN(4) {
			recs = append(recs, q+" "+[]string{"0", "5", "50", "500", "4000000000"}[rng.IntN(5)]+" IN A 10.0.0.1")
		}
		b := packAnswer(t, q, rng.IntN(6), recs...)
		var buf [maxActs]*Step
		acts := rules.match(b, buf[:0])
		slow := applyMsg(bytes.Clone(b), acts)
		fast := bytes.Clone(b)
		if !applyWire(fast, acts) {
			t.Fatalf("%s: not applied in place", q)
		}
		ms, mf := new(dns.Msg), new(dns.Msg)
		if err := ms.Unpack(slow); err != nil {
			t.Fatal(err)
		}
		if err := mf.Unpack(fast); err != nil {
			t.Fatal(err)
		}
		if ms.String() != mf.String() {
			t.Fatalf("in place:\n%s\nrepacked:\n%s", mf, ms)
		}
	}
}

// TestHostileAnswers: truncated and corrupted answers are returned
// unchanged or rewritten within their bounds, never a panic.
func TestHostileAnswers(t *testing.T) {
	rules := New([]Step{ttlStep("a.test.", 1, 2, false), rcodeStep("a.test.", 0, 16, true)})
	b := packAnswer(t, "a.test.", 0, "a.test. 300 IN A 10.0.0.1", "a.test. 300 IN A 10.0.0.2")
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		c := bytes.Clone(b)
		switch i % 3 {
		case 0:
			c = c[:rng.IntN(len(c))]
		case 1:
			c[rng.IntN(len(c))] = byte(rng.Uint32())
		default:
			c = append(c, byte(rng.Uint32()))
		}
		_ = rules.Apply(c)
	}
}

func TestApplyAllocations(t *testing.T) {
	rules := New([]Step{ttlStep("a.test.", 30, 30, true)})
	b := packAnswer(t, "a.test.", 0, "a.test. 300 IN A 10.0.0.1")
	if n := testing.AllocsPerRun(100, func() { rules.Apply(b) }); n > 1 {
		t.Fatalf("%v allocations per answer, want at most 1 (the name as text)", n)
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil || m.Answer[0].Header().Ttl != 30 {
		t.Fatalf("%v %v", m, err)
	}
}

func BenchmarkApply(b *testing.B) {
	rules := New([]Step{ttlStep("a.test.", 30, 30, true)})
	ans := packAnswer(b, "a.test.", 0, "a.test. 300 IN A 10.0.0.1", "a.test. 300 IN A 10.0.0.2")
	b.ReportAllocs()
	for b.Loop() {
		rules.Apply(ans)
	}
}
