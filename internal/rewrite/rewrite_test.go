package rewrite

import (
	"context"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// upstream answers a CNAME to target.<zone> and its A record, as the
// question names it.
func upstream(seen *string) Next {
	return func(_ context.Context, r *dns.Msg) (*dns.Msg, error) {
		*seen = r.Question[0].Name
		m := new(dns.Msg)
		m.SetReply(r)
		n := r.Question[0].Name
		zone := n[strings.IndexByte(n, '.')+1:]
		c, _ := dns.NewRR(n + " 60 IN CNAME target." + zone)
		a, _ := dns.NewRR("target." + zone + " 60 IN A 10.0.0.1")
		m.Answer = []dns.RR{c, a}
		return m, nil
	}
}

func TestServe(t *testing.T) {
	for _, c := range []struct {
		rules    []string
		q        string
		upstream string // the name asked upstream
		answer   string // the records the client gets
	}{
		{[]string{"name exact a.test b.example"}, "A.test.", "b.example.", "a.test. CNAME target.example. | target.example. A"},
		{[]string{"name suffix .short. .example. answer auto"}, "x.short.", "x.example.", "x.short. CNAME target.short. | target.short. A"},
		{[]string{"name suffix .short. .example."}, "x.short.", "x.example.", "x.example. CNAME target.example. | target.example. A"},
		{[]string{`name regex ^(.*)\.rx\.$ {1}.example answer auto`}, "x.rx.", "x.example.", "x.rx. CNAME target.example. | target.example. A"},
		{[]string{`name regex ^(.*)\.rx\.$ {1}.example answer name ^(.*)\.example\.$ {1}.rx answer value ^(.*)\.example\.$ {1}.rx`}, "x.rx.", "x.example.", "x.rx. CNAME target.rx. | target.rx. A"},
		{[]string{"continue name exact a. b.", "name exact b. c.example"}, "a.", "c.example.", "a. CNAME target.example. | target.example. A"},
		{[]string{"name exact a. b.", "name exact b. c.example"}, "a.", "b.", "a. CNAME target. | target. A"},
		{[]string{"name exact other. b."}, "a.", "a.", "a. CNAME target. | target. A"},
	} {
		var rules []*Rule
		for _, s := range c.rules {
			r, err := ParseRule(strings.Fields(s))
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			rules = append(rules, r)
		}
		h := New(rules)
		r := new(dns.Msg)
		r.SetQuestion(c.q, dns.TypeA)
		var seen string
		m, err := h.Serve(context.Background(), r, upstream(&seen))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rr := range m.Answer {
			s := rr.Header().Name + " " + dns.TypeToString[rr.Header().Rrtype]
			if cn, ok := rr.(*dns.CNAME); ok {
				s += " " + cn.Target
			}
			got = append(got, s)
		}
		if seen != c.upstream || strings.Join(got, " | ") != c.answer || m.Question[0].Name != c.q || r.Question[0].Name != c.q {
			t.Errorf("%v %s: asked %s, got %q (question %s), want %s, %q", c.rules, c.q, seen, strings.Join(got, " | "), m.Question[0].Name, c.upstream, c.answer)
		}
	}
}

func TestParseRuleRefuses(t *testing.T) {
	for _, s := range []string{
		"", "stop", "answer name a b", "type A", "edns0 local set 0xffee {protocol}", "edns0 local frob 1 2", "edns0 bogus set 1 2", "edns0 local set x y", "edns0 local unset", "edns0 nsid set x", "edns0 subnet set 24 129", "cname a.", "cname frob a. b.", "cname regex ( b.", "name a", "name frob a b",
		"name regex ( a", "name regex ^a$ {1}", "name exact a b answer", "name exact a b answer auto answer name x y",
		"name regex (.*) {1} metadata", "name exact a b answer frob x y",
	} {
		if _, err := ParseRule(strings.Fields(s)); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// A type rule asks the rewritten type and answers under the question
// asked; a class rule likewise; other types pass unchanged.
func TestTypeRule(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		qtype     uint16
		wantAsked uint16
	}{
		{[]string{"type", "ANY", "HINFO"}, dns.TypeANY, dns.TypeHINFO},
		{[]string{"stop", "type", "aaaa", "a"}, dns.TypeAAAA, dns.TypeA},
		{[]string{"type", "ANY", "HINFO"}, dns.TypeA, dns.TypeA},
	} {
		r, err := ParseRule(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		h := New([]*Rule{r})
		q := new(dns.Msg)
		q.SetQuestion("www.example.org.", tc.qtype)
		var asked uint16
		m, err := h.Serve(context.Background(), q, func(_ context.Context, r *dns.Msg) (*dns.Msg, error) {
			asked = r.Question[0].Qtype
			a := new(dns.Msg)
			a.SetReply(r)
			return a, nil
		})
		if err != nil || asked != tc.wantAsked || m.Question[0].Qtype != tc.qtype {
			t.Errorf("%v: asked %d, answered question %v, err %v", tc.args, asked, m.Question, err)
		}
	}
	for _, bad := range [][]string{{"type", "A"}, {"type", "FOO", "A"}, {"class", "IN", "XX"}, {"cname", "a."}} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
