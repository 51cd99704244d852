package dns64

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// RFC 6052 §2.4's table: 192.0.2.33 in each prefix length.
func TestEmbed(t *testing.T) {
	v4 := netip.MustParseAddr("192.0.2.33")
	for p, want := range map[string]string{
		"2001:db8::/32":         "2001:db8:c000:221::",
		"2001:db8:100::/40":     "2001:db8:1c0:2:21::",
		"2001:db8:122::/48":     "2001:db8:122:c000:2:2100::",
		"2001:db8:122:300::/56": "2001:db8:122:3c0:0:221::",
		"2001:db8:122:344::/64": "2001:db8:122:344:c0:2:2100:0",
		"2001:db8:122:344::/96": "2001:db8:122:344::192.0.2.33",
		"64:ff9b::/96":          "64:ff9b::192.0.2.33",
	} {
		pp, err := ParsePrefix(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := Embed(pp, v4); got != netip.MustParseAddr(want) {
			t.Errorf("%s: %s, want %s", p, got, want)
		}
	}
	for _, bad := range []string{"10.0.0.0/8", "2001:db8::/33", "x"} {
		if _, err := ParsePrefix(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestServe(t *testing.T) {
	soa, _ := dns.NewRR("example. 300 IN SOA ns. host. 1 2 3 4 5")
	aaaa, _ := dns.NewRR("has6.example. 60 IN AAAA 2001:db8::1")
	next := func(_ context.Context, r *dns.Msg) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetReply(r)
		switch r.Question[0].Name {
		case "nx.example.":
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{soa}
		case "has6.example.":
			m.Answer = []dns.RR{aaaa}
		default:
			m.Ns = []dns.RR{soa}
		}
		return m, nil
	}
	lookups := 0
	lookup := func(_ context.Context, name string, qtype uint16) (*dns.Msg, error) {
		lookups++
		if qtype != dns.TypeA {
			return nil, errors.New("not A")
		}
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		a, _ := dns.NewRR(name + " 900 IN A 192.0.2.33")
		m.Answer = []dns.RR{a}
		return m, nil
	}
	h := New(Config{}, lookup)
	var reported atomic.Uint64
	h.Report(&reported)
	for name, want := range map[string]string{
		"v4.example.":   "v4.example.\t300\tIN\tAAAA\t64:ff9b::c000:221",
		"has6.example.": "has6.example.\t60\tIN\tAAAA\t2001:db8::1",
		"nx.example.":   "NXDOMAIN",
	} {
		r := new(dns.Msg)
		r.SetQuestion(name, dns.TypeAAAA)
		m, err := h.Serve(context.Background(), r, next)
		if err != nil {
			t.Fatal(err)
		}
		got := dns.RcodeToString[m.Rcode]
		if len(m.Answer) == 1 {
			got = m.Answer[0].String()
		}
		if got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	if lookups != 1 || h.Stats.Translated.Load() != 1 || reported.Load() != 1 {
		t.Errorf("lookups %d translated %d", lookups, h.Stats.Translated.Load())
	}
	// translate_all replaces existing AAAA records.
	h = New(Config{TranslateAll: true}, lookup)
	r := new(dns.Msg)
	r.SetQuestion("has6.example.", dns.TypeAAAA)
	m, err := h.Serve(context.Background(), r, next)
	if err != nil || len(m.Answer) != 1 || m.Answer[0].(*dns.AAAA).AAAA.String() != "64:ff9b::c000:221" {
		t.Fatalf("translate_all: %v %v", err, m)
	}
}
