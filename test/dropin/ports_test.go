package dropin

import (
	"bufio"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// requestSeries lists the coredns_dns_requests_total series of the
// /metrics at addr by server, zone, proto and type, with their counts.
func requestSeries(t *testing.T, addr string) []string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	label := func(l, name string) string {
		m := regexp.MustCompile(name + `="([^"]*)"`).FindStringSubmatch(l)
		if m == nil {
			return ""
		}
		return m[1]
	}
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "coredns_dns_requests_total{") {
			continue
		}
		out = append(out, fmt.Sprintf("%s zone=%s proto=%s type=%s %s", label(l, "server"), label(l, "zone"), label(l, "proto"), label(l, "type"), l[strings.LastIndexByte(l, ' ')+1:]))
	}
	slices.Sort(out)
	return out
}

// A server key on another port (kubespray's external zones): the same
// answers on both ports as CoreDNS 1.15 (the key's zone on its own port,
// the other keys' on theirs, REFUSED where no block is), and the request
// counters under the same server labels (dns://ADDRESS:PORT per socket).
func TestServerKeyOnAnotherPortParityWithCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	second := map[int]int{} // each main port's second port
	tw := startTwins(t, func(p int, kube, node, stub, health, metrics string) string {
		p2 := testhost.FreePort(t, "127.0.0.1")
		second[p] = p2
		return fmt.Sprintf(`cluster.local:%[1]d {
    cache 30
    bind 127.0.0.1
    forward . %[6]s {
        force_tcp
    }
    prometheus %[5]s
}
ext.example:%[1]d other.example:%[2]d {
    cache 5
    bind 127.0.0.1
    forward . %[4]s
    prometheus %[5]s
}
.:%[1]d {
    cache 30
    bind 127.0.0.1
    forward . %[3]s
    prometheus %[5]s
}
`, p, p2, node, stub, metrics, kube)
	})
	port := func(a string) int {
		var p int
		fmt.Sscanf(a[strings.LastIndexByte(a, ':')+1:], "%d", &p)
		return p
	}
	pOurs, pCore := port(tw.aOurs), port(tw.aCore)
	waitDNS(t, fmt.Sprintf("127.0.0.1:%d", second[pOurs]))
	waitDNS(t, fmt.Sprintf("127.0.0.1:%d", second[pCore]))
	for _, q := range []struct {
		onSecond bool
		name     string
		qtype    uint16
	}{
		{false, "www.ext.example.", dns.TypeA},
		{false, "www.other.example.", dns.TypeA},
		{false, "www.example.org.", dns.TypeA},
		{false, "web.default.svc.cluster.local.", dns.TypeA},
		{true, "web.default.svc.cluster.local.", dns.TypeA},
		{true, "www.other.example.", dns.TypeA},
		{true, "nx1.other.example.", dns.TypeA},
		{true, "www.ext.example.", dns.TypeA},
		{true, "www.example.org.", dns.TypeA},
	} {
		for round := range 2 {
			ao, ac := tw.aOurs, tw.aCore
			if q.onSecond {
				ao, ac = fmt.Sprintf("127.0.0.1:%d", second[pOurs]), fmt.Sprintf("127.0.0.1:%d", second[pCore])
			}
			o, c := ask(t, ao, q.name, q.qtype), ask(t, ac, q.name, q.qtype)
			key := fmt.Sprintf("%s %s second port %v round %d", q.name, dns.TypeToString[q.qtype], q.onSecond, round)
			if o.rcode != c.rcode || strings.Join(o.rrs, "|") != strings.Join(c.rrs, "|") {
				t.Errorf("%s: ours %s %v, coredns %s %v", key, o.rcode, o.rrs, c.rcode, c.rrs)
			}
			for i := range min(len(o.ttls), len(c.ttls)) {
				if d := int(o.ttls[i]) - int(c.ttls[i]); d < -1 || d > 1 {
					t.Errorf("%s: TTLs ours %v coredns %v", key, o.ttls, c.ttls)
					break
				}
			}
		}
	}
	norm := func(series []string, p, p2 int) string {
		r := strings.NewReplacer(fmt.Sprintf(":%d ", p), ":PORT ", fmt.Sprintf(":%d ", p2), ":PORT2 ")
		var out []string
		for _, s := range series {
			out = append(out, r.Replace(s))
		}
		slices.Sort(out)
		return strings.Join(out, "\n")
	}
	so, sc := norm(requestSeries(t, tw.mOurs), pOurs, second[pOurs]), norm(requestSeries(t, tw.mCore), pCore, second[pCore])
	if so != sc || !strings.Contains(so, "dns://127.0.0.1:PORT2 zone=other.example.") {
		t.Errorf("coredns_dns_requests_total:\n ours\n%s\n coredns\n%s", so, sc)
	}
}
