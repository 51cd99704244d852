package autopath_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// externalNames answers api-N.example.com with A and AAAA and the rest
// from the zone: the bench pod's external names.
type externalNames struct{ *upstream }

func (e externalNames) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	if !strings.HasPrefix(name, "api-") || strings.Count(name, ".") != 3 || !strings.HasSuffix(name, ".example.com.") {
		e.upstream.ServeDNS(w, r)
		return
	}
	e.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	switch q.Qtype {
	case dns.TypeA:
		rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.10")
		m.Answer = append(m.Answer, rr)
	case dns.TypeAAAA:
		rr, _ := dns.NewRR(q.Name + " 300 IN AAAA 2001:db8::10")
		m.Answer = append(m.Answer, rr)
	}
	_ = w.WriteMsg(m)
}

// cpuNanos is the process's CPU time in ns of scheduler time: the sum of
// its threads' /proc/PID/task/TID/schedstat (Go's threads live as long as
// the process, so none is lost by exiting; clock ticks would be too coarse
// for a few seconds' run).
func cpuNanos(t *testing.T, pid int) int64 {
	t.Helper()
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no threads of %d: %v", pid, err)
	}
	var n int64
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.ParseInt(f[0], 10, 64)
			n += v
		}
	}
	return n
}

// TestAutopathBenchWorkload is issue 15's bench workload, not a test: a
// pod (bench/podclient, Go's resolver, ndots:5 and the kubelet's search
// list) resolves external names at a fixed rate against the binary, without
// and with -autopath; it reports the queries the daemon received and its
// CPU per lookup. Runs only with NLD_AUTOPATH_BENCH=1 (bench/run.sh with
// BENCH_AUTOPATH=1); NLD_AUTOPATH_BENCH_DURATION (5s), _RATE (500 lookups/s)
// and _NAMES (200) shape it; NLD_AUTOPATH_BENCH_OUT gets the result lines.
func TestAutopathBenchWorkload(t *testing.T) {
	if os.Getenv("NLD_AUTOPATH_BENCH") != "1" {
		t.Skip("a bench workload: NLD_AUTOPATH_BENCH=1 (bench/run.sh BENCH_AUTOPATH=1)")
	}
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	duration, rate, nnames := env("NLD_AUTOPATH_BENCH_DURATION", "5s"), env("NLD_AUTOPATH_BENCH_RATE", "500"), env("NLD_AUTOPATH_BENCH_NAMES", "200")
	need(t, "needs root for network namespaces", os.Geteuid() == 0)
	need(t, "needs ip (iproute2) and unshare", lookPath("ip") && lookPath("unshare"))
	p, _ := setupPod(t)
	api := apiWithPod(t, "web", p.ip.String())

	dir := t.TempDir()
	bin, client := filepath.Join(dir, "nodelocaldns"), filepath.Join(dir, "podclient")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	build := exec.Command("go", "build", "-o", client, "./podclient")
	build.Dir, build.Env = "../../bench", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build podclient: %v\n%s", err, out)
	}
	upIP := testhost.Loopback()
	up := &upstream{z: newZone()}
	startUpstreamHandler(t, upIP+":53", externalNames{up})
	nodeResolv := filepath.Join(dir, "node.resolv.conf")
	if err := os.WriteFile(nodeResolv, []byte("nameserver "+upIP+"\nsearch corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"-localip", p.hostIP.String(), "-kube-dns", upIP, "-resolv-conf", nodeResolv, "-kubednscm", ""}
	creds := credentials(t, api, dir)

	var lines []string
	measure := func(what string, d *daemon) (perLookup, cpuPerLookup float64) {
		// A warm-up round: every name once, so both runs measure a warm cache.
		warm := exec.Command("ip", "netns", "exec", p.ns, client, "-names", nnames, "-rate", "1000", "-duration", "1s")
		warm.Env = append(os.Environ(), "GODEBUG=netdns=go")
		if out, err := warm.CombinedOutput(); err != nil {
			t.Fatalf("warm-up: %v\n%s", err, out)
		}
		q0, c0, u0 := d.requests(), cpuNanos(t, d.pid), up.queries.Load()
		run := exec.Command("ip", "netns", "exec", p.ns, client, "-names", nnames, "-rate", rate, "-duration", duration)
		run.Env = append(os.Environ(), "GODEBUG=netdns=go")
		out, err := run.CombinedOutput()
		if err != nil {
			t.Fatalf("podclient: %v\n%s", err, out)
		}
		q, c, u := d.requests()-q0, cpuNanos(t, d.pid)-c0, up.queries.Load()-u0
		var lookups, failed int64
		if _, err := fmt.Sscanf(string(out), "lookups %d failed %d", &lookups, &failed); err != nil || lookups == 0 {
			t.Fatalf("podclient said %q", out)
		}
		perLookup, cpuPerLookup = float64(q)/float64(lookups), float64(c)/1e3/float64(lookups)
		line := fmt.Sprintf("%-12s lookups %6d failed %d  queries received %7d (%.2f per lookup)  upstream %d  daemon CPU %.1f µs per lookup",
			what, lookups, failed, q, perLookup, u, cpuPerLookup)
		t.Log(line)
		lines = append(lines, line)
		return perLookup, cpuPerLookup
	}
	off := startDaemon(t, bin, nil, common...)
	qOff, cOff := measure("no autopath", off)
	off.stop()
	on := startDaemon(t, bin, creds, append(common, "-autopath", "-node-name", "node1")...)
	on.waitFor(`^nodelocaldns_autopath_pod_watch_synced 1`, "synced")
	on.waitFor(`^nodelocaldns_autopath_pods 1`, "knowing the pod")
	qOn, cOn := measure("-autopath", on)
	for _, l := range strings.Split(on.scrape(), "\n") {
		if strings.HasPrefix(l, "nodelocaldns_autopath_") && !strings.HasSuffix(l, " 0") {
			t.Log(l)
		}
	}
	ratio := fmt.Sprintf("with/without: queries received %.2f, CPU per lookup %.2f (%s at %s lookups/s, %s names)", qOn/qOff, cOn/cOff, duration, rate, nnames)
	t.Log(ratio)
	lines = append(lines, ratio)
	if out := os.Getenv("NLD_AUTOPATH_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
