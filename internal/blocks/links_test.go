package blocks

import (
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// A forward takes the names under its FROM but not under its except, FROM
// itself always (CoreDNS's match); it hands on an answer whose rcode next
// lists, and NOERROR without answer records with next_on_nodata.
func TestForwardTakesAndHandsOn(t *testing.T) {
	f := &corefile.Forward{From: "example.org.", Except: []string{"example.org.", "skip.example.org."}, Next: []int{dns.RcodeNameError}, NextOnNodata: true}
	for name, want := range map[string]bool{
		"example.org.":        true, // FROM itself, though excepted
		"www.example.org.":    false,
		"a.skip.example.org.": false,
		"example.net.":        false,
		"xexample.org.":       false,
	} {
		if got := takes(f, name); got != want {
			t.Errorf("takes %s: %v, want %v", name, got, want)
		}
	}
	g := &corefile.Forward{From: "."}
	if !takes(g, "anything.example.") {
		t.Error(". does not take a name")
	}
	a, _ := dns.NewRR("x.example.org. 60 IN A 192.0.2.1")
	for _, tc := range []struct {
		rcode int
		rrs   []dns.RR
		want  bool
	}{
		{dns.RcodeNameError, nil, true},
		{dns.RcodeServerFailure, nil, false},
		{dns.RcodeSuccess, nil, true},
		{dns.RcodeSuccess, []dns.RR{a}, false},
	} {
		m := &dns.Msg{Answer: tc.rrs}
		m.Rcode = tc.rcode
		if got := handsOn(f, m); got != tc.want {
			t.Errorf("rcode %s, %d answers: hands on %v, want %v", dns.RcodeToString[tc.rcode], len(tc.rrs), got, tc.want)
		}
		if handsOn(g, m) {
			t.Errorf("a forward without next hands on rcode %s", dns.RcodeToString[tc.rcode])
		}
	}
}
