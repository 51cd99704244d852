package deploy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// countingKubeDNS serves every A question with 192.0.2.1 for 5 minutes on
// a loopback address of its own, over UDP and TCP, and counts questions.
func countingKubeDNS(t *testing.T) (addr string, asked *atomic.Int64) {
	t.Helper()
	ip := testhost.Loopback()
	addr = fmt.Sprintf("%s:%d", ip, testhost.FreePort(t, ip))
	asked = new(atomic.Int64)
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		asked.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	for _, network := range []string{"udp", "tcp"} {
		// No limit on queries per connection: the daemon pipelines them
		// (miekg/dns closes a connection after 128 by default).
		srv := &dns.Server{Addr: addr, Net: network, Handler: h, MaxTCPQueries: -1}
		started := make(chan error, 1)
		srv.NotifyStartedFunc = func() { started <- nil }
		go func() { started <- srv.ListenAndServe() }()
		if err := <-started; err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return addr, asked
}

// askNames asks every name over UDP, 16 at a time; every answer must be
// NOERROR with an address.
func askNames(t *testing.T, addr string, names []string) {
	t.Helper()
	var wg sync.WaitGroup
	ch := make(chan string)
	var failed atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Timeout: 3 * time.Second}
			for n := range ch {
				m := new(dns.Msg)
				m.SetQuestion(n, dns.TypeA)
				r, _, err := c.Exchange(m, addr)
				if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
					if failed.Add(1) <= 3 {
						t.Errorf("%s: %v %v", n, r, err)
					}
				}
			}
		}()
	}
	for _, n := range names {
		ch <- n
	}
	close(ch)
	wg.Wait()
}

// metricValue is the value of the series named exactly series on the
// metrics page url, -1 when absent.
func metricValue(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestWarmAfterSIGKILL (issue 42, "Warm after a crash, too"): 10,000 names
// cached by the daemon, which is then killed with SIGKILL and started
// again with the same arguments and state directory: asking the names
// again sends at most 5% of them upstream (the cache holds 9,984; the
// snapshot is written every second). Killed again within a minute of
// loading it, the next start does not load it (a crash loop is not fed
// the same cache) and sends every name upstream, as every restart did
// before the snapshot.
func TestWarmAfterSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	kube, asked := countingKubeDNS(t)
	ip := testhost.Loopback()
	port := testhost.FreePort(t, ip)
	metrics := fmt.Sprintf("%s:%d", ip, testhost.FreePort(t, ip))
	dir := stateDir(t)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+strings.Split(kube, ":")[0]+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := func(extra ...string) *instance {
		args := append([]string{"-localip", ip, "-port", strconv.Itoa(port), "-kube-dns", kube, "-resolv-conf", rc, "-kubednscm=",
			"-setupinterface=false", "-setupiptables=false", "-metrics-listen-address", metrics, "-health-port", "0",
			"-state-dir", dir, "-udp-sockets", "2", "-lameduck", "0s", "-cluster-success-ttl", "5m", "-cache-snapshot-interval", "1s"}, extra...)
		in := startInstance(t, exec.CommandContext(ctx, bin, args...))
		for deadline := time.Now().Add(15 * time.Second); metricValue(t, "http://"+metrics+"/metrics", "nodelocaldns_cache_snapshot_bytes") < 0; time.Sleep(20 * time.Millisecond) {
			select {
			case <-in.exited:
				t.Fatalf("daemon exited: %v\n%s", in.err, in.log)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("not serving within 15s\n%s", in.log)
			}
		}
		return in
	}
	kill := func(in *instance) {
		_ = in.cmd.Process.Signal(unix.SIGKILL)
		<-in.exited
	}
	names := make([]string, 10000)
	for i := range names {
		names[i] = fmt.Sprintf("warm%d.default.svc.cluster.local.", i)
	}
	dnsAddr := fmt.Sprintf("%s:%d", ip, port)

	a := start()
	askNames(t, dnsAddr, names)
	if n := asked.Load(); n < int64(len(names)) {
		t.Fatalf("kube-dns was asked %d times for %d names", n, len(names))
	}
	// The snapshot holds the whole cache (9,984 answers) within a second or two.
	for deadline := time.Now().Add(15 * time.Second); metricValue(t, "http://"+metrics+"/metrics", "nodelocaldns_cache_snapshot_entries") < 9984; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot of the cache within 15s\n%s", a.log)
		}
	}
	writes := metricValue(t, "http://"+metrics+"/metrics", `nodelocaldns_cache_snapshot_writes_total{result="written"}`)
	cpu := metricValue(t, "http://"+metrics+"/metrics", "nodelocaldns_cache_snapshot_write_cpu_seconds_total")
	size := metricValue(t, "http://"+metrics+"/metrics", "nodelocaldns_cache_snapshot_bytes")
	t.Logf("A: %.0f snapshots written, %.2f ms of CPU each on average; the last %.0f bytes", writes, 1000*cpu/writes, size)
	kill(a)

	b := start()
	before := asked.Load()
	askNames(t, dnsAddr, names)
	sent := asked.Load() - before
	t.Logf("SIGKILL, restart with the snapshot: %d of %d names asked upstream again (%.2f%%)\n%s", sent, len(names), 100*float64(sent)/float64(len(names)),
		grepLine(b.log.String(), "cache snapshot"))
	if !strings.Contains(b.log.String(), "loaded the cache snapshot") {
		t.Errorf("the restarted daemon did not load the snapshot:\n%s", b.log)
	}
	if sent > int64(len(names))*5/100 {
		t.Errorf("%d of %d names went upstream after the restart, want at most 5%%", sent, len(names))
	}
	kill(b)

	// B loaded the snapshot and was killed within a minute: C does not
	// feed what B loaded to a crash loop, and starts as every restart did
	// before the snapshot, cold.
	c := start()
	before = asked.Load()
	askNames(t, dnsAddr, names)
	cold := asked.Load() - before
	t.Logf("SIGKILL of the instance that had loaded the snapshot, within a minute, restart: %d of %d names asked upstream again (%.2f%%)\n%s",
		cold, len(names), 100*float64(cold)/float64(len(names)), grepLine(c.log.String(), "cache snapshot"))
	if !strings.Contains(c.log.String(), "died within 1m0s of starting: not loaded again") {
		t.Errorf("C loaded the snapshot B had loaded:\n%s", c.log)
	}
	if cold < int64(len(names))*95/100 {
		t.Errorf("a cold start sent only %d of %d names upstream: the measure proves nothing", cold, len(names))
	}
	kill(c)
}

// grepLine is the first line of s containing sub.
func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
