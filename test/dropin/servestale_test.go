package dropin

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// flipUpstream answers every name with an A record (TTL 2) while phase is
// good, with the non-answer its first label names while flipped, and with
// a new address once recovered; it counts the queries per name.
type flipUpstream struct {
	phase  atomic.Int32 // 0 good, 1 flipped, 2 recovered
	mu     sync.Mutex
	counts map[string]int
}

const (
	phaseGood = iota
	phaseFlipped
	phaseRecovered
)

func (u *flipUpstream) count(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[strings.ToLower(name)]
}

func (u *flipUpstream) serve(t *testing.T) string {
	t.Helper()
	u.counts = map[string]int{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		name := strings.ToLower(q.Name)
		u.mu.Lock()
		u.counts[name]++
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		zone := name[strings.IndexByte(name, '.')+1:]
		rr := func(s string) dns.RR {
			x, err := dns.NewRR(s)
			if err != nil {
				panic(err)
			}
			return x
		}
		soa := rr(zone + " 2 IN SOA ns." + zone + " host." + zone + " 1 7200 1800 86400 2")
		addr := "192.0.2.1"
		switch u.phase.Load() {
		case phaseRecovered:
			addr = "192.0.2.2"
		case phaseFlipped:
			switch label := name[:strings.IndexByte(name, '.')]; label {
			case "nx":
				m.Rcode = dns.RcodeNameError
				m.Ns = []dns.RR{soa}
			case "nodata":
				m.Ns = []dns.RR{soa}
			case "empty":
			case "referral":
				m.Ns = []dns.RR{rr(name + " 2 IN NS ns.elsewhere.example.")}
			case "extra":
				m.Extra = []dns.RR{rr(name + " 2 IN A 192.0.2.77")}
			case "sf":
				m.Rcode = dns.RcodeServerFailure
			}
			_ = w.WriteMsg(m)
			return
		}
		m.Answer = []dns.RR{rr(q.Name + " 2 IN A " + addr)}
		_ = w.WriteMsg(m)
	})
	return serveDNS(t, h)
}

// serveStaleCorefile: one block per behaviour, each on the same timeline.
// %[1]d the port, %[2]s the upstream.
const serveStaleCorefile = `lkg.example:%[1]d {
    cache {
        success 9984 2 1
        denial 9984 2 1
        serve_stale 1h immediate 30s
        serve_stale_policy prefer_positive
    }
    forward . %[2]s
}
plain.example:%[1]d {
    cache {
        success 9984 2 1
        denial 9984 2 1
        serve_stale 1h immediate 30s
    }
    forward . %[2]s
}
verify.example:%[1]d {
    cache {
        success 9984 2 1
        denial 9984 2 1
        serve_stale 1h verify 0s 30s
        serve_stale_policy prefer_positive
    }
    forward . %[2]s
}
recheck.example:%[1]d {
    cache {
        success 9984 2 1
        denial 9984 2 1
        serve_stale 1h immediate 30s 3s
        serve_stale_policy prefer_positive
    }
    forward . %[2]s
}
zerottl.example:%[1]d {
    cache {
        success 9984 2 1
        denial 9984 2 1
        serve_stale 1h immediate 0s
        serve_stale_policy prefer_positive
    }
    forward . %[2]s
}
window.example:%[1]d {
    cache {
        success 9984 2 1
        denial 9984 2 1
        serve_stale 1s immediate 30s
        serve_stale_policy prefer_positive
    }
    forward . %[2]s
}
`

// TestServeStalePolicyParityWithCoreDNS: CoreDNS 1.15's serve_stale (its
// modes, response TTL and failure recheck) and serve_stale_policy
// prefer_positive, against the CoreDNS 1.15 binary: an upstream that turns
// a name into NXDOMAIN, NODATA, an empty NOERROR, a referral, additional
// data only or SERVFAIL, then back to an answer. At each step both servers
// give the same rcode and records, and TTLs within a second (stale answers
// carry the response TTL, 30, or 0 where it is given as 0); the blocks with a failure recheck ask their
// upstream as often as CoreDNS does.
func TestServeStalePolicyParityWithCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	oursBin, coredns := buildNodelocaldns(t), buildCoreDNS(t)
	var upOurs, upCore flipUpstream
	aUpOurs, aUpCore := upOurs.serve(t), upCore.serve(t)
	kube := upstream(t, "10.96.1.1")
	dir := t.TempDir()
	pOurs, pCore := testhost.FreePort(t, "127.0.0.1"), testhost.FreePort(t, "127.0.0.1")
	confOurs, confCore := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "coredns.Corefile")
	for _, f := range []struct {
		path string
		port int
		up   string
	}{{confOurs, pOurs, aUpOurs}, {confCore, pCore, aUpCore}} {
		if err := os.WriteFile(f.path, []byte(fmt.Sprintf(serveStaleCorefile, f.port, f.up)), 0o644); err != nil {
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

	modes := []string{"nx", "nodata", "empty", "referral", "extra", "sf"}
	zones := []string{"lkg", "plain", "verify", "recheck", "window", "zerottl"}
	var names []string
	for _, z := range zones {
		for _, m := range modes {
			names = append(names, m+"."+z+".example.")
		}
	}
	compare := func(step string, only func(name string) bool) {
		t.Helper()
		var wg sync.WaitGroup
		res := make([][2]fullAnswer, len(names))
		for i, n := range names {
			if only != nil && !only(n) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = [2]fullAnswer{askFull(t, aOurs, n, dns.TypeA), askFull(t, aCore, n, dns.TypeA)}
			}()
		}
		wg.Wait()
		for i, n := range names {
			if only != nil && !only(n) {
				continue
			}
			o, c := res[i][0], res[i][1]
			if o.String() != c.String() {
				t.Errorf("%s %s:\n ours    %s\n coredns %s", step, n, o, c)
				continue
			}
			for _, p := range [][2][]uint32{{o.answerTTL, c.answerTTL}, {o.nsTTL, c.nsTTL}} {
				for j := range p[0] {
					if d := int(p[0][j]) - int(p[1][j]); d < -1 || d > 1 {
						t.Errorf("%s %s: TTLs ours %v coredns %v", step, n, p[0], p[1])
						break
					}
				}
			}
		}
	}
	in := func(zone string) func(string) bool {
		return func(n string) bool { return strings.HasSuffix(n, "."+zone+".example.") }
	}
	not := func(zone string) func(string) bool {
		return func(n string) bool { return !strings.HasSuffix(n, "."+zone+".example.") }
	}
	t0 := time.Now()
	at := func(d time.Duration) { time.Sleep(time.Until(t0.Add(d))) }

	compare("warm", nil) // every name: A 192.0.2.1
	upOurs.phase.Store(phaseFlipped)
	upCore.phase.Store(phaseFlipped)
	at(2600 * time.Millisecond)
	compare("expired, upstream flipped", nil) // stale 192.0.2.1, TTL 30 (verify: after the refresh failed)
	at(3300 * time.Millisecond)
	// lkg, verify, recheck: the last good answer; plain: the upstream's
	// word; window: past its 1 s window, the upstream's word.
	compare("flipped, refreshed", nil)
	upOurs.phase.Store(phaseRecovered)
	upCore.phase.Store(phaseRecovered)
	at(3900 * time.Millisecond)
	// immediate: stale and refreshed behind; verify: the refresh;
	// recheck: stale without asking (its recheck runs to ~5.6 s).
	qOurs, qCore := upOurs.count("nx.recheck.example."), upCore.count("nx.recheck.example.")
	compare("recovered", not("plain"))
	at(4500 * time.Millisecond)
	compare("recovered, refreshed", not("plain"))
	if a, b := upOurs.count("nx.recheck.example.")-qOurs, upCore.count("nx.recheck.example.")-qCore; a != b || a != 0 {
		t.Errorf("recheck: %d upstream queries from us, %d from CoreDNS during the failure recheck, want 0", a, b)
	}
	at(6200 * time.Millisecond)
	compare("recheck over", in("recheck"))
	at(6800 * time.Millisecond)
	compare("recheck over, refreshed", in("recheck"))
	if t.Failed() {
		t.Logf("upstream queries per name: ours %v, coredns %v", upOurs.counts, upCore.counts)
	}
}

// TestLastKnownGoodFlag: without a Corefile, -last-known-good keeps the
// last records of the zones it lists when kube-dns flips a name to
// NXDOMAIN or to an empty NOERROR, within the stale window, and counts it
// per zone; a name outside the listed zone gets the upstream's word, as
// without the flag.
func TestLastKnownGoodFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildNodelocaldns(t)
	var up flipUpstream
	kube := up.serve(t)
	port, metricsPort := testhost.FreePort(t, "127.0.0.1"), testhost.FreePort(t, "127.0.0.1")
	var logs testhost.SyncBuffer
	start(t, []string{bin, "-localip", "127.0.0.1", "-port", fmt.Sprint(port), "-kubednscm=", "-kube-dns", kube,
		"-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-cluster-success-ttl", "2s", "-cluster-denial-ttl", "2s", "-last-known-good", "svc.cluster.local", "-stale-recheck", "1s",
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", metricsPort), "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))}, &logs)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitDNS(t, addr)
	kept := []string{"nx.svc.cluster.local.", "empty.svc.cluster.local."}
	other := []string{"nx.pod.cluster.local.", "empty.pod.cluster.local."}
	for _, n := range append(append([]string{}, kept...), other...) {
		if a := askFull(t, addr, n, dns.TypeA); a.rcode != "NOERROR" || len(a.answer) != 1 {
			t.Fatalf("warm %s: %s", n, a)
		}
	}
	up.phase.Store(phaseFlipped)
	time.Sleep(2500 * time.Millisecond)
	for round := 0; round < 3; round++ {
		for _, n := range kept {
			a := askFull(t, addr, n, dns.TypeA)
			if a.rcode != "NOERROR" || len(a.answer) != 1 || !strings.Contains(a.answer[0], "192.0.2.1") || a.answerTTL[0] != 30 {
				t.Errorf("round %d %s: %s TTLs %v, want the last good answer, stale (TTL 30)", round, n, a, a.answerTTL)
			}
		}
		for _, n := range other {
			if a := askFull(t, addr, n, dns.TypeA); len(a.answer) != 0 {
				t.Errorf("round %d %s: %s, want the upstream's word", round, n, a)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var served float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, `nodelocaldns_cache_last_known_good_served_total{zone="svc.cluster.local."} `) {
			served, _ = strconv.ParseFloat(strings.Fields(line)[1], 64)
		}
	}
	if served < 6 {
		t.Errorf("last_known_good_served_total for svc.cluster.local. = %v, want at least 6:\n%s", served, body)
	}
	if n := strings.Count(logs.String(), "does not answer the question"); n != len(kept) {
		t.Errorf("%d log lines for %d names that changed state once:\n%s", n, len(kept), logs.String())
	}
	// The upstream answers again: the new records, once the failure
	// recheck (1 s here) is over.
	up.phase.Store(phaseRecovered)
	time.Sleep(2100 * time.Millisecond)
	for _, n := range append(append([]string{}, kept...), other...) {
		if a := askFull(t, addr, n, dns.TypeA); len(a.answer) != 1 || !strings.Contains(a.answer[0], "192.0.2.2") {
			t.Errorf("recovered %s: %s", n, a)
		}
	}
	if n := strings.Count(logs.String(), "the upstream answers again"); n != len(kept) {
		t.Errorf("%d recovery log lines for %d names:\n%s", n, len(kept), logs.String())
	}
}
