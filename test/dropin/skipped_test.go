package dropin

import (
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

// skippedCorefile holds every entry the stock node-cache skips where a
// strict reader would refuse the Corefile: hosts lines with no address, an
// address without a name, a misspelt option (CoreDNS reads it as an entry
// and skips it), and zones that are no domain name in hosts', template's,
// fallthrough's, cache's, disable's, except's and metadata's zone lists.
// HOSTS is a hosts file with unparsable lines too; DIR a directory, which
// CoreDNS warns of and serves the inline entries.
const skippedCorefile = `.:PORT {
    bind 127.0.0.1
    metadata a..b
    cache 30 a..b example.org h.example t.example {
        disable denial x..y
    }
    hosts HOSTS h.example a..b {
        10.0.0.1 a.h.example
        not-an-ip b.h.example
        10.0.0.2
        tll 30
        10.0.0.3 c.h.example
        fallthrough a..b h.example
    }
    template IN A t.example a..b {
        answer "{{ .Name }} 60 IN A 10.1.1.1"
        fallthrough x..y
    }
    forward . UP {
        except a..b
    }
}
dir.example:PORT {
    bind 127.0.0.1
    hosts DIR {
        10.0.0.5 a.dir.example
    }
}
`

// The lines of skippedCorefile skipped, and the hosts file's.
var (
	skippedLines = []int{3, 4, 5, 7, 9, 10, 11, 13, 15, 17, 20, 25}
	skippedHosts = "10.0.0.9 f.h.example\nbogus g.h.example\n10.0.0.8\n"
)

// What the stock starts, we start: the stock node-cache and ours both
// start on skippedCorefile and answer its names alike (the entries kept
// answer, the skipped ones change nothing); ours logs each skipped entry
// once with its file and line, counts them
// (nodelocaldns_config_skipped_entries, the Corefile's and the hosts
// file's), lists them in -check-config, and a reload that adds one logs
// that one only.
func TestSkippedEntriesWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stockBin, oursBin := stockBinary(t), buildNodelocaldns(t)
	up := upstream(t, "192.0.2.1")
	dir := t.TempDir()
	hostsFile := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hostsFile, []byte(skippedHosts), 0o644); err != nil {
		t.Fatal(err)
	}
	free := func() int { return testhost.FreePort(t, "127.0.0.1") }
	pOurs, pStock, mOurs := free(), free(), fmt.Sprintf("127.0.0.1:%d", free())
	text := func(p int) string {
		return strings.NewReplacer("PORT", fmt.Sprint(p), "UP", up, "HOSTS", hostsFile, "DIR", dir).Replace(skippedCorefile)
	}
	confOurs, confStock := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "stock.Corefile")
	for f, p := range map[string]int{confOurs: pOurs, confStock: pStock} {
		if err := os.WriteFile(f, []byte(text(p)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-localip", "127.0.0.1", "-conf", confOurs, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm=",
		"-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown", "-kube-dns", fmt.Sprintf("127.0.0.1:%d", free()),
		"-metrics-listen-address", mOurs, "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", free())}
	check, err := exec.Command(oursBin, append(args, "-check-config")...).CombinedOutput()
	if err != nil {
		t.Fatalf("-check-config: %v\n%s", err, check)
	}
	for _, l := range skippedLines {
		if !strings.Contains(string(check), fmt.Sprintf("skipped:          %s:%d: ", confOurs, l)) {
			t.Errorf("-check-config does not list line %d:\n%s", l, check)
		}
	}
	for _, l := range []int{2, 3} {
		if !strings.Contains(string(check), fmt.Sprintf("skipped:          %s:%d: ", hostsFile, l)) {
			t.Errorf("-check-config does not list %s:%d:\n%s", hostsFile, l, check)
		}
	}
	logs := new(testhost.SyncBuffer)
	start(t, append([]string{oursBin}, args...), logs)
	start(t, []string{stockBin, "-localip", "127.0.0.1", "-conf", confStock, "-basecorefile", filepath.Join(dir, "none"),
		"-setupinterface=false", "-setupiptables=false", "-skipteardown", "-health-port", fmt.Sprint(free()),
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", free())}, new(testhost.SyncBuffer))
	aOurs, aStock := fmt.Sprintf("127.0.0.1:%d", pOurs), fmt.Sprintf("127.0.0.1:%d", pStock)
	waitDNS(t, aOurs)
	waitDNS(t, aStock)
	for _, name := range []string{"a.h.example.", "b.h.example.", "c.h.example.", "f.h.example.", "g.h.example.", "x.t.example.", "www.example.org.", "a.dir.example."} {
		if s, o := ask(t, aStock, name, dns.TypeA), ask(t, aOurs, name, dns.TypeA); fmt.Sprint(s.rcode, s.rrs) != fmt.Sprint(o.rcode, o.rrs) {
			t.Errorf("%s: stock %s %v, ours %s %v", name, s.rcode, s.rrs, o.rcode, o.rrs)
		}
	}
	out := logs.String()
	for _, l := range skippedLines {
		if n := strings.Count(out, fmt.Sprintf("at=%s:%d ", confOurs, l)); n != 1 {
			t.Errorf("line %d logged %d times:\n%s", l, n, out)
		}
	}
	for _, l := range []string{"line=2 ", "line=3 "} {
		if !strings.Contains(out, "file="+hostsFile+" "+l) {
			t.Errorf("hosts file %s not logged:\n%s", l, out)
		}
	}
	metric := func(file string) float64 {
		return tapMetric(t, mOurs, `nodelocaldns_config_skipped_entries{file="`+file+`"}`)
	}
	if c, h := metric(confOurs), metric(hostsFile); c != float64(len(skippedLines)) || h != 2 {
		t.Errorf("nodelocaldns_config_skipped_entries: Corefile %v, hosts file %v; want %d, 2", c, h, len(skippedLines))
	}
	// A reload adding one more: that one is logged, the others not again.
	edited := strings.Replace(text(pOurs), "        10.0.0.3 c.h.example\n", "        10.0.0.3 c.h.example\n        10.0.0.4\n", 1)
	if err := os.WriteFile(confOurs+".tmp", []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(confOurs+".tmp", confOurs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for metric(confOurs) != float64(len(skippedLines)+1) {
		if time.Now().After(deadline) {
			t.Fatalf("the reload's skipped entry not counted within 5 s:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out = logs.String()
	if !strings.Contains(out, fmt.Sprintf("at=%s:13 directive=hosts entry=10.0.0.4 ", confOurs)) {
		t.Errorf("the reload's skipped entry not logged:\n%s", out)
	}
	if n := strings.Count(out, "Corefile entry skipped"); n != len(skippedLines)+1 {
		t.Errorf("%d skipped entries logged, want each once (%d), the lines moved by the edit too:\n%s", n, len(skippedLines)+1, out)
	}
}
