package rewrite

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func TestCNAMERule(t *testing.T) {
	for _, c := range []struct {
		rules []string
		fail  bool // the lookup fails
		want  string
	}{
		{[]string{"cname target.test. new.test."}, false, "a.test. CNAME new.test. | new.test. A"},
		{[]string{"cname exact TARGET.test new.test"}, false, "a.test. CNAME new.test. | new.test. A"},
		{[]string{"cname prefix target. new."}, false, "a.test. CNAME new.test. | new.test. A"},
		{[]string{"cname suffix .test. .example."}, false, "a.test. CNAME target.example. | target.example. A"},
		{[]string{"cname substring get.te t.n"}, false, "a.test. CNAME tart.nst. | tart.nst. A"},
		{[]string{`cname regex ^(.*)\.test\.$ {1}.rx.`}, false, "a.test. CNAME target.rx. | target.rx. A"},
		{[]string{"cname other.test. new.test."}, false, "a.test. CNAME target.test. | target.test. A"},
		{[]string{"cname target.test. new.test."}, true, "a.test. CNAME target.test. | target.test. A"},
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
		h.Lookup = func(_ context.Context, name string, qtype uint16) (*dns.Msg, error) {
			if c.fail {
				return nil, errors.New("down")
			}
			m := new(dns.Msg)
			m.SetQuestion(name, qtype)
			rr, _ := dns.NewRR(name + " 60 IN A 10.0.0.2")
			m.Answer = []dns.RR{rr}
			return m, nil
		}
		r := new(dns.Msg)
		r.SetQuestion("a.test.", dns.TypeA)
		var seen string
		m, err := h.Serve(context.Background(), r, upstream(&seen))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rr := range m.Answer {
			f := strings.Fields(rr.String())
			s := f[0] + " " + f[3]
			if f[3] == "CNAME" {
				s += " " + f[4]
			}
			got = append(got, s)
		}
		if g := strings.Join(got, " | "); g != c.want {
			t.Errorf("%v: %s, want %s", c.rules, g, c.want)
		}
	}
}
