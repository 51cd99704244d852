package dropin

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestLogReloadWithCoreDNS: a Corefile edit that adds `log` to a block,
// changes its classes or removes it applies on reload, as CoreDNS 1.15's
// reload plugin applies it: the log rules are the block's, in the block
// table a reload swaps whole. After each edit has taken effect in both,
// the same queries log the same lines.
func TestLogReloadWithCoreDNS(t *testing.T) {
	corefile := func(log string) string {
		return `cluster.local:%[1]d {
    bind 127.0.0.1
    reload 2s 1s
    cache 30
    forward . %[3]s
}
.:%[1]d {
    bind 127.0.0.1
    reload 2s 1s
` + log + `    cache 30
    forward . %[2]s
}
`
	}
	aOurs, aCore, lo, lc, rewrite := pairConf(t, corefile(""), true)
	id := uint16(2000)
	// settled asks a fresh name (never cached: every ask a miss; nx
	// names are NXDOMAIN, others an address) until both servers log it
	// as want says.
	settled := func(step, nx string, want bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; ; i++ {
			name := fmt.Sprintf("%sprobe-%s-%d.example.com.", nx, step, i)
			id++
			q := logQuery{name: name, qtype: dns.TypeA, net: "udp"}
			q.ask(t, aOurs, id)
			q.ask(t, aCore, id)
			time.Sleep(100 * time.Millisecond)
			o, c := strings.Contains(lo.String(), name), strings.Contains(lc.String(), name)
			if o == want && c == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s logged by ours %v, by CoreDNS %v; want %v", step, name, o, c, want)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	queries := []logQuery{
		{name: "www.example.org.", qtype: dns.TypeA, net: "udp", edns: true},
		{name: "nx.example.org.", qtype: dns.TypeA, net: "tcp"},
		{name: "web.default.svc.cluster.local.", qtype: dns.TypeA, net: "udp"},
	}
	round := func(step string) (o, c []string) {
		t.Helper()
		mark, markC := len(lo.String()), len(lc.String())
		for _, q := range queries {
			id++
			q.ask(t, aOurs, id)
			q.ask(t, aCore, id)
		}
		time.Sleep(300 * time.Millisecond)
		o, c = queryLines(lo.String()[mark:]), queryLines(lc.String()[markC:])
		o = slices.DeleteFunc(o, func(l string) bool { return strings.Contains(l, "probe-") })
		c = slices.DeleteFunc(c, func(l string) bool { return strings.Contains(l, "probe-") })
		slices.Sort(o)
		slices.Sort(c)
		if !slices.Equal(o, c) {
			t.Errorf("%s: query log lines differ:\nours:\n%s\ncoredns:\n%s", step, strings.Join(o, "\n"), strings.Join(c, "\n"))
		}
		return o, c
	}
	settled("before", "", false)
	if _, c := round("before"); len(c) != 0 {
		t.Fatalf("CoreDNS logged without log: %v", c)
	}

	rewrite(corefile("    log\n"))
	settled("added", "", true)
	if _, c := round("added"); len(c) != 2 { // the "." block's two names, not the cluster's
		t.Errorf("after adding log CoreDNS logged %d lines: %v", len(c), c)
	}

	rewrite(corefile("    log . {\n        class denial\n    }\n"))
	settled("denial", "", false) // a success is no longer logged
	if _, c := round("denial"); len(c) != 1 {
		t.Errorf("with class denial CoreDNS logged %d lines: %v", len(c), c)
	}

	rewrite(corefile(""))
	settled("removed", "nx", false) // a denial is no longer logged
	if _, c := round("removed"); len(c) != 0 {
		t.Errorf("after removing log CoreDNS logged %v", c)
	}
}
