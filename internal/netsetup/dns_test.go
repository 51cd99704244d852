package netsetup

import (
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// answerA is what the test responder answers to every A query.
const answerA = "192.0.2.53"

// serveDNS answers every query on UDP and TCP at addr:port with answerA,
// until the test ends.
func serveDNS(t *testing.T, a netip.Addr, port int) {
	t.Helper()
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.ParseIP(answerA),
			})
		}
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

// dig queries server with dig(1) over UDP or TCP and returns the short answer.
func dig(t *testing.T, server netip.Addr, port int, tcp bool) string {
	t.Helper()
	args := []string{"@" + server.String(), "-p", strconv.Itoa(port), "+short", "+time=2", "+tries=1", "probe.nodelocaldns.test", "A"}
	if tcp {
		args = append(args, "+tcp")
	}
	return strings.TrimSpace(sh(t, "dig", args...))
}

// conntrackDNS returns the conntrack entries (IPv4 and IPv6) of flows to
// the DNS port in this namespace.
func conntrackDNS(t *testing.T, port int) []string {
	t.Helper()
	var entries []string
	for _, f := range []string{"ipv4", "ipv6"} {
		for line := range strings.Lines(stdout(t, "conntrack", "-L", "-f", f)) {
			if strings.Contains(line, " dport="+strconv.Itoa(port)+" ") {
				entries = append(entries, strings.TrimSpace(line))
			}
		}
	}
	return entries
}

// TestDNSWithoutConntrack serves DNS on the adopted link's addresses, dig
// queries them from the same namespace over UDP and TCP, and conntrack must
// hold no entry for those flows once the rules are in. A foreign rule
// matching on conntrack state (as a host firewall has) makes the namespace
// track connections; a control query before EnsureRules shows that
// conntrack does see this namespace's table.
func TestDNSWithoutConntrack(t *testing.T) {
	for _, backend := range []string{BackendLegacy, BackendNFT} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) {
				for _, tool := range []string{"dig", "conntrack"} {
					if _, err := exec.LookPath(tool); err != nil {
						t.Skipf("%s not installed: %v", tool, err)
					}
				}
				const port = 53
				addrs := []netip.Addr{testV4, testV6}
				adoptableLink(t, defaultInterfaceName)
				rec := &recorder{}
				s, err := New(Config{
					Addrs: addrs, Port: port, HealthPort: 8080, SetupInterface: true, SetupIPTables: true,
					Backend: backend, SyncInterval: time.Hour, Logger: testLogger(t), Observer: rec,
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.EnsureLink(t.Context()); err != nil {
					t.Fatal(err)
				}
				for _, a := range addrs {
					serveDNS(t, a, port)
				}
				for _, f := range []family{ipv4, ipv6} {
					sh(t, binary(backend, f), "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
				}

				// Control: without our rules the queries are tracked.
				for _, a := range addrs {
					if got := dig(t, a, port, false); got != answerA {
						t.Fatalf("dig @%s before rules = %q, want %s", a, got, answerA)
					}
				}
				control := conntrackDNS(t, port)
				if len(control) == 0 {
					t.Fatal("conntrack lists no DNS flow before the rules are in: it cannot see this namespace's table, so the check below would prove nothing")
				}
				sh(t, "conntrack", "-F", "-f", "ipv4")
				sh(t, "conntrack", "-F", "-f", "ipv6")

				if err := s.EnsureRules(t.Context()); err != nil {
					t.Fatal(err)
				}
				for _, a := range addrs {
					for _, tcp := range []bool{false, true} {
						if got := dig(t, a, port, tcp); got != answerA {
							t.Errorf("dig @%s tcp=%v = %q, want %s", a, tcp, got, answerA)
						}
					}
				}
				if left := conntrackDNS(t, port); len(left) != 0 {
					t.Errorf("conntrack entries for DNS with the rules in:\n%s", strings.Join(left, "\n"))
				}
				if err := s.Teardown(t.Context()); err != nil {
					t.Fatal(err)
				}
				rec.noErrors(t)
			})
		})
	}
}
