package fallback

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHitCostOfTheRules measures what the fallback's rules cost a cache
// hit (the socket lookup and the xt_recent check of the query's NOTRACK
// rule): dnsperf in the pod's namespace against the link-local address, one
// name (every query a hit), at full speed, the daemon started alternately
// with the stock's rules (-fallback-after=0) and with the fallback's, the
// same binary, NLD_FALLBACK_BENCH_REPS times each, interleaved. It prints
// the medians and their ratio. A measurement, not a check: it runs only
// with NLD_FALLBACK_BENCH=1 (the machine's noise decides its spread).
func TestHitCostOfTheRules(t *testing.T) {
	if os.Getenv("NLD_FALLBACK_BENCH") == "" {
		t.Skip("a measurement: NLD_FALLBACK_BENCH=1 runs it")
	}
	inNode(t, "dnsperf")
	reps := 5
	if v, err := strconv.Atoi(os.Getenv("NLD_FALLBACK_BENCH_REPS")); err == nil && v > 0 {
		reps = v
	}
	flushAll(t)
	t.Cleanup(func() { flushAll(t) })
	n := newNode(t)
	startKubeDNS(t, n)
	kubeProxyIPTables(t, "nft", v4)
	queries := filepath.Join(t.TempDir(), "queries")
	if err := os.WriteFile(queries, []byte("svc-1.default.svc.cluster.local A\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	qps := map[string][]float64{}
	cpu := map[string][]float64{}
	for rep := range reps {
		for _, mode := range []string{"stock rules", "fallback rules"} {
			d := newDaemon(t, cluster{backend: "nft", f: v4})
			if mode == "stock rules" {
				d.argv = append(d.argv, "-fallback-after", "0")
			}
			d.start()
			out, err := exec.Command("ip", "netns", "exec", n.pod, "dnsperf", "-s", v4.local.String(), "-d", queries,
				"-l", "1", "-c", "8", "-q", "64").CombinedOutput() // warm: the name is cached from here on
			if err != nil {
				t.Fatalf("dnsperf: %v: %s", err, out)
			}
			before := procCPU(t, d.cmd.Process.Pid)
			out, err = exec.Command("ip", "netns", "exec", n.pod, "dnsperf", "-s", v4.local.String(), "-d", queries,
				"-l", "5", "-c", "8", "-q", "64").CombinedOutput()
			if err != nil {
				t.Fatalf("dnsperf: %v: %s", err, out)
			}
			used := procCPU(t, d.cmd.Process.Pid) - before
			q, done := dnsperfResult(t, string(out))
			qps[mode] = append(qps[mode], q)
			cpu[mode] = append(cpu[mode], float64(used.Microseconds())/float64(done))
			t.Logf("rep %d %s: %.0f queries/s, daemon %.2f µs CPU per query", rep, mode, q, cpu[mode][len(cpu[mode])-1])
			_ = d.signal(9)
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, m := range []string{"stock rules", "fallback rules"} {
		t.Logf("%s: median %.0f queries/s (range %.0f-%.0f), daemon CPU %.2f µs per query (range %.2f-%.2f)",
			m, med(qps[m]), slices.Min(qps[m]), slices.Max(qps[m]), med(cpu[m]), slices.Min(cpu[m]), slices.Max(cpu[m]))
	}
	t.Logf("fallback / stock: QPS %.3f, daemon CPU per query %.3f (%d reps each, interleaved)",
		med(qps["fallback rules"])/med(qps["stock rules"]), med(cpu["fallback rules"])/med(cpu["stock rules"]), reps)
}

var (
	dnsperfQPS  = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)
	dnsperfDone = regexp.MustCompile(`Queries completed:\s+([0-9]+)`)
)

func dnsperfResult(t *testing.T, out string) (qps float64, done int64) {
	t.Helper()
	m, c := dnsperfQPS.FindStringSubmatch(out), dnsperfDone.FindStringSubmatch(out)
	if m == nil || c == nil {
		t.Fatalf("dnsperf output:\n%s", out)
	}
	qps, _ = strconv.ParseFloat(m[1], 64)
	done, _ = strconv.ParseInt(c[1], 10, 64)
	return qps, done
}

// procCPU is a process's user and system time.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}
