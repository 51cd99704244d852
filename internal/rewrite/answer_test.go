package rewrite

import (
	"context"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// answerOf applies the rules' answer side to an answer of q with the
// upstream's rcode and records (TTL 300, SOA 600 in authority).
func answerOf(t *testing.T, rules []string, q string, qtype uint16, rcode int, recs ...string) *dns.Msg {
	t.Helper()
	var rs []*Rule
	for _, s := range rules {
		r, err := ParseRule(strings.Fields(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		rs = append(rs, r)
	}
	m := new(dns.Msg)
	m.SetQuestion(q, qtype)
	m.Response, m.Rcode = true, rcode
	for _, s := range recs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		if rr.Header().Rrtype == dns.TypeSOA {
			m.Ns = append(m.Ns, rr)
		} else {
			m.Answer = append(m.Answer, rr)
		}
	}
	m.SetEdns0(1232, true)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	a := Answers(rs)
	out := m
	if a != nil {
		out = new(dns.Msg)
		if err := out.Unpack(a.Apply(b)); err != nil {
			t.Fatal(err)
		}
	}
	if o := out.IsEdns0(); o == nil || !o.Do() || o.UDPSize() != 1232 {
		t.Errorf("%v %s: OPT changed: %v", rules, q, o)
	}
	return out
}

func TestAnswerRules(t *testing.T) {
	a300 := "a.test. 300 IN A 10.0.0.1"
	for _, c := range []struct {
		rules []string
		q     string
		rcode int
		recs  []string
		want  string // rcode, then each record's TTL
	}{
		{[]string{"ttl a.test 30"}, "a.test.", 0, []string{a300}, "NOERROR 30"},
		{[]string{"ttl A.Test. 30"}, "A.TEST.", 0, []string{a300}, "NOERROR 30"},
		{[]string{"ttl b.test 30"}, "a.test.", 0, []string{a300}, "NOERROR 300"},
		{[]string{"ttl prefix a. 10-100"}, "a.test.", 0, []string{a300}, "NOERROR 100"},
		{[]string{"ttl suffix .test 400-"}, "a.test.", 0, []string{a300}, "NOERROR 400"},
		{[]string{"ttl substring tes -20"}, "a.test.", 0, []string{a300}, "NOERROR 300"}, // "tes." (CoreDNS normalizes it)
		{[]string{"ttl substring test -20"}, "a.test.", 0, []string{a300}, "NOERROR 20"},
		{[]string{`ttl regex ^a\.t 0-1000`}, "a.test.", 0, []string{a300}, "NOERROR 300"},
		{[]string{"ttl exact a.test 5"}, "a.test.", 3, []string{"test. 600 IN SOA ns.test. h.test. 1 2 3 4 600"}, "NXDOMAIN 5"},
		{[]string{"rcode nx.test NXDOMAIN REFUSED"}, "nx.test.", 3, []string{"test. 600 IN SOA ns.test. h.test. 1 2 3 4 600"}, "REFUSED 600"},
		{[]string{"rcode nx.test 3 5"}, "nx.test.", 3, nil, "REFUSED"},
		{[]string{"rcode suffix .test SERVFAIL NOERROR"}, "x.test.", 2, nil, "NOERROR"},
		{[]string{"rcode suffix .test SERVFAIL NOERROR"}, "x.test.", 3, nil, "NXDOMAIN"},
		// Chained: the reverse order per record, as CoreDNS's reverter.
		{[]string{"continue rcode s.test SERVFAIL NXDOMAIN", "rcode s.test NXDOMAIN REFUSED"}, "s.test.", 2, nil, "NXDOMAIN"},
		{[]string{"continue rcode s.test SERVFAIL NXDOMAIN", "rcode s.test NXDOMAIN REFUSED"}, "s.test.", 2, []string{"s.test. 300 IN A 10.0.0.1", "s.test. 300 IN A 10.0.0.2"}, "REFUSED 300 300"},
		// The name the ttl rule sees is the one earlier rules wrote;
		// a stop ends the walk.
		{[]string{"continue name exact a.test b.test", "ttl b.test 7"}, "a.test.", 0, []string{a300}, "NOERROR 7"},
		{[]string{"name exact a.test b.test", "ttl b.test 7"}, "a.test.", 0, []string{a300}, "NOERROR 300"},
		{[]string{"ttl a.test 7", "ttl a.test 9"}, "a.test.", 0, []string{a300}, "NOERROR 7"},
		{[]string{"continue ttl a.test 7", "ttl a.test 9"}, "a.test.", 0, []string{a300}, "NOERROR 7"},
		{[]string{"type A AAAA", "ttl a.test 9"}, "a.test.", 0, []string{a300}, "NOERROR 300"},
		{[]string{"type MX AAAA", "ttl a.test 9"}, "a.test.", 0, []string{a300}, "NOERROR 9"},
		// An extended rcode: repacked.
		{[]string{"rcode a.test NOERROR 16"}, "a.test.", 0, []string{a300}, "BADSIG 300"},
	} {
		m := answerOf(t, c.rules, c.q, dns.TypeA, c.rcode, c.recs...)
		got := []string{dns.RcodeToString[m.Rcode]}
		for _, sec := range [][]dns.RR{m.Answer, m.Ns} {
			for _, rr := range sec {
				got = append(got, strings.Fields(rr.String())[1])
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%v %s: got %s, want %s", c.rules, c.q, g, c.want)
		}
	}
}

func TestAnswerRulesParse(t *testing.T) {
	for _, bad := range []string{
		"ttl a.test", "ttl a.test x", "ttl a.test -", "ttl a.test 5-3", "ttl a.test 1-2-3", "ttl a.test 4294967296",
		"ttl bogus a.test 5", "ttl exact a.test 5 6", "ttl regex ( 5",
		"rcode a.test NXDOMAIN", "rcode a.test NXDOMAIN NOPE", "rcode a.test 24 0", "rcode bogus a.test 1 2",
	} {
		if _, err := ParseRule(strings.Fields(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	for _, good := range []string{"ttl a.test 5", "ttl a.test 5-", "ttl a.test -5", "stop ttl regex .* 0-10", "continue rcode a.test 23 NOERROR"} {
		if _, err := ParseRule(strings.Fields(good)); err != nil {
			t.Errorf("%s: %v", good, err)
		}
	}
	// Without ttl or rcode rules, no answer side.
	r, _ := ParseRule(strings.Fields("name exact a.test b.test"))
	if Answers([]*Rule{r}) != nil {
		t.Error("a name rule alone has an answer side")
	}
}

// TestAnswerRuleStopsFetchSide: a matching ttl rule with stop ends the
// walk on the fetch side too (the name rule after it is not applied).
func TestAnswerRuleStopsFetchSide(t *testing.T) {
	var rules []*Rule
	for _, s := range []string{"ttl a.test 5", "name exact a.test b.test"} {
		r, err := ParseRule(strings.Fields(s))
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	for q, want := range map[string]string{"a.test.": "a.test.", "A.Test.": "A.Test."} {
		r := new(dns.Msg)
		r.SetQuestion(q, dns.TypeA)
		var seen string
		if _, err := New(rules).Serve(context.Background(), r, upstream(&seen)); err != nil {
			t.Fatal(err)
		}
		if seen != want {
			t.Errorf("%s asked as %s, want %s", q, seen, want)
		}
	}
}
