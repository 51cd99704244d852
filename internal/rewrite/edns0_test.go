package rewrite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// optsOf is the options of r's OPT as code:data.
func optsOf(r *dns.Msg) string {
	o := r.IsEdns0()
	if o == nil {
		return "no OPT"
	}
	var out []string
	for _, e := range o.Option {
		if _, ok := e.(*dns.EDNS0_LOCAL); ok {
			out = append(out, e.String()) // code:0xdata
			continue
		}
		out = append(out, fmt.Sprintf("%d:%s", e.Option(), e.String()))
	}
	return strings.Join(out, " ")
}

func TestEdns0Rules(t *testing.T) {
	for _, c := range []struct {
		rules  []string
		client string
		want   string
	}{
		{[]string{"edns0 local set 0xffee abc"}, "10.1.2.3", "65518:0x616263"},
		{[]string{"edns0 local set 0xffee 0xabcd"}, "10.1.2.3", "65518:0xabcd"},
		{[]string{"continue edns0 local set 0xffee {qname}", "edns0 local append 0xffef {qtype}"}, "10.1.2.3", "65518:0x612e746573742e 65519:0x0001"},
		{[]string{"edns0 local set 0xffee {client_ip}"}, "10.1.2.3", "65518:0x0a010203"},
		{[]string{"edns0 local set 0xffee {client_ip}"}, "", ""},
		{[]string{"edns0 local set 0xffee {client_ip}"}, "fd00::1", "65518:0xfd000000000000000000000000000001"},
		{[]string{"edns0 subnet set 24 56"}, "10.1.2.3", "8:10.1.2.0/24/0"},
		{[]string{"edns0 subnet set 24 56"}, "fd00:1:2:3::1", "8:[fd00:1:2::]/56/0"},
		{[]string{"edns0 nsid set"}, "10.1.2.3", "3:"},
		{[]string{"edns0 local replace 0xffee x"}, "10.1.2.3", ""},
		{[]string{"continue edns0 local set 0xffee x", "continue edns0 local replace 0xffee y", "edns0 local append 0xffee z"}, "", "65518:0x79 65518:0x7a"},
		{[]string{"continue edns0 local set 0xffee x", "continue edns0 nsid append", "edns0 local unset 0xffee"}, "", "3:"},
		// stop: the second is not applied.
		{[]string{"edns0 local set 0xffee x", "edns0 local set 0xffef y"}, "", "65518:0x78"},
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
		h.Asker = func(context.Context) netip.Addr {
			a, _ := netip.ParseAddr(c.client)
			return a
		}
		q := new(dns.Msg)
		q.SetQuestion("a.test.", dns.TypeA)
		q.SetEdns0(1232, false)
		var got string
		_, err := h.Serve(context.Background(), q, func(_ context.Context, r *dns.Msg) (*dns.Msg, error) {
			got = optsOf(r)
			m := new(dns.Msg)
			m.SetReply(r)
			return m, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%v from %q: upstream got %q, want %q", c.rules, c.client, got, c.want)
		}
	}
}

// TestEdns0WalkAgrees: the answer side's walk (which decides whether a
// ttl rule after edns0 rules is reached) and the fetch side's agree for
// random lists of edns0 rules.
func TestEdns0WalkAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	forms := []string{
		"edns0 local set 0xffee x", "edns0 local replace 0xffee x", "edns0 local append 0xffee x", "edns0 local unset 0xffee",
		"edns0 local set 0xffee {qname}", "edns0 local replace 0xffee {client_ip}", "edns0 local append 0xffee {qtype}",
		"edns0 nsid set", "edns0 nsid replace", "edns0 nsid append", "edns0 nsid unset",
		"edns0 subnet set 24 56", "edns0 subnet replace 24 56", "edns0 subnet append 24 56", "edns0 subnet unset",
		"edns0 local append 8 x",
	}
	for i := 0; i < 2000; i++ {
		var rules []*Rule
		for range 1 + rng.IntN(4) {
			mode := []string{"continue ", "stop ", ""}[rng.IntN(3)]
			r, err := ParseRule(strings.Fields(mode + forms[rng.IntN(len(forms))]))
			if err != nil {
				t.Fatal(err)
			}
			rules = append(rules, r)
		}
		var desc []string
		for _, r := range rules {
			desc = append(desc, r.String())
		}
		for _, s := range []string{"continue name exact a.test b.test", "ttl b.test 5"} {
			r, _ := ParseRule(strings.Fields(s))
			rules = append(rules, r)
		}
		h := New(rules)
		h.Asker = func(context.Context) netip.Addr { return netip.MustParseAddr("10.0.0.1") }
		q := new(dns.Msg)
		q.SetQuestion("a.test.", dns.TypeA)
		q.SetEdns0(1232, false)
		var asked string
		if _, err := h.Serve(context.Background(), q, func(_ context.Context, r *dns.Msg) (*dns.Msg, error) {
			asked = r.Question[0].Name
			m := new(dns.Msg)
			m.SetReply(r)
			return m, nil
		}); err != nil {
			t.Fatal(err)
		}
		a := answerOf(t, nil, "a.test.", dns.TypeA, 0, "a.test. 300 IN A 10.0.0.1")
		b, _ := a.Pack()
		m := new(dns.Msg)
		if err := m.Unpack(Answers(rules).Apply(b)); err != nil {
			t.Fatal(err)
		}
		fetchReached, answerReached := asked == "b.test.", m.Answer[0].Header().Ttl == 5
		if fetchReached != answerReached {
			t.Fatalf("%v: fetch side reached the end %v, answer side %v", desc, fetchReached, answerReached)
		}
	}
}
