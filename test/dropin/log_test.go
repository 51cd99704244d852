package dropin

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// pair starts nodelocaldns and CoreDNS 1.15 on corefile (a format string:
// %[1]d the DNS port, %[2]s the node's upstream, %[3]s kube-dns) with the
// parity tests' stand-in upstreams, and returns their addresses and their
// output. kubeFlag passes -kube-dns at the kube-dns stand-in (else the
// Corefile names kube-dns); ours are more of nodelocaldns' arguments.
func pair(t *testing.T, corefile string, kubeFlag bool, ours ...string) (aOurs, aCore string, lo, lc *testhost.SyncBuffer) {
	t.Helper()
	aOurs, aCore, lo, lc, _ = pairConf(t, corefile, kubeFlag, ours...)
	return aOurs, aCore, lo, lc
}

// pairConf is pair, also returning the Corefiles' paths and how to write
// them again (a reload: rewrite(text) with pair's format).
func pairConf(t *testing.T, corefile string, kubeFlag bool, ours ...string) (aOurs, aCore string, lo, lc *testhost.SyncBuffer, rewrite func(string)) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	oursBin, coredns := buildNodelocaldns(t), buildCoreDNS(t)
	up, kube := upstream(t, "93.184.216.34"), upstream(t, "10.96.1.1")
	dir := t.TempDir()
	pOurs, pCore := testhost.FreePort(t, "127.0.0.1"), testhost.FreePort(t, "127.0.0.1")
	confOurs, confCore := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "coredns.Corefile")
	rewrite = func(corefile string) {
		for f, p := range map[string]int{confOurs: pOurs, confCore: pCore} {
			if err := os.WriteFile(f+".tmp", []byte(fmt.Sprintf(corefile, p, up, kube)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(f+".tmp", f); err != nil {
				t.Fatal(err)
			}
		}
	}
	rewrite(corefile)
	lo, lc = &testhost.SyncBuffer{}, &testhost.SyncBuffer{}
	if kubeFlag {
		ours = append(ours, "-kube-dns", kube)
	}
	start(t, append([]string{oursBin, "-localip", "127.0.0.1", "-conf", confOurs, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")), "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))}, ours...), lo)
	start(t, []string{coredns, "-conf", confCore, "-quiet"}, lc)
	aOurs, aCore = fmt.Sprintf("127.0.0.1:%d", pOurs), fmt.Sprintf("127.0.0.1:%d", pCore)
	waitDNS(t, aOurs)
	waitDNS(t, aCore)
	return aOurs, aCore, lo, lc, rewrite
}

// logQuery is one query of the log tests, asked with a fixed ID.
type logQuery struct {
	name  string
	qtype uint16
	net   string // udp or tcp
	edns  bool
	do    bool
	opt   bool // an option CoreDNS does not count (dig's cookie)
}

func (q logQuery) ask(t *testing.T, addr string, id uint16) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(q.name, q.qtype)
	m.Id = id
	if q.edns {
		m.SetEdns0(1232, q.do)
		if q.opt {
			o := m.IsEdns0()
			o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
		}
	}
	c := &dns.Client{Net: q.net, Timeout: 3 * time.Second}
	if _, _, err := c.Exchange(m, addr); err != nil {
		t.Fatalf("%s %s @%s: %v", q.name, dns.TypeToString[q.qtype], addr, err)
	}
}

var (
	logPort  = regexp.MustCompile(`^(\[INFO\] (?:\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]+\])):\d+`)
	logDur   = regexp.MustCompile(`\b\d+(\.\d+)?s\b`)
	logFlags = regexp.MustCompile(`\bqr[a-z,]*`)
)

// queryLines are the query log lines of out, with the client's port and
// the duration masked, without waitDNS's queries, and the answer flags without AA and RA (which
// nodelocaldns never and always sets, docs/migration.md).
func queryLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "[INFO] ") || strings.Contains(l, "SIGTERM") || strings.Contains(l, "plugin/reload") || strings.Contains(l, "ready.example.org") {
			continue
		}
		l = logPort.ReplaceAllString(l, "$1:PORT")
		l = logDur.ReplaceAllString(l, "DURs")
		l = logFlags.ReplaceAllStringFunc(l, func(f string) string {
			var keep []string
			for _, x := range strings.Split(f, ",") {
				if x != "aa" && x != "ra" {
					keep = append(keep, x)
				}
			}
			return strings.Join(keep, ",")
		})
		lines = append(lines, l)
	}
	return lines
}

// TestLogParityWithCoreDNS: the log directive logs the same lines as
// CoreDNS 1.15 for the same queries: per block (a block without log logs
// nothing), per name scope (the first scope holding the name decides),
// per class (success, denial, error), in the common, combined and custom
// formats with every placeholder, over UDP and TCP, for misses and hits.
func TestLogParityWithCoreDNS(t *testing.T) {
	corefile := `cluster.local:%[1]d {
    bind 127.0.0.1
    log . {combined} {
        class denial error
    }
    cache 30
    forward . %[3]s
}
example.org:%[1]d {
    bind 127.0.0.1
    log sub.example.org "{type} {class} {name} {proto} {size} {remote} {local} {>id} {>opcode} {>do} {>bufsize} {rcode} {rsize} {/meta} {unknown} x} {>rflags}"
    log {
        class success
    }
    cache 30
    forward . %[2]s
}
example.net:%[1]d {
    bind 127.0.0.1
    log
    log example.net "{name} second rule: never used"
    cache 30
    forward . %[2]s
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[2]s
}
`
	aOurs, aCore, lo, lc := pair(t, corefile, true)
	queries := []logQuery{
		{name: "web.default.svc.cluster.local.", qtype: dns.TypeA, net: "udp", edns: true},
		{name: "nx.default.svc.cluster.local.", qtype: dns.TypeA, net: "udp", edns: true, opt: true},
		{name: "web.default.svc.cluster.local.", qtype: dns.TypeAAAA, net: "tcp", edns: true, do: true},
		{name: "sf.default.svc.cluster.local.", qtype: dns.TypeA, net: "udp"},
		{name: "www.Sub.example.org.", qtype: dns.TypeA, net: "udp", edns: true, opt: true},
		{name: "nx.sub.example.org.", qtype: dns.TypeA, net: "tcp"},
		{name: "www.example.org.", qtype: dns.TypeA, net: "udp", edns: true},
		{name: "www.example.org.", qtype: dns.TypeAAAA, net: "udp", edns: true},
		{name: "nx.example.org.", qtype: dns.TypeA, net: "udp", edns: true},
		{name: "alias.example.net.", qtype: dns.TypeA, net: "udp", edns: true, do: true},
		{name: "nx.example.net.", qtype: dns.TypeMX, net: "tcp", edns: true},
		{name: "www.example.com.", qtype: dns.TypeA, net: "udp", edns: true},
	}
	id := uint16(1000)
	for round := 0; round < 2; round++ { // misses, then hits
		for _, q := range queries {
			id++
			q.ask(t, aOurs, id)
			q.ask(t, aCore, id)
		}
	}
	var o, c []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		o, c = queryLines(lo.String()), queryLines(lc.String())
		if len(o) >= len(c) && len(c) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a line too many would show now
	o, c = queryLines(lo.String()), queryLines(lc.String())
	slices.Sort(o)
	slices.Sort(c)
	if !slices.Equal(o, c) {
		t.Errorf("query log lines differ:\nours:\n%s\ncoredns:\n%s", strings.Join(o, "\n"), strings.Join(c, "\n"))
	}
	if len(c) < 10 {
		t.Errorf("CoreDNS logged %d lines: the test asks too little", len(c))
	}
}

var (
	logID = regexp.MustCompile(` - \d+ "`)
	// loopProbe is the stock's loop plugin asking itself HINFO of a
	// random name at start; ours checks for loops another way.
	loopProbe = regexp.MustCompile(`"HINFO IN \d+\.\d+\.`)
)

// TestLogParityWithStockNodeCache: the reference manifest's Corefile with
// log lines (the lablabs chart's `log . {combined}` with classes in the
// cluster block, a plain `log` in the "." block, none in in-addr.arpa), run
// by the stock node-cache and by nodelocaldns in network namespaces: the
// same query log lines (client port, ID and duration masked, AA and RA
// apart).
func TestLogParityWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock := stockBinary(t)
	ours := buildNodelocaldns(t)
	corefile := referenceCorefile(t, false)
	corefile = strings.Replace(corefile, "    errors\n", "    errors\n    log . {combined} {\n        class denial error\n    }\n", 1)
	i := strings.Index(corefile, ".:53 {")
	corefile = corefile[:i] + strings.Replace(corefile[i:], "    errors\n", "    errors\n    log\n", 1)
	nsStock, _ := oracleNamespace(t)
	nsOurs, _ := oracleNamespace(t)
	ls := startReferenceCorefile(t, nsStock, stock, corefile, "-setupiptables=false")
	lo := startReferenceCorefile(t, nsOurs, ours, corefile, "-setupiptables=false")
	questions := []struct {
		name  string
		qtype uint16
	}{
		{"web.default.svc.cluster.local.", dns.TypeA},
		{"web.default.svc.cluster.local.", dns.TypeAAAA},
		{"nx.default.svc.cluster.local.", dns.TypeA},
		{"10.0.96.10.in-addr.arpa.", dns.TypePTR},
		{"www.example.org.", dns.TypeA},
		{"nx.example.org.", dns.TypeA},
		{"example.org.", dns.TypeMX},
	}
	for range 2 {
		for _, q := range questions {
			for _, v := range []variant{{name: "udp", net: "udp"}, {name: "do", net: "udp", edns: 1232, do: true}, {name: "tcp", net: "tcp"}} {
				for _, ns := range []string{nsStock, nsOurs} {
					if _, err := exchange(ns, q.name, q.qtype, v); err != nil {
						t.Fatalf("%s %s %s: %v", q.name, dns.TypeToString[q.qtype], v.name, err)
					}
				}
			}
		}
	}
	mask := func(out string) []string {
		var lines []string
		for _, l := range queryLines(out) {
			if loopProbe.MatchString(l) {
				continue
			}
			l = logID.ReplaceAllString(l, " - ID \"")
			lines = append(lines, l)
		}
		return lines
	}
	time.Sleep(300 * time.Millisecond)
	s, o := mask(ls.String()), mask(lo.String())
	slices.Sort(s)
	slices.Sort(o)
	if !slices.Equal(s, o) {
		t.Errorf("query log lines differ:\nstock:\n%s\nours:\n%s", strings.Join(s, "\n"), strings.Join(o, "\n"))
	}
	if len(s) < 10 {
		t.Errorf("the stock logged %d lines", len(s))
	}
}

// TestLogMetadataParityWithCoreDNS: with metadata, the labels log sets
// (log/type, log/class) have values in the block's log lines, whatever
// metadata's zones; other labels, and every label without metadata, print
// "-", as CoreDNS 1.15's. A rewrite edns0 rule with a metadata value never
// applies in either (no label has a value before the query is forwarded),
// so the ttl rule after it is reached.
func TestLogMetadataParityWithCoreDNS(t *testing.T) {
	corefile := `example.org:%[1]d {
    bind 127.0.0.1
    metadata
    log . "{name} {/log/type} {/log/class} {/trace/traceid} {/x/y} {rcode}"
    cache 30
    forward . %[2]s
}
example.net:%[1]d {
    bind 127.0.0.1
    metadata example.com
    log . "{name} {/log/type} {/log/class}"
    rewrite edns0 local set 0xffee {log/type}
    rewrite ttl suffix .example.net. 3
    forward . %[2]s
}
.:%[1]d {
    bind 127.0.0.1
    log . "{name} {/log/type} {/log/class}"
    cache 30
    forward . %[2]s
}
`
	aOurs, aCore, lo, lc := pair(t, corefile, true)
	queries := []logQuery{
		{name: "www.example.org.", qtype: dns.TypeA, net: "udp", edns: true},
		{name: "www.example.org.", qtype: dns.TypeAAAA, net: "udp", edns: true},
		{name: "nx.example.org.", qtype: dns.TypeA, net: "tcp"},
		{name: "sf.example.org.", qtype: dns.TypeA, net: "udp"},
		{name: "www.example.net.", qtype: dns.TypeA, net: "udp", edns: true},
		{name: "nx.example.net.", qtype: dns.TypeA, net: "udp"},
		{name: "www.example.com.", qtype: dns.TypeA, net: "udp", edns: true},
	}
	id := uint16(2000)
	for round := 0; round < 2; round++ { // misses, then hits
		for _, q := range queries {
			id++
			q.ask(t, aOurs, id)
			q.ask(t, aCore, id)
		}
	}
	var o, c []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		o, c = queryLines(lo.String()), queryLines(lc.String())
		if len(o) >= len(c) && len(c) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	o, c = queryLines(lo.String()), queryLines(lc.String())
	slices.Sort(o)
	slices.Sort(c)
	if !slices.Equal(o, c) {
		t.Errorf("query log lines differ:\nours:\n%s\ncoredns:\n%s", strings.Join(o, "\n"), strings.Join(c, "\n"))
	}
	for _, want := range []string{"[INFO] nx.example.org. NXDOMAIN denial - - NXDOMAIN", "[INFO] www.example.org. NODATA denial - - NOERROR",
		"[INFO] sf.example.org. SERVERERROR error - - SERVFAIL", "[INFO] www.example.net. NOERROR success", "[INFO] www.example.com. - -"} {
		if !slices.Contains(o, want) {
			t.Errorf("no line %q:\n%s", want, strings.Join(o, "\n"))
		}
	}
	// The edns0 rule with a metadata value never applies: the ttl rule
	// after it does.
	m := new(dns.Msg)
	m.SetQuestion("www.example.net.", dns.TypeA)
	for _, addr := range []string{aOurs, aCore} {
		r, err := dns.Exchange(m, addr)
		if err != nil || len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 3 {
			t.Errorf("%s: %v %v, want TTL 3", addr, r, err)
		}
	}
}

// TestLogMetadataParityWithStockNodeCache: the reference manifest's
// Corefile with metadata and a log format showing labels in the cluster
// block, and a log without metadata in the "." block, run by the stock
// node-cache and by nodelocaldns: the same lines, but for log/type and
// log/class, which the stock's CoreDNS 1.13.2 does not set (its log
// plugin sets no label; 1.14 added them): the stock prints "-" there, we
// print CoreDNS 1.15's values (docs/migration.md).
func TestLogMetadataParityWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock := stockBinary(t)
	ours := buildNodelocaldns(t)
	corefile := referenceCorefile(t, false)
	corefile = strings.Replace(corefile, "    errors\n", "    errors\n    metadata\n    log . \"{name} {type} {/log/type} {/log/class} {/kubernetes/pod} {rcode}\"\n", 1)
	i := strings.Index(corefile, ".:53 {")
	corefile = corefile[:i] + strings.Replace(corefile[i:], "    errors\n", "    errors\n    log . \"{name} {/log/type} {/log/class}\"\n", 1)
	nsStock, _ := oracleNamespace(t)
	nsOurs, _ := oracleNamespace(t)
	ls := startReferenceCorefile(t, nsStock, stock, corefile, "-setupiptables=false")
	lo := startReferenceCorefile(t, nsOurs, ours, corefile, "-setupiptables=false")
	for range 2 {
		for _, q := range []struct {
			name  string
			qtype uint16
		}{
			{"web.default.svc.cluster.local.", dns.TypeA},
			{"web.default.svc.cluster.local.", dns.TypeAAAA},
			{"nx.default.svc.cluster.local.", dns.TypeA},
			{"www.example.org.", dns.TypeA},
			{"nx.example.org.", dns.TypeA},
		} {
			for _, ns := range []string{nsStock, nsOurs} {
				if _, err := exchange(ns, q.name, q.qtype, variant{name: "udp", net: "udp"}); err != nil {
					t.Fatalf("%s %s: %v", q.name, dns.TypeToString[q.qtype], err)
				}
			}
		}
	}
	probeName := regexp.MustCompile(`^\[INFO\] \d+\.\d+\.`)
	labels := regexp.MustCompile(`^(\[INFO\] \S+ \S+) (\S+) (\S+) (- \S+)$`) // name type log/type log/class - rcode
	var typed []string
	mask := func(out string, keep bool) []string {
		var lines []string
		for _, l := range queryLines(out) {
			if probeName.MatchString(l) {
				continue // the stock's loop probe (HINFO of a random name)
			}
			if m := labels.FindStringSubmatch(l); m != nil {
				if keep {
					typed = append(typed, m[2]+" "+m[3])
				}
				l = m[1] + " LT LC " + m[4]
			}
			lines = append(lines, l)
		}
		return lines
	}
	time.Sleep(300 * time.Millisecond)
	s, o := mask(ls.String(), false), mask(lo.String(), true)
	for _, l := range queryLines(ls.String()) {
		if m := labels.FindStringSubmatch(l); m != nil && (m[2] != "-" || m[3] != "-") {
			t.Errorf("the stock gave log/type and log/class values: %s", l)
		}
	}
	slices.Sort(typed)
	if want := []string{"NODATA denial", "NODATA denial", "NOERROR success", "NOERROR success", "NOERROR success", "NXDOMAIN denial", "NXDOMAIN denial"}; !slices.Equal(typed, want) {
		t.Errorf("our log/type and log/class: %v, want %v", typed, want)
	}
	slices.Sort(s)
	slices.Sort(o)
	if !slices.Equal(s, o) {
		t.Errorf("query log lines differ:\nstock:\n%s\nours:\n%s", strings.Join(s, "\n"), strings.Join(o, "\n"))
	}
	if !slices.Contains(s, "[INFO] nx.default.svc.cluster.local. A LT LC - NXDOMAIN") {
		t.Errorf("the stock's lines:\n%s", strings.Join(s, "\n"))
	}
}
