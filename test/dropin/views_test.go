package dropin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// twoLoopbacks picks two distinct loopback addresses of the test's own.
func twoLoopbacks() (string, string) {
	a, b := testhost.Loopback(), testhost.Loopback()
	for a == b {
		b = testhost.Loopback()
	}
	return a, b
}

// viewTwins runs nodelocaldns and CoreDNS 1.15 on the Corefile corefile(p)
// (p: the port each serves), both on the addresses the Corefile binds;
// localIP is our -localip (what a block without bind serves).
func viewTwins(t *testing.T, localIP string, corefile func(p int) string) (pOurs, pCore int) {
	t.Helper()
	ours, coredns := buildNodelocaldns(t), buildCoreDNS(t)
	dir := t.TempDir()
	pOurs, pCore = testhost.FreePort(t, "127.0.0.1"), testhost.FreePort(t, "127.0.0.1")
	confOurs, confCore := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "coredns.Corefile")
	for f, text := range map[string]string{confOurs: corefile(pOurs), confCore: corefile(pCore)} {
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	free := fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))
	var lo, lc testhost.SyncBuffer
	start(t, []string{ours, "-localip", localIP, "-conf", confOurs, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-metrics-listen-address", free, "-local-mode"}, &lo)
	start(t, []string{coredns, "-conf", confCore, "-quiet"}, &lc)
	return pOurs, pCore
}

// waitUp waits until addr answers anything (REFUSED included).
func waitUp(t *testing.T, addr string) {
	t.Helper()
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion("ready.example.test.", dns.TypeA)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r, _, err := c.Exchange(m, addr); err == nil && r != nil {
			return
		}
	}
	t.Fatalf("%s does not answer", addr)
}

type viewQuery struct {
	addr  string // one of the Corefile's addresses
	name  string
	qtype uint16
	// What the view's block gives, checked on ours besides parity:
	// rcode, the A record's address ("" for none) and the TTL cap.
	rcode string
	a     string
	cap   uint32
}

func checkViews(t *testing.T, pOurs, pCore int, queries []viewQuery) {
	t.Helper()
	for _, q := range queries {
		key := fmt.Sprintf("%s %s @%s", q.name, dns.TypeToString[q.qtype], q.addr)
		for round := 0; round < 2; round++ { // miss, then hit
			o := ask(t, fmt.Sprintf("%s:%d", q.addr, pOurs), q.name, q.qtype)
			c := ask(t, fmt.Sprintf("%s:%d", q.addr, pCore), q.name, q.qtype)
			if o.rcode != c.rcode || strings.Join(o.rrs, "|") != strings.Join(c.rrs, "|") {
				t.Errorf("%s round %d:\n ours    %s %v\n coredns %s %v", key, round, o.rcode, o.rrs, c.rcode, c.rrs)
				continue
			}
			for i := range o.ttls {
				if d := int(o.ttls[i]) - int(c.ttls[i]); d < -1 || d > 1 {
					t.Errorf("%s round %d: TTLs ours %v coredns %v", key, round, o.ttls, c.ttls)
					break
				}
			}
			if o.rcode != q.rcode {
				t.Errorf("%s round %d: rcode %s, want %s", key, round, o.rcode, q.rcode)
			}
			if q.a != "" && (len(o.rrs) != 1 || !strings.HasSuffix(o.rrs[0], "\t"+q.a)) {
				t.Errorf("%s round %d: %v, want the A record %s", key, round, o.rrs, q.a)
			}
			for _, ttl := range o.ttls {
				if q.cap > 0 && ttl > q.cap {
					t.Errorf("%s round %d: TTL %d over the block's cap %d", key, round, ttl, q.cap)
				}
			}
		}
	}
}

// One zone served by two blocks bound to two addresses, each with its own
// cache caps and its own upstream: the same question asked on each address
// gets that block's answer and TTL cap, as from CoreDNS 1.15.
func TestViewsZoneOnTwoBinds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	a, b := twoLoopbacks()
	upA, upB, node := upstream(t, "10.0.0.1"), upstream(t, "10.0.0.2"), upstream(t, "93.184.216.34")
	pOurs, pCore := viewTwins(t, a, func(p int) string {
		return fmt.Sprintf(`example.test:%[1]d {
    bind %[2]s
    cache {
        success 9984 30
        denial 9984 5
    }
    forward . %[4]s
}
example.test:%[1]d {
    bind %[3]s
    cache {
        success 9984 10
        denial 9984 2
    }
    forward . %[5]s
}
.:%[1]d {
    bind %[2]s %[3]s
    cache 60
    forward . %[6]s
}
`, p, a, b, upA, upB, node)
	})
	for _, addr := range []string{a, b} {
		waitUp(t, fmt.Sprintf("%s:%d", addr, pOurs))
		waitUp(t, fmt.Sprintf("%s:%d", addr, pCore))
	}
	checkViews(t, pOurs, pCore, []viewQuery{
		{a, "www.example.test.", dns.TypeA, "NOERROR", "10.0.0.1", 30},
		{b, "www.example.test.", dns.TypeA, "NOERROR", "10.0.0.2", 10},
		{a, "nx1.example.test.", dns.TypeA, "NXDOMAIN", "", 5},
		{b, "nx1.example.test.", dns.TypeA, "NXDOMAIN", "", 2},
		{a, "alias.example.test.", dns.TypeA, "NOERROR", "", 30},
		{b, "alias.example.test.", dns.TypeA, "NOERROR", "", 10},
		{a, "www.example.org.", dns.TypeA, "NOERROR", "93.184.216.34", 60},
		{b, "www.example.org.", dns.TypeA, "NOERROR", "93.184.216.34", 60},
	})
}

// A block without bind and a block bound to another address: an address
// bound by a block sees only that block (a name outside its zones is
// REFUSED there), the others see the block without bind, as in CoreDNS.
func TestViewsBoundAndWildcard(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	a, b := twoLoopbacks()
	upB, node := upstream(t, "10.0.0.2"), upstream(t, "93.184.216.34")
	pOurs, pCore := viewTwins(t, a, func(p int) string {
		return fmt.Sprintf(`.:%[1]d {
    cache 60
    forward . %[4]s
}
example.test:%[1]d {
    bind %[2]s
    cache 10
    forward . %[3]s
}
`, p, b, upB, node)
	})
	for _, addr := range []string{a, b} {
		waitUp(t, fmt.Sprintf("%s:%d", addr, pOurs))
		waitUp(t, fmt.Sprintf("%s:%d", addr, pCore))
	}
	checkViews(t, pOurs, pCore, []viewQuery{
		{a, "www.example.test.", dns.TypeA, "NOERROR", "93.184.216.34", 60},
		{b, "www.example.test.", dns.TypeA, "NOERROR", "10.0.0.2", 10},
		{a, "www.example.org.", dns.TypeA, "NOERROR", "93.184.216.34", 60},
		{b, "www.example.org.", dns.TypeA, "REFUSED", "", 0},
	})
}

// The same zone in a block without bind and in a block with bind on one
// port: CoreDNS 1.15 refuses to start ("zone overlap listener
// capacity"); so does nodelocaldns, with one line and exit 2.
func TestViewsOverlapRefusedLikeCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	ours, coredns := buildNodelocaldns(t), buildCoreDNS(t)
	a, _ := twoLoopbacks()
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	p := testhost.FreePort(t, "127.0.0.1")
	text := fmt.Sprintf("example.test:%[1]d {\n    forward . 127.0.0.1:1\n}\nexample.test:%[1]d {\n    bind %[2]s\n    forward . 127.0.0.1:2\n}\n", p, a)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ours, "-localip", a, "-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm=",
		"-setupinterface=false", "-setupiptables=false", "-state-dir=", "-check-config").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "overlaps") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("ours: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err = exec.CommandContext(ctx, coredns, "-conf", conf, "-quiet").CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "zone overlap") {
		t.Errorf("coredns: %v\n%s", err, out)
	}
}

// A Corefile edit that changes the views on the running addresses applies
// within 2 s: a block for one address alone takes its queries, the other
// address keeps the shared block's answers, nothing cached from before
// answers for the new block.
func TestViewsReload(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ours := buildNodelocaldns(t)
	a, b := twoLoopbacks()
	upA, upB := upstream(t, "10.0.0.1"), upstream(t, "10.0.0.2")
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	p := testhost.FreePort(t, "127.0.0.1")
	one := fmt.Sprintf(".:%[1]d {\n    bind %[2]s %[3]s\n    cache 30\n    forward . %[4]s\n}\n", p, a, b, upA)
	if err := os.WriteFile(conf, []byte(one), 0o644); err != nil {
		t.Fatal(err)
	}
	var lo testhost.SyncBuffer
	start(t, []string{ours, "-localip", a, "-conf", conf, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")), "-local-mode"}, &lo)
	aAddr, bAddr := fmt.Sprintf("%s:%d", a, p), fmt.Sprintf("%s:%d", b, p)
	waitUp(t, aAddr)
	waitUp(t, bAddr)
	first := func(addr, name string) string {
		r := ask(t, addr, name, dns.TypeA)
		if len(r.rrs) != 1 {
			return r.rcode
		}
		f := strings.Fields(r.rrs[0])
		return f[len(f)-1]
	}
	if got := first(bAddr, "www.example.test."); got != "10.0.0.1" {
		t.Fatalf("before: %s", got)
	}
	two := one + fmt.Sprintf("example.test:%[1]d {\n    bind %[2]s\n    cache 10\n    forward . %[3]s\n}\n", p, b, upB)
	tmp := conf + ".tmp"
	if err := os.WriteFile(tmp, []byte(two), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, conf); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for first(bAddr, "www.example.test.") != "10.0.0.2" {
		if time.Since(began) > 2*time.Second {
			t.Fatalf("views change not applied within 2s:\n%s", lo.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("views change applied in %v", time.Since(began))
	if got := first(aAddr, "www.example.test."); got != "10.0.0.1" {
		t.Errorf("the other address: %s", got)
	}
	if r := ask(t, bAddr, "www.example.test.", dns.TypeA); len(r.ttls) != 1 || r.ttls[0] > 10 {
		t.Errorf("the new block's cap: %v", r.ttls)
	}
	if r := ask(t, bAddr, "www.example.org.", dns.TypeA); r.rcode != "NOERROR" {
		t.Errorf("the shared block on the new view: %s", r.rcode)
	}
}
