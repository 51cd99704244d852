package dropin

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// aclAsk asks name over network from the local address from, with EDNS
// (size 1232, DO as given) or without, and returns what is compared of
// the answer: "no answer" when none came (a drop), else the rcode, the
// records (TTLs apart) and, for an answer with an Extended DNS Error (an
// acl's own), the header flags and the OPT too.
func aclAsk(t *testing.T, addr, network, from, name string, qtype uint16, edns, do bool) string {
	t.Helper()
	var local net.Addr = &net.UDPAddr{IP: net.ParseIP(from)}
	if network == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c := &dns.Client{Net: network, Timeout: 700 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: local, Timeout: time.Second}}
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(1232, do)
	}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return "no answer"
		}
		if network == "tcp" && strings.Contains(err.Error(), "EOF") {
			return "no answer"
		}
		t.Fatalf("%s %s over %s from %s @%s: %v", name, dns.TypeToString[qtype], network, from, addr, err)
	}
	var b strings.Builder
	b.WriteString(dns.RcodeToString[r.Rcode])
	var opt *dns.OPT
	for _, rr := range slices.Concat(r.Answer, r.Ns, r.Extra) {
		if o, ok := rr.(*dns.OPT); ok {
			opt = o
			continue
		}
		rr.Header().Ttl = 0
		b.WriteString(" | " + strings.ToLower(rr.String()))
	}
	if opt != nil && slices.ContainsFunc(opt.Option, func(o dns.EDNS0) bool { return o.Option() == dns.EDNS0EDE }) {
		fmt.Fprintf(&b, " | flags qr=%v aa=%v tc=%v rd=%v ra=%v ad=%v cd=%v", r.Response, r.Authoritative, r.Truncated, r.RecursionDesired, r.RecursionAvailable, r.AuthenticatedData, r.CheckingDisabled)
		fmt.Fprintf(&b, " | OPT size=%d do=%v", opt.UDPSize(), opt.Do())
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				fmt.Fprintf(&b, " EDE=%d %q", e.InfoCode, e.ExtraText)
			}
		}
	}
	return b.String()
}

// TestACLParityWithCoreDNS: a block's acl refuses (REFUSED, EDE Blocked),
// empties (NOERROR, EDE Filtered), drops (no answer) or lets pass the
// queries of its zones by the client's address and the query type, the
// first rule whose zones hold the name and one of whose policies matches
// deciding, as CoreDNS 1.15's acl: the same answers (header, records and
// OPT) from both servers, over UDP and TCP, with and without EDNS, hits
// and misses (acl runs before the cache: a refused client never gets the
// cached answer another client's question put there).
func TestACLParityWithCoreDNS(t *testing.T) {
	ours, core, _ := runDirectiveParity(t, `meta.example:%[1]d {
    bind 127.0.0.1
    acl {
        block net 127.0.0.9
        filter type AAAA TXT net 127.0.0.10/31
        drop net 127.0.0.12
        allow net 127.0.0.13 127.0.0.14
        block
    }
    cache 30
    forward . %[2]s
}
open.example:%[1]d {
    bind 127.0.0.1
    acl corp.open.example {
        allow type A net 127.0.0.9
        block type A MX
    }
    acl {
        filter type TXT
        drop type * net 127.0.0.12
    }
    cache 30
    forward . %[2]s
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[2]s
}
`, []directiveCase{
		{"www.example.org.", dns.TypeA},
		{"a.open.example.", dns.TypeA},
		{"a.meta.example.", dns.TypeA}, // from 127.0.0.1: the last policy blocks it
	}, nil)
	type q struct {
		name     string
		qtype    uint16
		from     string
		edns, do bool
	}
	var cases []q
	for _, from := range []string{"127.0.0.1", "127.0.0.9", "127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13"} {
		for _, c := range []struct {
			name  string
			qtype uint16
		}{
			{"a.meta.example.", dns.TypeA}, {"a.meta.example.", dns.TypeAAAA}, {"b.meta.example.", dns.TypeTXT},
			{"x.corp.open.example.", dns.TypeA}, {"x.corp.open.example.", dns.TypeMX}, {"y.open.example.", dns.TypeTXT},
			{"y.open.example.", dns.TypeA}, {"www.example.org.", dns.TypeA},
		} {
			cases = append(cases, q{c.name, c.qtype, from, false, false})
		}
	}
	cases = append(cases, q{"a.meta.example.", dns.TypeA, "127.0.0.9", true, false}, q{"a.meta.example.", dns.TypeA, "127.0.0.9", true, true},
		q{"b.meta.example.", dns.TypeTXT, "127.0.0.10", true, true}, q{"A.Meta.Example.", dns.TypeA, "127.0.0.9", true, false})
	for _, network := range []string{"udp", "tcp"} {
		for _, c := range cases {
			for round := 0; round < 2; round++ { // a miss (or an acl answer), then a hit
				o := aclAsk(t, ours, network, c.from, c.name, c.qtype, c.edns, c.do)
				k := aclAsk(t, core, network, c.from, c.name, c.qtype, c.edns, c.do)
				if o != k {
					t.Errorf("%s %s over %s from %s (edns %v do %v) round %d:\n ours    %s\n coredns %s", c.name, dns.TypeToString[c.qtype], network, c.from, c.edns, c.do, round, o, k)
				}
			}
		}
	}
	// What the rules did, as the cases above expect it (so a parity of two
	// equal mistakes cannot pass).
	for _, w := range []struct {
		name  string
		qtype uint16
		from  string
		want  string
	}{
		{"a.meta.example.", dns.TypeA, "127.0.0.9", "REFUSED"},
		{"a.meta.example.", dns.TypeAAAA, "127.0.0.10", "NOERROR | flags"},
		{"a.meta.example.", dns.TypeA, "127.0.0.12", "no answer"},
		{"a.meta.example.", dns.TypeA, "127.0.0.13", "NOERROR | a.meta.example.\t0\tin\ta\t93.184.216.34"},
		{"x.corp.open.example.", dns.TypeA, "127.0.0.9", "NOERROR | x.corp.open.example.\t0\tin\ta"},
		{"x.corp.open.example.", dns.TypeA, "127.0.0.1", "REFUSED"},
		{"y.open.example.", dns.TypeTXT, "127.0.0.1", "NOERROR | flags"},
		{"y.open.example.", dns.TypeA, "127.0.0.12", "no answer"},
		{"www.example.org.", dns.TypeA, "127.0.0.12", "NOERROR | www.example.org."},
	} {
		if got := aclAsk(t, ours, "udp", w.from, w.name, w.qtype, false, false); !strings.HasPrefix(got, w.want) {
			t.Errorf("%s %s from %s: %q, want %q...", w.name, dns.TypeToString[w.qtype], w.from, got, w.want)
		}
	}
}

// acl refuses what CoreDNS's grammar refuses, each error one line naming
// file and line; acl beside rewrite is refused (CoreDNS's acl sees the
// rewritten name, ours the name asked).
func TestACLErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := buildNodelocaldns(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	checkConfig := func(text string) string {
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command(bin, "-check-config", "-localip", "127.0.0.1", "-conf", conf, "-basecorefile", filepath.Join(dir, "none"),
			"-kubednscm=", "-kube-dns", "127.0.0.1:9", "-setupinterface=false", "-setupiptables=false", "-state-dir=").CombinedOutput()
		return string(out)
	}
	for _, tc := range []struct{ body, want string }{
		{"acl {\n  permit net 10.0.0.0/8\n}", ":3: acl: unexpected token \"permit\"; expect 'allow', 'block', 'filter' or 'drop'"},
		{"acl {\n  block net\n}", ":3: acl: no token specified in \"net\" section"},
		{"acl {\n  block net 10.0.0.0/33\n}", ":3: acl: illegal CIDR notation \"10.0.0.0/33\""},
		{"acl {\n  block type FOO\n}", ":3: acl: unexpected token \"FOO\"; expect legal QTYPE"},
		{"acl {\n  block from 10.0.0.1\n}", ":3: acl: unexpected token \"from\"; expect 'type | net'"},
		{"acl\n  rewrite name exact a.example b.example", ":1: acl with rewrite in the same block is not supported"},
	} {
		out := checkConfig(".:53 {\n" + tc.body + "\n  forward . 127.0.0.1\n}\n")
		if !strings.Contains(out, tc.want) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
			t.Errorf("%q: %q, want one line containing %q", tc.body, out, tc.want)
		}
	}
}
