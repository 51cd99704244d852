package dropin

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
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

// TestLoadbalanceWeightedAndPreferParityWithCoreDNS: `loadbalance weighted
// FILE` puts one address drawn by the file's weights first (the rest in
// place; A, AAAA and SRV answers only), the file read again on a change;
// `prefer CIDR...` puts the addresses of each subnet in turn first after
// the shuffle. Both are asked the same questions as CoreDNS 1.15: the same
// set of orders appears, and the weighted tops come at the same rates.
func TestLoadbalanceWeightedAndPreferParityWithCoreDNS(t *testing.T) {
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
			for i := 1; i <= 4; i++ {
				add(fmt.Sprintf("%s 300 IN A 192.0.2.%d", q.Name, i))
			}
		case dns.TypeMX:
			for i := 1; i <= 2; i++ {
				add(fmt.Sprintf("%s 300 IN MX %d mx%d.example.net.", q.Name, i*10, i))
				rr, _ := dns.NewRR(fmt.Sprintf("mx%d.example.net. 300 IN A 192.0.2.%d", i, 20+i))
				m.Extra = append(m.Extra, rr)
			}
		}
		_ = w.WriteMsg(m)
	}))
	weights := filepath.Join(t.TempDir(), "weights")
	writeWeights := func(s string) {
		if err := os.WriteFile(weights+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(weights+".tmp", weights); err != nil {
			t.Fatal(err)
		}
	}
	writeWeights("# weights\nmulti.weighted.example\n192.0.2.1 6\n192.0.2.2 2\n\nother.weighted.example.\n192.0.2.4 200\n")
	corefile := `weighted.example:%[1]d {
    bind 127.0.0.1
    loadbalance weighted ` + weights + ` {
        reload 1s
    }
    cache 30
    forward . ` + up + `
}
prefer.example:%[1]d {
    bind 127.0.0.1
    loadbalance {
        prefer 192.0.2.3/32 192.0.2.0/30
        prefer 192.0.2.20/30
    }
    cache 30
    forward . ` + up + `
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . ` + up + `
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true)
	// answers asks n times and returns how often each order came.
	answers := func(addr, name string, qtype uint16, n int) map[string]int {
		orders := map[string]int{}
		for i := range n {
			m := new(dns.Msg)
			m.SetQuestion(name, qtype)
			c := &dns.Client{Net: []string{"udp", "tcp"}[i%2], Timeout: 3 * time.Second}
			r, _, err := c.Exchange(m, addr)
			if err != nil {
				t.Fatal(err)
			}
			var rrs []string
			for _, rr := range append(r.Answer, r.Extra...) {
				switch rr := rr.(type) {
				case *dns.A:
					rrs = append(rrs, rr.A.String())
				case *dns.MX:
					rrs = append(rrs, rr.Mx)
				}
			}
			orders[strings.Join(rrs, " ")]++
		}
		return orders
	}
	keys := func(m map[string]int) []string {
		k := slices.Collect(maps.Keys(m))
		slices.Sort(k)
		return k
	}
	for _, tc := range []struct {
		name   string
		qtype  uint16
		n      int
		orders int
	}{
		{"multi.weighted.example.", dns.TypeA, 200, 4},
		{"unweighted.weighted.example.", dns.TypeA, 200, 4},
		{"mail.weighted.example.", dns.TypeMX, 20, 1},
		{"multi.prefer.example.", dns.TypeA, 60, 2},
		{"mail.prefer.example.", dns.TypeMX, 80, 4},
	} {
		o, c := answers(aOurs, tc.name, tc.qtype, tc.n), answers(aCore, tc.name, tc.qtype, tc.n)
		if !slices.Equal(keys(o), keys(c)) || len(o) != tc.orders {
			t.Errorf("%s %s: orders differ (want %d):\nours     %v\ncoredns  %v", tc.name, dns.TypeToString[tc.qtype], tc.orders, o, c)
		}
		if tc.name == "multi.weighted.example." {
			// .1 weighs 6 of 10: first in 60% of the answers.
			for who, m := range map[string]map[string]int{"ours": o, "coredns": c} {
				if f := float64(m["192.0.2.1 192.0.2.2 192.0.2.3 192.0.2.4"]) / float64(tc.n); f < 0.45 || f > 0.75 {
					t.Errorf("%s: 192.0.2.1 first in %.0f%% of the answers, want ~60%%: %v", who, 100*f, m)
				}
			}
		}
	}
	// The file changes: within its reload both weigh .4 at 255 to 1.
	writeWeights("multi.weighted.example\n192.0.2.4 255\n")
	time.Sleep(3 * time.Second)
	answers(aOurs, "multi.weighted.example.", dns.TypeA, 2) // the first answer after the interval starts our read
	time.Sleep(200 * time.Millisecond)
	for who, a := range map[string]string{"ours": aOurs, "coredns": aCore} {
		m := answers(a, "multi.weighted.example.", dns.TypeA, 50)
		if n := m["192.0.2.4 192.0.2.2 192.0.2.3 192.0.2.1"]; n < 40 {
			t.Errorf("%s after the weight file changed: 192.0.2.4 first in %d of 50: %v", who, n, m)
		}
	}
}

// TestLoadbalanceWeightedAndPreferWithStockNodeCache: the stock
// node-cache (CoreDNS 1.13 inside) takes `loadbalance { prefer ... }` and
// `loadbalance weighted FILE`; both binaries, with the reference
// manifest's Corefile so extended, order the same answers alike: the
// preferred subnets' addresses first, in the subnets' order, and the
// weighted top address at the same rate.
func TestLoadbalanceWeightedAndPreferWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock := stockBinary(t)
	ours := buildNodelocaldns(t)
	corefile := referenceCorefile(t, false)
	// The cluster domain's block prefers two subnets; the "." block
	// weighs chain.example.org's edge addresses.
	corefile = strings.Replace(corefile, "    errors\n", "    errors\n    loadbalance round_robin {\n        prefer 10.244.0.5/32 10.244.0.0/30\n    }\n", 1)
	i := strings.Index(corefile, ".:53 {")
	corefile = corefile[:i] + strings.Replace(corefile[i:], "    errors\n", "    errors\n    loadbalance weighted /etc/coredns/weights {\n        reload 0s\n    }\n", 1)
	etc := map[string]string{"coredns/Corefile.base": corefile, "coredns/weights": "b.edge.example.net\n198.51.100.2 9\n"}
	args := []string{"-localip", oracleLocal + ",10.96.0.10", "-conf", "/etc/Corefile", "-upstreamsvc", "kube-dns-upstream", "-setupiptables=false"}
	for who, bin := range map[string]string{"stock": stock, "ours": ours} {
		ns, _ := oracleNamespace(t)
		d := startIn(t, ns, bin, etc, args)
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := exchange(ns, "web.default.svc.cluster.local.", dns.TypeA, variant{name: "udp"}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not answer within 30s:\n%s", who, d.logs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		firsts, heads := map[string]bool{}, map[string]bool{}
		for range 40 {
			r, err := exchange(ns, "headless40.default.svc.cluster.local.", dns.TypeA, variant{name: "tcp", net: "tcp"})
			if err != nil || len(r.Answer) != 40 {
				t.Fatalf("%s: %v %v", who, r, err)
			}
			var head []string
			for _, rr := range r.Answer[1:4] {
				head = append(head, rr.(*dns.A).A.String())
			}
			slices.Sort(head)
			firsts[r.Answer[0].(*dns.A).A.String()] = true
			heads[strings.Join(head, " ")] = true
		}
		if !maps.Equal(firsts, map[string]bool{"10.244.0.5": true}) || !maps.Equal(heads, map[string]bool{"10.244.0.1 10.244.0.2 10.244.0.3": true}) {
			t.Errorf("%s: prefer: first addresses %v, then %v; want 10.244.0.5, then 10.244.0.1-3", who, firsts, heads)
		}
		top := 0
		for range 100 {
			r, err := exchange(ns, "chain.example.org.", dns.TypeA, variant{name: "udp"})
			if err != nil {
				t.Fatalf("%s: %v", who, err)
			}
			for _, rr := range r.Answer {
				if a, ok := rr.(*dns.A); ok {
					if a.A.String() == "198.51.100.2" {
						top++
					}
					break
				}
			}
		}
		// 9 of 10: 198.51.100.2 first in about 90 of 100 answers.
		if top < 75 {
			t.Errorf("%s: weighted: 198.51.100.2 first in %d of 100 answers, want about 90", who, top)
		}
		t.Logf("%s: 198.51.100.2 first in %d of 100 weighted answers", who, top)
	}
}
