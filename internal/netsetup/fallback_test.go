package netsetup

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fallbackRules is the fallback's rule set for one address and DNS port as
// iptables-save prints it, written out independently of rulesFor: %[1]s is
// the address with its prefix length, %[2]d the DNS port, %[3]s the
// address alone, %[4]s the gate's mask, %[5]s the socket match, %[6]s the
// address's DNAT chain, %[7]s the gate's table.
var fallbackRules = []struct{ table, line string }{
	{"raw", `-A PREROUTING -d %[1]s -p tcp -m tcp --dport %[2]d %[5]s -m recent --rcheck --seconds 2 --name %[7]s --mask %[4]s --rdest -m comment --comment "nodelocaldns: skip conntrack while serving" -j NOTRACK`},
	{"raw", `-A PREROUTING -d %[1]s -p udp -m udp --dport %[2]d %[5]s -m recent --rcheck --seconds 2 --name %[7]s --mask %[4]s --rdest -m comment --comment "nodelocaldns: skip conntrack while serving" -j NOTRACK`},
	{"filter", `-A INPUT -d %[1]s -p tcp -m tcp --dport %[2]d %[5]s -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`},
	{"filter", `-A INPUT -d %[1]s -p udp -m udp --dport %[2]d %[5]s -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`},
	{"filter", `-A INPUT -d %[1]s -p tcp -m tcp --dport %[2]d -m comment --comment "nodelocaldns: no socket, drop rather than refuse" -j DROP`},
	{"filter", `-A INPUT -d %[1]s -p udp -m udp --dport %[2]d -m comment --comment "nodelocaldns: no socket, drop rather than refuse" -j DROP`},
	{"raw", `-A OUTPUT -s %[1]s -p tcp -m tcp --sport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`},
	{"raw", `-A OUTPUT -s %[1]s -p udp -m udp --sport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`},
	{"filter", `-A OUTPUT -s %[1]s -p tcp -m tcp --sport %[2]d -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`},
	{"filter", `-A OUTPUT -s %[1]s -p udp -m udp --sport %[2]d -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`},
	{"raw", `-A OUTPUT -d %[1]s -p tcp -m tcp --dport %[2]d -m recent --rcheck --seconds 2 --name %[7]s --mask %[4]s --rdest -m comment --comment "nodelocaldns: skip conntrack while serving" -j NOTRACK`},
	{"raw", `-A OUTPUT -d %[1]s -p udp -m udp --dport %[2]d -m recent --rcheck --seconds 2 --name %[7]s --mask %[4]s --rdest -m comment --comment "nodelocaldns: skip conntrack while serving" -j NOTRACK`},
	{"filter", `-A OUTPUT -m conntrack --ctstate NEW --ctorigdst %[3]s --ctorigdstport %[2]d -m comment --comment "nodelocaldns: fallback count"`},
	{"filter", `-A FORWARD -m conntrack --ctstate NEW --ctorigdst %[3]s --ctorigdstport %[2]d -m comment --comment "nodelocaldns: fallback count"`},
	{"nat", `-A PREROUTING -d %[1]s -p tcp -m tcp --dport %[2]d -m comment --comment "nodelocaldns: fallback to kube-dns" -j %[6]s`},
	{"nat", `-A PREROUTING -d %[1]s -p udp -m udp --dport %[2]d -m comment --comment "nodelocaldns: fallback to kube-dns" -j %[6]s`},
	{"nat", `-A OUTPUT -d %[1]s -p tcp -m tcp --dport %[2]d -m comment --comment "nodelocaldns: fallback to kube-dns" -j %[6]s`},
	{"nat", `-A OUTPUT -d %[1]s -p udp -m udp --dport %[2]d -m comment --comment "nodelocaldns: fallback to kube-dns" -j %[6]s`},
	{"nat", `-A POSTROUTING -s %[1]s -m conntrack --ctstate DNAT --ctorigdst %[3]s --ctorigdstport %[2]d -m comment --comment "nodelocaldns: fallback from the host" -j MASQUERADE`},
}

// expectedFallbackRules lists the rules a family's save output must hold
// with the fallback on (FallbackAfter 2 s), health port 8080.
func expectedFallbackRules(addrs []netip.Addr, f family, port int, wildcardOnly bool) []tableLine {
	var out []tableLine
	for _, a := range addrs {
		if familyOf(a) != f {
			continue
		}
		mask, socket, table := "255.255.255.255", "-m socket", fmt.Sprintf("nodelocaldns-%d", port)
		if a.Is6() {
			mask, table = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", fmt.Sprintf("nodelocaldns6-%d", port)
		}
		if wildcardOnly {
			socket += " --nowildcard"
		}
		for _, r := range fallbackRules {
			out = append(out, tableLine{r.table, fmt.Sprintf(r.line, netip.PrefixFrom(a, a.BitLen()), port, a, mask, socket, fallbackChain(a), table)})
		}
		for _, r := range stockRules {
			if r.health {
				out = append(out, tableLine{r.table, fmt.Sprintf(r.line, netip.PrefixFrom(a, a.BitLen()), port, 8080)})
			}
		}
	}
	return out
}

func TestFallbackRulesFor(t *testing.T) {
	for _, fam := range testFamilies {
		for _, wild := range []bool{false, true} {
			c := &Config{Addrs: fam.addrs, Port: 53, HealthPort: 8080, FallbackAfter: 2 * time.Second}
			if wild {
				c.WildcardOnly = fam.addrs
			}
			got := map[tableLine]int{}
			for _, r := range rulesFor(c) {
				got[tableLine{r.Table, r.saveLine()}]++
				if r.Append != (r.Table == "nat" && r.Chain != "POSTROUTING") {
					t.Errorf("%s: Append=%v", r, r.Append)
				}
			}
			var want []tableLine
			for _, f := range []family{ipv4, ipv6} {
				want = append(want, expectedFallbackRules(fam.addrs, f, 53, wild)...)
			}
			for _, w := range want {
				if got[w] != 1 {
					t.Errorf("%s wildcard=%v: %s -t %s listed %d times", fam.name, wild, w.line, w.table, got[w])
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s wildcard=%v: %d rules, want %d", fam.name, wild, len(got), len(want))
			}
		}
	}
	if _, err := New(Config{Addrs: []netip.Addr{testV4}, FallbackAfter: 1500 * time.Millisecond}); err == nil {
		t.Error("FallbackAfter 1.5s accepted: the kernel counts whole seconds")
	}
	if _, err := New(Config{Addrs: []netip.Addr{testV4}, FallbackAfter: 2 * time.Minute}); err == nil {
		t.Error("FallbackAfter 2m accepted")
	}
}

func TestSplitRuleAndWords(t *testing.T) {
	w, err := splitRule(`-A KUBE-SEP-X -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.5:53`)
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != 14 || w[7] != "kube-system/kube-dns:dns" {
		t.Errorf("splitRule = %q", w)
	}
	if got := ruleWords(`-A X -d 10.96.0.10/32 -p udp -m comment --comment "a b" -j KUBE-SVC-Y`); got["-d"] != "10.96.0.10/32" || got["--comment"] != "a b" || got["-j"] != "KUBE-SVC-Y" {
		t.Errorf("ruleWords = %v", got)
	}
}

// serveAnswer answers every A query at a:port, UDP and TCP, with answer.
func serveAnswer(t *testing.T, a netip.Addr, port int, answer string) {
	t.Helper()
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A:   net.ParseIP(answer),
		})
		_ = w.WriteMsg(m)
	})
	ap := netip.AddrPortFrom(a, uint16(port)).String()
	pc, err := net.ListenPacket("udp", ap)
	if err != nil {
		t.Fatalf("bind udp %s: %v", ap, err)
	}
	ln, err := net.Listen("tcp", ap)
	if err != nil {
		t.Fatalf("bind tcp %s: %v", ap, err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
}

// TestFallbackLifecycle, for both backends and both families: an older
// version's unconditional rules are replaced by the fallback's, each rule
// is there once, the DNAT chains follow SetFallback, the gate opens and
// closes, and from the namespace itself (a host-network client) a query
// goes to our socket while the gate is open and to "kube-dns" (a DNAT
// target) while it is closed, counted; teardown leaves the rule set as it
// was.
func TestFallbackLifecycle(t *testing.T) {
	for _, backend := range []string{BackendLegacy, BackendNFT} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) { testFallbackLifecycle(t, backend) })
		})
	}
}

func testFallbackLifecycle(t *testing.T, backend string) {
	const port = 53
	addrs := []netip.Addr{testV4, testV6}
	kubeDNS := []netip.Addr{netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("fd00:99::2")}
	adoptableLink(t, defaultInterfaceName)
	sh(t, "ip", "link", "set", defaultInterfaceName, "up")
	for _, a := range kubeDNS {
		sh(t, "ip", "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo", "nodad")
	}
	addForeignRules(t, backend, addrs)
	for _, f := range []family{ipv4, ipv6} {
		sh(t, binary(backend, f), "-t", "nat", "-A", "PREROUTING", "-p", "udp", "--dport", "9999", "-j", "RETURN")
		sh(t, binary(backend, f), "-t", "filter", "-A", "FORWARD", "-p", "udp", "--dport", "9999", "-j", "ACCEPT")
	}
	before := snapshot(t)
	// An older version's rules (the stock set, with our comments), and an
	// instance's with another health port.
	for _, r := range rulesFor(&Config{Addrs: addrs, Port: port, HealthPort: 8080}) {
		sh(t, binary(backend, r.family()), append([]string{"-t", r.Table, "-A", r.Chain}, r.Spec...)...)
	}
	for _, r := range rulesFor(&Config{Addrs: addrs, Port: port, HealthPort: 9090, FallbackAfter: 3 * time.Second}) {
		if !r.Append { // the jumps need the chains
			sh(t, binary(backend, r.family()), append([]string{"-t", r.Table, "-A", r.Chain}, r.Spec...)...)
		}
	}
	s, err := New(Config{
		Addrs: addrs, Port: port, HealthPort: 8080, SetupInterface: true, SetupIPTables: true,
		Backend: backend, SyncInterval: time.Hour, LockWait: 2 * time.Second, FallbackAfter: 2 * time.Second,
		Logger: testLogger(t), Observer: &recorder{},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.EnsureLink(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		serveAnswer(t, a, port, "192.0.2.1") // the cache
	}
	for _, a := range kubeDNS {
		serveAnswer(t, a, port, "192.0.2.2") // kube-dns
	}
	if err := s.EnsureRules(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range []family{ipv4, ipv6} {
		tables := parseSave(saveOf(t, backend, f))
		want := expectedFallbackRules(addrs, f, port, false)
		n := 0
		for _, lines := range tables {
			for _, l := range lines {
				if strings.Contains(l, "nodelocaldns") {
					n++
				}
			}
		}
		for _, w := range want {
			c := 0
			for _, l := range tables[w.table] {
				if l == w.line {
					c++
				}
			}
			if c != 1 {
				t.Errorf("%s: %d copies of %s", binary(backend, f), c, w.line)
			}
		}
		if n != len(want) {
			t.Errorf("%s: %d rules name nodelocaldns, want %d (the older version's not deleted?)", binary(backend, f), n, len(want))
		}
	}

	// Nothing known yet: the gate is closed and the chains empty: a
	// query from here reaches our socket only once the gate opens.
	fb := Fallback{UDP: []netip.AddrPort{netip.AddrPortFrom(kubeDNS[0], port), netip.AddrPortFrom(kubeDNS[1], port)}}
	fb.TCP = fb.UDP
	if err := s.SetFallback(ctx, fb); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if got := sh(t, binary(backend, familyOf(a)), "-t", "nat", "-S", fallbackChain(a)); strings.Count(got, "-j DNAT") != 2 {
			t.Errorf("chain of %s:\n%s", a, got)
		}
	}
	ask := func(want string) {
		t.Helper()
		for _, a := range addrs {
			for _, tcp := range []bool{false, true} {
				if got := dig(t, a, port, tcp); got != want {
					t.Errorf("dig @%s tcp=%v = %q, want %s", a, tcp, got, want)
				}
			}
		}
	}
	ask("192.0.2.2")
	if err := s.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if got := s.GateOpen(); !slices.Equal(got, addrs) {
		t.Errorf("gate entries %v, want %v", got, addrs)
	}
	ask("192.0.2.1")
	if err := s.CloseGate(); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseGate(); err != nil {
		t.Errorf("closing a closed gate: %v", err)
	}
	if got := s.GateOpen(); len(got) != 0 {
		t.Errorf("gate entries after CloseGate: %v", got)
	}
	ask("192.0.2.2")
	counts, err := s.FallbackCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		// Two rounds of a UDP query and a TCP connection each.
		if c := counts[a]; c.Host != 4 || c.Pods != 0 {
			t.Errorf("counts of %s = %+v, want 4 from the host", a, c)
		}
	}
	// A Service's address: its chain empties (kube-proxy's rules apply).
	fb.Services = []netip.Addr{testV4}
	if err := s.SetFallback(ctx, fb); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, binary(backend, ipv4), "-t", "nat", "-S", fallbackChain(testV4)); strings.Contains(got, "DNAT") {
		t.Errorf("chain of a Service's address:\n%s", got)
	}
	if got := s.FallbackTargets(); got[testV4] != "kube-proxy" || !strings.Contains(got[testV6], "fd00:99::2") {
		t.Errorf("FallbackTargets = %v", got)
	}

	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Teardown(tctx); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t); after != before {
		t.Errorf("rule set after teardown differs from before setup:\n--- before\n%s\n--- after\n%s", before, after)
	}
}
