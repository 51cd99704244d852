package dropin

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestLoadbalanceParityWithCoreDNS: `loadbalance` shuffles the A, AAAA
// and MX records of a block's answers, cache hits included (CoreDNS's
// loadbalance sits before its cache), over UDP and TCP, as CoreDNS 1.15
// does: the same records, CNAMEs first, several orders; a block without
// it answers in one order.
func TestLoadbalanceParityWithCoreDNS(t *testing.T) {
	up := serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		q := r.Question[0]
		add := func(s string) {
			rr, _ := dns.NewRR(s)
			m.Answer = append(m.Answer, rr)
		}
		switch q.Qtype {
		case dns.TypeA:
			if strings.HasPrefix(q.Name, "alias") {
				add(q.Name + " 300 IN CNAME multi.example.net.")
			}
			for i := 1; i <= 4; i++ {
				add(fmt.Sprintf("multi.example.net. 300 IN A 192.0.2.%d", i))
			}
		case dns.TypeMX:
			for i := 1; i <= 3; i++ {
				add(fmt.Sprintf("%s 300 IN MX %d mx%d.example.net.", q.Name, i*10, i))
				rr, _ := dns.NewRR(fmt.Sprintf("mx%d.example.net. 300 IN A 192.0.2.%d", i, 20+i))
				m.Extra = append(m.Extra, rr)
			}
		}
		_ = w.WriteMsg(m)
	}))
	corefile := `example.org:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . ` + up + `
}
.:%[1]d {
    bind 127.0.0.1
    loadbalance round_robin
    cache 30
    forward . ` + up + `
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true)
	for _, tc := range []struct {
		name     string
		qtype    uint16
		net      string
		shuffled bool
	}{
		{"multi.example.net.", dns.TypeA, "udp", true},
		{"alias.example.net.", dns.TypeA, "tcp", true},
		{"mail.example.net.", dns.TypeMX, "udp", true},
		{"multi.example.org.", dns.TypeA, "udp", false},
	} {
		for _, a := range []string{aOurs, aCore} {
			orders := map[string]bool{}
			var set []string
			for range 30 {
				m := new(dns.Msg)
				m.SetQuestion(tc.name, tc.qtype)
				c := &dns.Client{Net: tc.net, Timeout: 3 * time.Second}
				r, _, err := c.Exchange(m, a)
				if err != nil {
					t.Fatal(err)
				}
				var rrs []string
				for _, rr := range r.Answer {
					rr.Header().Ttl = 0
					rrs = append(rrs, rr.String())
				}
				if strings.HasPrefix(tc.name, "alias") && !strings.Contains(rrs[0], "CNAME") {
					t.Errorf("%s @%s: the CNAME is not first: %v", tc.name, a, rrs)
				}
				orders[strings.Join(rrs, "|")] = true
				slices.Sort(rrs)
				if set == nil {
					set = rrs
				} else if !slices.Equal(set, rrs) {
					t.Errorf("%s @%s: records changed: %v, then %v", tc.name, a, set, rrs)
				}
			}
			if tc.shuffled != (len(orders) > 1) {
				t.Errorf("%s %s @%s: %d orders in 30 answers, shuffled %v", tc.name, tc.net, a, len(orders), tc.shuffled)
			}
		}
	}
}
