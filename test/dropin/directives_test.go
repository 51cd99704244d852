package dropin

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
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
// It returns both servers' addresses and the directory of files.
func runDirectiveParity(t *testing.T, corefile string, cases []directiveCase, files map[string]string) (ours, core, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	return runDirectiveParityWith(t, upstream(t, "93.184.216.34"), corefile, cases, files)
}

// runDirectiveParityWith is runDirectiveParity forwarding to up.
func runDirectiveParityWith(t *testing.T, up, corefile string, cases []directiveCase, files map[string]string) (ours, core, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	oursBin, coredns := buildNodelocaldns(t), buildCoreDNS(t)
	kube := upstream(t, "10.96.1.1")
	dir = t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	corefile = strings.ReplaceAll(corefile, "DIR", dir)
	pOurs, pCore := testhost.FreePort(t, "127.0.0.1"), testhost.FreePort(t, "127.0.0.1")
	confOurs, confCore := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "coredns.Corefile")
	for f, p := range map[string]int{confOurs: pOurs, confCore: pCore} {
		if err := os.WriteFile(f, []byte(fmt.Sprintf(corefile, p, up)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var lo, lc testhost.SyncBuffer
	start(t, []string{oursBin, "-localip", "127.0.0.1", "-conf", confOurs, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-kube-dns", kube, "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")), "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))}, &lo)
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
	return aOurs, aCore, dir
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

// .Remote is the client's IP. Behind the cache (CoreDNS's plugin order),
// the first client's answer is cached and served to every client until it
// expires: the same in both servers, over UDP and TCP.
func TestTemplateRemoteParityWithCoreDNS(t *testing.T) {
	ours, core, _ := runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    template IN TXT remote.example {
        answer "{{ .Name }} 60 IN TXT \"from {{ .Remote }}\""
    }
    template IN A ip.remote.example {
        answer "{{ .Name }} 60 IN A {{ .Remote }}"
    }
    forward . %[2]s
}
`, []directiveCase{
		{"who.remote.example.", dns.TypeTXT},
		{"a.ip.remote.example.", dns.TypeA},
	}, nil)
	for _, c := range []struct {
		name  string
		qtype uint16
		net   string
		from  string
		want  string
	}{
		// Cached from 127.0.0.1's question above: 127.0.0.1's answer.
		{"who.remote.example.", dns.TypeTXT, "udp", "127.0.0.9", `"from 127.0.0.1"`},
		{"a.ip.remote.example.", dns.TypeA, "tcp", "127.0.0.9", "127.0.0.1"},
		// New questions: the asker's own address, then cached for others.
		{"new.remote.example.", dns.TypeTXT, "udp", "127.0.0.9", `"from 127.0.0.9"`},
		{"new.remote.example.", dns.TypeTXT, "udp", "127.0.0.1", `"from 127.0.0.9"`},
		{"b.ip.remote.example.", dns.TypeA, "tcp", "127.0.0.10", "127.0.0.10"},
	} {
		for _, srv := range []string{ours, core} {
			got := askFrom(t, srv, c.net, c.from, c.name, c.qtype)
			if !strings.HasSuffix(got, c.want) {
				t.Errorf("%s %s over %s from %s @%s: %q, want ...%s", c.name, dns.TypeToString[c.qtype], c.net, c.from, srv, got, c.want)
			}
		}
	}
}

// askFrom asks name over network from the local address from and returns
// the answer's first record without TTL ("" when none).
func askFrom(t *testing.T, addr, network, from, name string, qtype uint16) string {
	t.Helper()
	var local net.Addr = &net.UDPAddr{IP: net.ParseIP(from)}
	if network == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c := &dns.Client{Net: network, Timeout: 3 * time.Second, Dialer: &net.Dialer{LocalAddr: local, Timeout: 3 * time.Second}}
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s over %s from %s @%s: %v", name, dns.TypeToString[qtype], network, from, addr, err)
	}
	if len(r.Answer) == 0 {
		return ""
	}
	r.Answer[0].Header().Ttl = 0
	return r.Answer[0].String()
}

func TestHostsParityWithCoreDNS(t *testing.T) {
	ours, core, dir := runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    hosts DIR/hosts {
        10.1.1.1 inline.example
        fd00::1 inline.example Inline2.Example.
        ttl 60
        reload 200ms
        fallthrough
    }
    forward . %[2]s
}
strict.test:%[1]d {
    bind 127.0.0.1
    cache 30
    hosts DIR/hosts2 {
        no_reverse
        reload 200ms
    }
    forward . %[2]s
}
`, []directiveCase{
		{"file.example.", dns.TypeA},
		{"FILE.example.", dns.TypeAAAA},
		{"file.example.", dns.TypeMX},
		{"file2.example.", dns.TypeA},
		{"file2.example.", dns.TypeAAAA},
		{"inline.example.", dns.TypeA},
		{"inline.example.", dns.TypeAAAA},
		{"inline2.example.", dns.TypeA},
		{"x.wild.example.", dns.TypeA},
		{"wild.example.", dns.TypeA},
		{"2.2.2.10.in-addr.arpa.", dns.TypePTR},
		{"1.1.1.10.in-addr.arpa.", dns.TypePTR},
		{"2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR},
		{"9.9.9.10.in-addr.arpa.", dns.TypePTR},
		{"www.example.org.", dns.TypeA},
		{"a.strict.test.", dns.TypeA},
		{"a.strict.test.", dns.TypeAAAA},
		{"b.strict.test.", dns.TypeA},
		{"4.4.4.10.in-addr.arpa.", dns.TypePTR},
	}, map[string]string{
		"hosts":  "10.2.2.2 file.example file2.example # a comment\n\n# only a comment\nfd00::2   file.example\n10.3.3.3 *.wild.example\nnot-an-address bad.example\n",
		"hosts2": "10.4.4.4 a.strict.test\n",
	})
	// The file is watched: a new entry is answered within the reload
	// interval (200ms) by both (SERVFAIL before: not cached).
	if err := os.WriteFile(filepath.Join(dir, "hosts2"), []byte("10.5.5.5 new.strict.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{ours, core} {
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			a := askFull(t, addr, "new.strict.test.", dns.TypeA)
			if a.rcode == "NOERROR" && len(a.answer) == 1 && strings.HasSuffix(a.answer[0], "10.5.5.5") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: new.strict.test. after the file changed: %s", addr, a)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func TestRewriteParityWithCoreDNS(t *testing.T) {
	runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite name exact alias.test www.example.org
    rewrite name suffix .short.test. .example.org. answer auto
    rewrite name regex ^(.*)\.rx\.test\.$ {1}.example.org answer auto
    rewrite name substring sub.test alias.example.org
    rewrite continue name exact chain1.test chain2.test
    rewrite name exact chain2.test www.example.org
    rewrite stop {
        name regex ^(.*)\.blk\.test\.$ {1}.example.org.
        answer name ^(.*)\.example\.org\.$ {1}.blk.test.
        answer value ^(.*)\.example\.org\.$ {1}.blk.test.
    }
    forward . %[2]s
}
`, []directiveCase{
		{"alias.test.", dns.TypeA},
		{"Alias.Test.", dns.TypeA},
		{"www.short.test.", dns.TypeA},
		{"alias.short.test.", dns.TypeA},
		{"nx1.short.test.", dns.TypeA},
		{"alias.rx.test.", dns.TypeA},
		{"www.rx.test.", dns.TypeAAAA},
		{"x.sub.test.", dns.TypeA},
		{"chain1.test.", dns.TypeA},
		{"www.blk.test.", dns.TypeA},
		{"alias.blk.test.", dns.TypeA},
		{"www.example.org.", dns.TypeA},
	}, nil)
}

// TestRewriteTypeParityWithCoreDNS: type and class rules ask the
// rewritten question; the answers are CoreDNS 1.15's (the question itself
// is restored here, docs/migration.md).
func TestRewriteTypeParityWithCoreDNS(t *testing.T) {
	runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite continue type AAAA A
    rewrite stop type MX TXT
    rewrite class CH IN
    forward . %[2]s
}
`, []directiveCase{
		{"www.example.org.", dns.TypeAAAA},
		{"www.example.org.", dns.TypeMX},
		{"nx.example.org.", dns.TypeAAAA},
		{"www.example.org.", dns.TypeA},
		{"sf.example.org.", dns.TypeAAAA},
	}, nil)
}

// TestRewriteTTLRcodeParityWithCoreDNS: ttl and rcode rules act on every
// answer, after the cache (hits too: the second round of each case), on
// the name the earlier rules rewrote, ending the walk where they stop, as
// CoreDNS 1.15's.
func TestRewriteTTLRcodeParityWithCoreDNS(t *testing.T) {
	ours, _, _ := runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite ttl www.example.org 7
    rewrite ttl prefix alias. 100-200
    rewrite ttl suffix .up.example.org. 4000-
    rewrite ttl substring .sub.example.org. -3
    rewrite ttl regex ^r[0-9]+\.example\.org\.$ 2-5
    rewrite rcode nx1.example.org NXDOMAIN REFUSED
    rewrite rcode suffix .rc.example.org. SERVFAIL NOERROR
    rewrite continue rcode sf.chain.example.org SERVFAIL NXDOMAIN
    rewrite rcode sf.chain.example.org NXDOMAIN REFUSED
    rewrite continue name exact renamed.example.org www2.example.org
    rewrite ttl www2.example.org 11
    rewrite ttl exact stop.example.org 12
    rewrite name exact stop.example.org www.example.org
    forward . %[2]s
}
`, []directiveCase{
		{"www.example.org.", dns.TypeA},
		{"WWW.Example.Org.", dns.TypeA},
		{"alias.example.org.", dns.TypeA},
		{"x.up.example.org.", dns.TypeA},
		{"x.sub.example.org.", dns.TypeA},
		{"x.sub.example.org.", dns.TypeAAAA},
		{"r12.example.org.", dns.TypeA},
		{"nx1.example.org.", dns.TypeA},
		{"nx2.example.org.", dns.TypeA},
		{"sf1.rc.example.org.", dns.TypeA},
		{"nx1.rc.example.org.", dns.TypeA},
		{"sf.chain.example.org.", dns.TypeA},
		{"renamed.example.org.", dns.TypeA},
		{"stop.example.org.", dns.TypeA},
	}, nil)
	// Parity alone would pass with no rule applied: what the rules did.
	for _, c := range []struct {
		name  string
		qtype uint16
		want  string // rcode and TTLs (answer, authority)
	}{
		{"www.example.org.", dns.TypeA, "NOERROR [7] []"},
		{"alias.example.org.", dns.TypeA, "NOERROR [100 100] []"}, // cache 30 caps 300 and 120 first
		{"x.up.example.org.", dns.TypeA, "NOERROR [4000] []"},
		{"x.sub.example.org.", dns.TypeAAAA, "NOERROR [] [3]"},
		{"r12.example.org.", dns.TypeA, "NOERROR [5] []"},
		{"nx1.example.org.", dns.TypeA, "REFUSED [] [30]"},
		{"sf1.rc.example.org.", dns.TypeA, "NOERROR [] []"},
		{"sf.chain.example.org.", dns.TypeA, "NXDOMAIN [] []"},
		{"renamed.example.org.", dns.TypeA, "NOERROR [11] []"},
		{"stop.example.org.", dns.TypeA, "NOERROR [12] []"},
	} {
		a := askFull(t, ours, c.name, c.qtype)
		if got := fmt.Sprintf("%s %v %v", a.rcode, a.answerTTL, a.nsTTL); got != c.want {
			t.Errorf("%s %s: %s, want %s", c.name, dns.TypeToString[c.qtype], got, c.want)
		}
	}
}

// TestRewriteCNAMEParityWithCoreDNS: cname rules give a CNAME the new
// target and the records of the new target's answer (looked up through
// its block), chained rules seeing each other's target, and a stop cname
// rule ends the walk for every name, as CoreDNS 1.15's. The new target's
// records are cached here with the answer, as one entry under the asking
// block's cache: CoreDNS caches them apart, by their own block, so their
// TTLs agree while both blocks cap them alike (cache 30 in both here;
// docs/migration.md).
func TestRewriteCNAMEParityWithCoreDNS(t *testing.T) {
	ours, _, _ := runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite continue cname exact target.example.org. www.example.org.
    rewrite continue cname suffix .foo.test. .example.org.
    rewrite cname regex (.*)\.rx\.test\. {1}.other.test.
    rewrite ttl alias.example.org 3
    forward . %[2]s
}
other.test:%[1]d {
    bind 127.0.0.1
    cache 30
    template IN A other.test {
        answer "{{ .Name }} 60 IN A 192.0.2.9"
    }
}
`, []directiveCase{
		{"alias.example.org.", dns.TypeA},
		{"alias.foo.test.", dns.TypeA},
		{"alias.rx.test.", dns.TypeA},
		{"alias.example.org.", dns.TypeAAAA},
		{"www.example.org.", dns.TypeA},
		{"alias.bar.test.", dns.TypeA},
	}, nil)
	for _, c := range []struct {
		name string
		want []string
	}{
		{"alias.example.org.", []string{"alias.example.org. CNAME www.example.org.", "www.example.org. A 93.184.216.34"}},
		{"alias.foo.test.", []string{"alias.foo.test. CNAME www.example.org.", "www.example.org. A 93.184.216.34"}},
		{"alias.rx.test.", []string{"alias.rx.test. CNAME target.other.test.", "target.other.test. A 192.0.2.9"}},
	} {
		m := new(dns.Msg)
		m.SetQuestion(c.name, dns.TypeA)
		r, err := dns.Exchange(m, ours)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rr := range r.Answer {
			f := strings.Fields(rr.String())
			got = append(got, f[0]+" "+f[3]+" "+f[4])
		}
		if strings.Join(got, " | ") != strings.Join(c.want, " | ") {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// optionsEcho answers every question with a TXT record per EDNS option of
// the query it got (code and data in hex), "none" without any: what the
// cache sent upstream.
func optionsEcho(t *testing.T) string {
	return serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		txt := []string{"none"}
		if o := r.IsEdns0(); o != nil && len(o.Option) > 0 {
			txt = nil
			for _, e := range o.Option {
				txt = append(txt, fmt.Sprintf("%d=%s", e.Option(), e.String()))
			}
		}
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: txt})
		_ = w.WriteMsg(m)
	}))
}

// TestRewriteEdns0ParityWithCoreDNS: edns0 rules put the same options in
// the query sent upstream as CoreDNS 1.15's (static and hex values,
// {qname}, {qtype}, {client_ip}, subnet, nsid, append, replace, unset, stop
// and continue), and a ttl rule after them is reached or not alike. Each
// answer is cached: the second round (hits) gives the options of the
// first, in both.
func TestRewriteEdns0ParityWithCoreDNS(t *testing.T) {
	ours, _, _ := runDirectiveParityWith(t, optionsEcho(t), `.:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite edns0 local set 0xffee abc
    forward . %[2]s
}
set.test:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite continue edns0 local set 0xffee 0xcafe
    rewrite continue edns0 local append 0xffef {qname}
    rewrite continue edns0 local append 0xfff0 {qtype}
    rewrite continue edns0 local set 0xfff1 {client_ip} revert
    rewrite continue edns0 nsid set
    rewrite edns0 subnet set 24 56
    rewrite ttl suffix .set.test. 5
    forward . %[2]s
}
replace.test:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite continue edns0 local replace 0xffee x
    rewrite continue edns0 local append 0xffee y
    rewrite continue edns0 local replace 0xffee z
    rewrite continue edns0 local append 0xffee w
    rewrite continue edns0 subnet append 32 128
    rewrite continue edns0 subnet append 16 64
    rewrite edns0 local unset 0xffee
    rewrite ttl suffix .replace.test. 6
    forward . %[2]s
}
stop.test:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite edns0 local replace 0xffee x
    rewrite ttl suffix .stop.test. 7
    rewrite edns0 local set 0xffee y
    rewrite ttl suffix .stop.test. 8
    forward . %[2]s
}
`, []directiveCase{
		{"www.example.org.", dns.TypeTXT},
		{"a.set.test.", dns.TypeTXT},
		{"a.set.test.", dns.TypeA},
		{"a.replace.test.", dns.TypeTXT},
		{"a.stop.test.", dns.TypeTXT},
	}, nil)
	for _, c := range []struct{ name, want string }{
		{"www.example.org.", "NOERROR [30] [] 65518=65518:0x616263"},
		// The subnet rule stops the walk before the ttl rule.
		{"a.set.test.", "NOERROR [30] [] 65518=65518:0xcafe 65519=65519:0x612e7365742e746573742e 65520=65520:0x0010 65521=65521:0x7f000001 3= 8=127.0.0.0/24/0"},
		// replace without the option: not applied; the second subnet
		// append finds the first: not applied; unset stops.
		{"a.replace.test.", "NOERROR [30] [] 8=127.0.0.1/32/0"},
		// The replace is not applied, so the first ttl rule is reached
		// and stops.
		{"a.stop.test.", "NOERROR [7] [] none"},
	} {
		m := new(dns.Msg)
		m.SetQuestion(c.name, dns.TypeTXT)
		r, err := dns.Exchange(m, ours)
		if err != nil {
			t.Fatal(err)
		}
		got := dns.RcodeToString[r.Rcode]
		var ttls, txt []string
		for _, rr := range r.Answer {
			ttls = append(ttls, fmt.Sprint(rr.Header().Ttl))
			if x, ok := rr.(*dns.TXT); ok {
				txt = append(txt, x.Txt...)
			}
		}
		got = fmt.Sprintf("%s [%s] [] %s", got, strings.Join(ttls, " "), strings.Join(txt, " "))
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestCacheZonesParityWithCoreDNS: `cache 30 ZONE...` caches only the
// names under those zones (TTLs capped at 30 s); the block's other names
// pass uncached (the upstream's 300 s), and a zone of another block is
// that block's, as in CoreDNS 1.15.
func TestCacheZonesParityWithCoreDNS(t *testing.T) {
	runDirectiveParity(t, `other.example.org:%[1]d {
    bind 127.0.0.1
    forward . %[2]s
}
.:%[1]d {
    bind 127.0.0.1
    cache 30 cached.example.org x.other.example.org
    forward . %[2]s
}
`, []directiveCase{
		{"www.cached.example.org.", dns.TypeA},
		{"nx.cached.example.org.", dns.TypeA},
		{"www.example.org.", dns.TypeA},
		{"nx.example.org.", dns.TypeA},
		{"www.x.other.example.org.", dns.TypeA},
	}, nil)
}

func TestDNS64ParityWithCoreDNS(t *testing.T) {
	runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    dns64 {
        allow_ipv4
    }
    template IN AAAA has6.test {
        answer "{{ .Name }} 60 IN AAAA 2001:db8::1"
    }
    template IN A has6.test {
        answer "{{ .Name }} 60 IN A 192.0.2.1"
    }
    forward . %[2]s
}
all.test:%[1]d {
    bind 127.0.0.1
    cache 30
    dns64 {
        prefix 2001:db8:64::/40
        translate_all
        allow_ipv4
    }
    template IN AAAA x.all.test {
        answer "{{ .Name }} 60 IN AAAA 2001:db8::2"
    }
    forward . %[2]s
}
`, []directiveCase{
		{"www.example.org.", dns.TypeAAAA},
		{"WWW.example.org.", dns.TypeAAAA},
		{"alias.example.org.", dns.TypeAAAA},
		{"nx1.example.org.", dns.TypeAAAA},
		{"sf1.example.org.", dns.TypeAAAA},
		{"www.example.org.", dns.TypeA},
		{"has6.test.", dns.TypeAAAA},
		{"www.all.test.", dns.TypeAAAA},
		{"x.all.test.", dns.TypeAAAA},
	}, nil)
}

// TestDNS64WithoutAllowIPv4OnIPv4: dns64 without allow_ipv4 on an IPv4
// listen address translates for no client (CoreDNS translates for IPv6
// clients only; an IPv4 socket has IPv4 clients only): the AAAA answers
// are CoreDNS 1.15's, untranslated.
func TestDNS64WithoutAllowIPv4OnIPv4(t *testing.T) {
	runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    dns64
    forward . %[2]s
}
`, []directiveCase{
		{"www.example.org.", dns.TypeAAAA},
		{"www.example.org.", dns.TypeA},
		{"nx.example.org.", dns.TypeAAAA},
	}, nil)
}

// edeOf asks name over UDP (with an EDNS OPT of 1232 bytes when edns) and
// returns the answer's rcode, the first answer record without TTL, whether
// it has an OPT, and its Extended DNS Errors as "code text".
func edeOf(t *testing.T, addr, name string, qtype uint16, edns bool) (rcode, first string, opt bool, ede []string) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(1232, false)
	}
	c := &dns.Client{Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s @%s: %v", name, dns.TypeToString[qtype], addr, err)
	}
	if len(r.Answer) > 0 {
		r.Answer[0].Header().Ttl = 0
		first = r.Answer[0].String()
	}
	if o := r.IsEdns0(); o != nil {
		opt = true
		for _, x := range o.Option {
			if e, ok := x.(*dns.EDNS0_EDE); ok {
				ede = append(ede, fmt.Sprintf("%d %q", e.InfoCode, e.ExtraText))
			}
		}
	}
	return dns.RcodeToString[r.Rcode], first, opt, ede
}

// template's ederror (CoreDNS 1.15) adds an Extended DNS Error to the
// answer it writes. Behind a cache (the usual block) no client sees it:
// CoreDNS's cache drops the answer's OPT before it stores or writes it, the
// miss's answer too. From a block without cache every answer has it. The
// same in both, to an EDNS client; to a client without EDNS we send no OPT
// (RFC 6891 §7), where CoreDNS leaves the template's OPT in the answer.
func TestTemplateEDEParityWithCoreDNS(t *testing.T) {
	ours, core, _ := runDirectiveParity(t, `.:%[1]d {
    bind 127.0.0.1
    cache 30
    template IN A ede.example {
        answer "{{ .Name }} 60 IN A 10.1.2.3"
        ederror 17 "filtered by the node's policy"
    }
    template IN AAAA ede.example {
        rcode NXDOMAIN
        authority "ede.example. 60 IN SOA ns.ede.example. host.ede.example. 1 2 3 4 60"
        ederror 15
    }
    forward . %[2]s
}
nocache.example:%[1]d {
    bind 127.0.0.1
    template IN A nocache.example {
        answer "{{ .Name }} 60 IN A 10.1.2.4"
        ederror 17 "filtered by the node's policy"
    }
    template IN AAAA nocache.example {
        rcode NXDOMAIN
        authority "nocache.example. 60 IN SOA ns.nocache.example. host.nocache.example. 1 2 3 4 60"
        ederror 15
    }
    template IN TXT nocache.example {
        answer "{{ .Name }} 60 IN TXT \"x\""
    }
}
`, []directiveCase{
		{"a.ede.example.", dns.TypeA},
		{"a.ede.example.", dns.TypeAAAA},
		{"a.nocache.example.", dns.TypeA},
		{"a.nocache.example.", dns.TypeAAAA},
		{"a.nocache.example.", dns.TypeTXT},
		{"www.example.org.", dns.TypeA},
	}, nil)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  []string // on the miss and after
	}{
		{"b.ede.example.", dns.TypeA, nil},
		{"b.ede.example.", dns.TypeAAAA, nil},
		{"b.nocache.example.", dns.TypeA, []string{`17 "filtered by the node's policy"`}},
		{"b.nocache.example.", dns.TypeAAAA, []string{`15 ""`}},
		{"b.nocache.example.", dns.TypeTXT, nil},
		{"www.example.org.", dns.TypeAAAA, nil},
	} {
		key := c.name + " " + dns.TypeToString[c.qtype]
		for round := range 2 {
			var got [2]string
			for i, srv := range []string{ours, core} {
				rcode, first, opt, ede := edeOf(t, srv, c.name, c.qtype, true)
				got[i] = fmt.Sprintf("%s %q opt %v EDE %v", rcode, first, opt, ede)
				if !opt || fmt.Sprint(ede) != fmt.Sprint(c.want) {
					t.Errorf("%s round %d @%s: %s, want EDE %v", key, round, srv, got[i], c.want)
				}
			}
			if got[0] != got[1] {
				t.Errorf("%s round %d: ours %s, coredns %s", key, round, got[0], got[1])
			}
		}
	}
	// Without EDNS: no OPT from us; CoreDNS's has the template's OPT.
	for _, name := range []string{"c.ede.example.", "c.nocache.example."} {
		_, _, opt, ede := edeOf(t, ours, name, dns.TypeA, false)
		_, _, copt, cede := edeOf(t, core, name, dns.TypeA, false)
		t.Logf("%s without EDNS: ours OPT %v EDE %v; coredns OPT %v EDE %v", name, opt, ede, copt, cede)
		if opt {
			t.Errorf("%s: ours sent an OPT to a client that sent none", name)
		}
	}
}

// TestCacheDisableZonesParityWithCoreDNS: `disable success|denial ZONE...`
// keeps the positive answers, or the denials and SERVFAILs, of the names
// under those zones out of the block's cache and caches the rest, as
// CoreDNS 1.15: each name is asked three times of both, and the upstream
// counts how often each was asked through (each server asks its own
// names: o- for ours, c- for CoreDNS).
func TestCacheDisableZonesParityWithCoreDNS(t *testing.T) {
	var mu sync.Mutex
	asked := map[string]int{}
	up := serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		q := r.Question[0]
		mu.Lock()
		asked[strings.ToLower(q.Name)]++
		mu.Unlock()
		_, label, _ := strings.Cut(strings.SplitN(q.Name, ".", 2)[0], "-")
		switch label {
		case "nx":
			m.Rcode = dns.RcodeNameError
			soa, _ := dns.NewRR("example. 300 IN SOA ns.example. host.example. 1 3600 600 86400 300")
			m.Ns = append(m.Ns, soa)
		case "sf":
			m.Rcode = dns.RcodeServerFailure
		default:
			rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	}))
	corefile := `other.example:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . ` + up + `
}
.:%[1]d {
    bind 127.0.0.1
    cache 30 {
        disable success nocache.example other.example
        disable denial skipped.example
        disable denial nodenial.example
    }
    forward . ` + up + `
}
whole.example:%[1]d {
    bind 127.0.0.1
    cache 30 {
        disable success example
    }
    forward . ` + up + `
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true)
	var names []string
	for _, z := range []string{"example", "nocache.example", "other.example", "nodenial.example", "x.nodenial.example", "skipped.example", "whole.example"} {
		for _, l := range []string{"www", "nx", "sf"} {
			names = append(names, l+"."+z+".")
		}
	}
	for _, n := range names {
		for range 3 {
			for who, a := range map[string]string{"o-": aOurs, "c-": aCore} {
				m := new(dns.Msg)
				m.SetQuestion(who+n, dns.TypeA)
				if _, err := dns.Exchange(m, a); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range names {
		if o, c := asked["o-"+n], asked["c-"+n]; o != c || o == 0 {
			t.Errorf("%s: asked upstream %d times through ours, %d through CoreDNS", n, o, c)
		}
	}
	// The test means something only if the counts differ among the names.
	if asked["o-www.nocache.example."] != 3 || asked["o-www.example."] != 1 || asked["o-nx.nodenial.example."] != 3 || asked["o-sf.nodenial.example."] != 3 {
		t.Errorf("upstream counts %v", asked)
	}
}

// A network as a server block key is its reverse zones, as CoreDNS reads
// it: the prefix rounded up to a whole label (10.0.0.0/15 is two /16
// zones, 172.16.5.0/26 sixty-four /32 ones, fd00::/30 four /32 nibble
// zones); a name outside them is REFUSED by both.
func TestCIDRKeysParityWithCoreDNS(t *testing.T) {
	runDirectiveParity(t, `10.0.0.0/15:%[1]d 172.16.5.0/26:%[1]d fd00::/30:%[1]d {
    bind 127.0.0.1
    template IN PTR {
        answer "{{ .Name }} 60 IN PTR zone.{{ .Zone }}"
    }
}
.:%[1]d {
    bind 127.0.0.1
    forward . %[2]s
}
`, []directiveCase{
		{"4.3.0.10.in-addr.arpa.", dns.TypePTR},
		{"4.3.1.10.in-addr.arpa.", dns.TypePTR},
		{"4.3.2.10.in-addr.arpa.", dns.TypePTR},
		{"5.5.16.172.in-addr.arpa.", dns.TypePTR},
		{"63.5.16.172.in-addr.arpa.", dns.TypePTR},
		{"64.5.16.172.in-addr.arpa.", dns.TypePTR},
		{"5.16.172.in-addr.arpa.", dns.TypePTR},
		{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.3.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR},
		{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.4.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR},
	}, nil)
}
