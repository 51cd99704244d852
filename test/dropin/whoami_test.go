package dropin

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// whoamiAsk asks m over network (udp or tcp) from a socket of its own and
// returns the answer and the socket's port.
func whoamiAsk(t *testing.T, network, addr string, m *dns.Msg) (*dns.Msg, int) {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	co := &dns.Conn{Conn: c}
	if err := co.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	r, err := co.ReadMsg()
	if err != nil {
		t.Fatalf("%s %s: %v", network, m.Question[0].Name, err)
	}
	_, p, _ := net.SplitHostPort(c.LocalAddr().String())
	port, _ := strconv.Atoi(p)
	return r, port
}

// whoamiShape is what is compared of an answer: the header bits (AA and
// RA only of a whoami answer: nodelocaldns never sets AA and always RA on
// the others, as docs/migration.md says), the sections (the SRV's port replaced by PORT
// once checked against want, the client's port; -1: not a whoami answer;
// 0: a whoami answer whose client port is not known) and the OPT.
func whoamiShape(t *testing.T, who string, r *dns.Msg, want int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(dns.RcodeToString[r.Rcode])
	for _, f := range []struct {
		on bool
		n  string
	}{{r.Authoritative && want >= 0, " aa"}, {r.RecursionAvailable && want >= 0, " ra"}, {r.Truncated, " tc"}, {r.RecursionDesired, " rd"}} {
		if f.on {
			b.WriteString(f.n)
		}
	}
	for _, rr := range append(append(slices.Clone(r.Answer), r.Ns...), r.Extra...) {
		switch x := rr.(type) {
		case *dns.OPT:
			b.WriteString(" | OPT do=" + strconv.FormatBool(x.Do()))
		case *dns.SRV:
			if want > 0 && int(x.Port) != want {
				t.Errorf("%s: SRV port %d, the client's is %d", who, x.Port, want)
			}
			c := *x
			c.Port = 0
			b.WriteString(" | " + strings.Replace(c.String(), " 0 .", " PORT .", 1))
		default:
			b.WriteString(" | " + rr.String())
		}
	}
	return b.String()
}

// TestWhoamiParityWithCoreDNS: a block with whoami answers as CoreDNS
// 1.15's: NOERROR, AA and not RA, no answer records, the client's address
// under the name as asked and an SRV of its port under _udp. or _tcp. in
// the additional section, TTL 0, for every type, over UDP and TCP, with
// and without EDNS; the other blocks forward as before, and the log lines
// are the same; beside a forward answering every name of its block,
// whoami is never reached. Each client gets its own port: with cache in the block too
// (ours never caches whoami; CoreDNS's cache keeps the first client's
// answer 5 s and gives it to the next client, as docs/migration.md says).
func TestWhoamiParityWithCoreDNS(t *testing.T) {
	corefile := `who.example:%[1]d {
    bind 127.0.0.1
    log
    whoami
}
cached.example:%[1]d {
    bind 127.0.0.1
    cache 30
    whoami
}
shadow.example:%[1]d {
    bind 127.0.0.1
    whoami
    forward . %[2]s
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[2]s
}
`
	aOurs, aCore, lo, lc := pair(t, corefile, true)
	id := uint16(3000)
	// x.shadow.example: forward answers first, whoami is never reached.
	for _, name := range []string{"Who.EXAMPLE.", "a.b.who.example.", "www.example.org.", "x.shadow.example."} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeMX, dns.TypeTXT} {
			for _, network := range []string{"udp", "tcp"} {
				for _, edns := range []bool{false, true} {
					m := new(dns.Msg)
					m.SetQuestion(name, qtype)
					id++
					m.Id = id
					if edns {
						m.SetEdns0(1232, true)
					}
					who := name + " " + dns.TypeToString[qtype] + " " + network + " edns=" + strconv.FormatBool(edns)
					ro, po := whoamiAsk(t, network, aOurs, m)
					rc, pc := whoamiAsk(t, network, aCore, m)
					wo, wc := -1, -1
					if strings.HasSuffix(strings.ToLower(name), "who.example.") {
						wo, wc = po, pc
					}
					if o, c := whoamiShape(t, who+" (ours)", ro, wo), whoamiShape(t, who+" (coredns)", rc, wc); o != c {
						t.Errorf("%s:\nours    %s\ncoredns %s", who, o, c)
					}
				}
			}
		}
	}
	// Two clients in turn, the block caching: ours answers each its own
	// port; CoreDNS the first's to both.
	m := new(dns.Msg)
	m.SetQuestion("x.cached.example.", dns.TypeA)
	for i, addr := range []string{aOurs, aCore} {
		r1, p1 := whoamiAsk(t, "udp", addr, m)
		r2, p2 := whoamiAsk(t, "udp", addr, m)
		if len(r1.Extra) != 2 || len(r2.Extra) != 2 {
			t.Fatalf("cached block: %v %v", r1, r2)
		}
		s1, s2 := int(r1.Extra[1].(*dns.SRV).Port), int(r2.Extra[1].(*dns.SRV).Port)
		if i == 0 && (s1 != p1 || s2 != p2) {
			t.Errorf("ours with cache: ports %d %d, the clients' %d %d", s1, s2, p1, p2)
		}
		if i == 1 && (s1 != p1 || s2 != p1) {
			t.Logf("CoreDNS with cache no longer serves the first client's answer to the second (ports %d %d, clients %d %d): docs/migration.md says it does", s1, s2, p1, p2)
		}
	}
	time.Sleep(300 * time.Millisecond)
	o, c := queryLines(lo.String()), queryLines(lc.String())
	slices.Sort(o)
	slices.Sort(c)
	if !slices.Equal(o, c) || len(c) < 16 {
		t.Errorf("query log lines differ:\nours:\n%s\ncoredns:\n%s", strings.Join(o, "\n"), strings.Join(c, "\n"))
	}
}

// TestWhoamiParityWithStockNodeCache: the reference manifest's Corefile
// with Gardener's kind of whoami block added, run by the stock node-cache
// and by nodelocaldns in network namespaces: the same whoami answers
// (the client's port masked: each query has its own) for every variant of
// query, and the rest answered as before.
func TestWhoamiParityWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock := stockBinary(t)
	ours := buildNodelocaldns(t)
	corefile := referenceCorefile(t, false) + "who.example:53 {\n    errors\n    bind 169.254.20.10 10.96.0.10\n    whoami\n}\n"
	nsStock, _ := oracleNamespace(t)
	nsOurs, _ := oracleNamespace(t)
	startReferenceCorefile(t, nsStock, stock, corefile, "-setupiptables=false")
	startReferenceCorefile(t, nsOurs, ours, corefile, "-setupiptables=false")
	n := 0
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"Who.Example.", dns.TypeA}, {"a.who.example.", dns.TypeAAAA}, {"a.who.example.", dns.TypeSRV}, {"www.example.org.", dns.TypeA},
	} {
		for _, v := range variants {
			rs, err := exchange(nsStock, q.name, q.qtype, v)
			if err != nil {
				t.Fatalf("stock %s %s: %v", q.name, v.name, err)
			}
			ro, err := exchange(nsOurs, q.name, q.qtype, v)
			if err != nil {
				t.Fatalf("ours %s %s: %v", q.name, v.name, err)
			}
			want := -1
			if strings.HasSuffix(strings.ToLower(q.name), "who.example.") {
				want, n = 0, n+1
			}
			who := q.name + " " + dns.TypeToString[q.qtype] + " " + v.name
			if s, o := whoamiShape(t, who+" (stock)", rs, want), whoamiShape(t, who+" (ours)", ro, want); s != o {
				t.Errorf("%s:\nstock %s\nours  %s", who, s, o)
			}
		}
	}
	if n == 0 {
		t.Fatal("no whoami question asked")
	}
}
