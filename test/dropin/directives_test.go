package dropin

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fullAnswer is a whole answer compared with CoreDNS's: rcode and the
// records of each section (TTLs apart, owner names without case), sorted
// within a section, and the TTLs in the same order.
type fullAnswer struct {
	rcode             string
	answer, ns, extra []string
	answerTTL, nsTTL  []uint32
}

func askFull(t *testing.T, addr, name string, qtype uint16) fullAnswer {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	c := &dns.Client{Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s @%s: %v", name, dns.TypeToString[qtype], addr, err)
	}
	a := fullAnswer{rcode: dns.RcodeToString[r.Rcode]}
	sec := func(rrs []dns.RR, ttls *[]uint32) []string {
		var out []string
		sort.SliceStable(rrs, func(i, j int) bool { return rrs[i].String() < rrs[j].String() })
		for _, rr := range rrs {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			if ttls != nil {
				*ttls = append(*ttls, rr.Header().Ttl)
			}
			rr.Header().Ttl = 0
			out = append(out, strings.ToLower(rr.String()))
		}
		sort.Strings(out)
		return out
	}
	a.answer = sec(r.Answer, &a.answerTTL)
	a.ns = sec(r.Ns, &a.nsTTL)
	a.extra = sec(r.Extra, nil)
	return a
}

func (a fullAnswer) String() string {
	return fmt.Sprintf("%s answer %v authority %v additional %v", a.rcode, a.answer, a.ns, a.extra)
}

// directiveCase is one question asked of both servers, twice (miss, hit).
type directiveCase struct {
	name  string
	qtype uint16
}

// runDirectiveParity starts nodelocaldns and CoreDNS 1.15 with corefile
// (a format string taking the DNS port as %[1]d and the upstream as
// %[2]s) and compares their answers to cases.
func runDirectiveParity(t *testing.T, corefile string, cases []directiveCase, files map[string]string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	ours, coredns := buildNodelocaldns(t), buildCoreDNS(t)
	up, kube := upstream(t, "93.184.216.34"), upstream(t, "10.96.1.1")
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	corefile = strings.ReplaceAll(corefile, "DIR", dir)
	pOurs, pCore := freePort(t), freePort(t)
	confOurs, confCore := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "coredns.Corefile")
	for f, p := range map[string]int{confOurs: pOurs, confCore: pCore} {
		if err := os.WriteFile(f, []byte(fmt.Sprintf(corefile, p, up)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var lo, lc syncBuffer
	start(t, []string{ours, "-localip", "127.0.0.1", "-conf", confOurs, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-kube-dns", kube, "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, &lo)
	start(t, []string{coredns, "-conf", confCore, "-quiet"}, &lc)
	aOurs, aCore := fmt.Sprintf("127.0.0.1:%d", pOurs), fmt.Sprintf("127.0.0.1:%d", pCore)
	waitDNS(t, aOurs)
	waitDNS(t, aCore)
	for _, q := range cases {
		key := q.name + " " + dns.TypeToString[q.qtype]
		for round := 0; round < 2; round++ { // miss, then hit
			o, c := askFull(t, aOurs, q.name, q.qtype), askFull(t, aCore, q.name, q.qtype)
			if o.String() != c.String() {
				t.Errorf("%s round %d:\n ours    %s\n coredns %s", key, round, o, c)
				continue
			}
			for _, p := range [][2][]uint32{{o.answerTTL, c.answerTTL}, {o.nsTTL, c.nsTTL}} {
				for i := range p[0] {
					if d := int(p[0][i]) - int(p[1][i]); d < -1 || d > 1 {
						t.Errorf("%s round %d: TTLs ours %v coredns %v", key, round, p[0], p[1])
						break
					}
				}
			}
		}
	}
}

func TestTemplateParityWithCoreDNS(t *testing.T) {
	runDirectiveParity(t, `noaaaa.test:%[1]d {
    bind 127.0.0.1
    cache 30
    template IN AAAA {
        rcode NOERROR
    }
    forward . %[2]s
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[2]s
    template IN A tmpl.example {
        match ^(?P<a>[0-9]+)-(?P<b>[0-9]+)\.tmpl\.example\.$
        answer "{{ .Name }} 60 IN A 10.0.{{ .Group.a }}.{{ index .Match 2 }}"
        additional "extra.tmpl.example. 30 IN TXT \"{{ .Type }} {{ .Class }} {{ .Zone }} {{ .Regex }}\""
        authority "tmpl.example. 120 IN NS ns.tmpl.example."
        fallthrough
    }
    template IN A cname.example {
        answer "{{ .Name }} 60 IN CNAME www.example.org."
    }
    template ANY ANY nx.tmpl.example {
        rcode NXDOMAIN
        authority "nx.tmpl.example. 60 IN SOA ns.tmpl.example. host.tmpl.example. 1 2 3 4 60"
    }
    template IN A strict.example {
        match ^ok\.strict\.example\.$
        answer "{{ .Name }} IN A 10.9.9.9"
    }
    template IN MX mx.example {
        answer "{{ .Name }} 300 IN MX 10 mail.{{ .Zone }}"
        rcode NOERROR
    }
}
`, []directiveCase{
		{"www.noaaaa.test.", dns.TypeAAAA},
		{"WWW.NoAAAA.test.", dns.TypeAAAA},
		{"www.noaaaa.test.", dns.TypeA},
		{"www.example.org.", dns.TypeA},
		{"www.example.org.", dns.TypeAAAA},
		{"1-2.tmpl.example.", dns.TypeA},
		{"31-200.TMPL.example.", dns.TypeA},
		{"other.tmpl.example.", dns.TypeA},
		{"1-2.tmpl.example.", dns.TypeTXT},
		{"x.cname.example.", dns.TypeA},
		{"a.nx.tmpl.example.", dns.TypeA},
		{"nx.tmpl.example.", dns.TypeTXT},
		{"ok.strict.example.", dns.TypeA},
		{"bad.strict.example.", dns.TypeA},
		{"mx.example.", dns.TypeMX},
	}, nil)
}
