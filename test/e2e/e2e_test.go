// Package e2e tests nodelocaldns on a real single-node Kubernetes cluster:
// the image built from the Dockerfile, deploy/daemonset.yaml as docs/deploy.md
// renders it, a kubelet whose clusterDNS is the link-local address, kube-dns
// (CoreDNS) behind its Service and kube-proxy in iptables mode. run.sh (make
// e2e) brings the cluster up and runs these tests inside the node's network
// and mount namespaces; without it (NLD_E2E_KUBECTL unset) they skip.
//
// The tests run in file order and share one client pod; the last one
// deletes the DaemonSet.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

var (
	kubectlBin = os.Getenv("NLD_E2E_KUBECTL")
	kubeDNSIP  = os.Getenv("NLD_E2E_KUBEDNS")
	localDNS   = os.Getenv("NLD_E2E_LOCALDNS")
	stubIP     = os.Getenv("NLD_E2E_STUB")
)

const (
	clientPod = "client"
	// externalName is served only by the stand-in upstream, the node's
	// resolver (run.sh): it reaches the pod through nodelocaldns's
	// forwarding to the node's resolv.conf.
	externalName = "external.e2e.example"
	externalIP   = "192.0.2.80"
	stubName     = "www.stub.e2e.example"
	stubAnswer   = "192.0.2.53"
)

func TestMain(m *testing.M) {
	if kubectlBin == "" {
		fmt.Println("e2e: NLD_E2E_KUBECTL not set: these tests run in the cluster make e2e brings up (test/e2e/run.sh)")
		os.Exit(0)
	}
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: setup:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// setup creates the objects the tests resolve and the client pod.
func setup() error {
	objs := `
apiVersion: v1
kind: Namespace
metadata: {name: e2e-other}
---
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec:
  selector: {app: none}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: e2e-other}
spec:
  selector: {app: none}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  dnsPolicy: ClusterFirst
  terminationGracePeriodSeconds: 0
  containers:
    - name: client
      image: localhost/client:e2e
      imagePullPolicy: Never
      command: [sleep, infinity]
`
	if out, err := kubectlIn(objs, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	if out, err := kubectl("wait", "--for=condition=Ready", "pod/"+clientPod, "--timeout=120s"); err != nil {
		return fmt.Errorf("client pod: %v: %s", err, out)
	}
	return nil
}

func kubectl(args ...string) (string, error) { return kubectlIn("", args...) }

func kubectlIn(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectlBin, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// inClient runs a command in the client pod.
func inClient(args ...string) (string, error) {
	return kubectl(append([]string{"exec", clientPod, "--"}, args...)...)
}

// poll calls f until it returns nil or the deadline passes, then fails
// with f's last error.
func poll(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	if _, err := pollFor(within, f); err != nil {
		t.Fatalf("after %v: %v", within, err)
	}
}

// pollFor calls f every 200 ms until it returns nil or within has passed,
// and returns how long that took and f's last error.
func pollFor(within time.Duration, f func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := f()
		if err == nil || time.Since(start) > within {
			return time.Since(start), err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func serviceIP(t *testing.T, ns, name string) string {
	t.Helper()
	return mustKubectl(t, "-n", ns, "get", "svc", name, "-o", "jsonpath={.spec.clusterIP}")
}

// getent resolves name in the client pod with glibc (getent ahostsv4) and
// returns the first address.
func getent(name string) (string, error) {
	out, err := inClient("getent", "ahostsv4", name)
	if err != nil {
		return "", fmt.Errorf("getent ahostsv4 %s: %v: %s", name, err, out)
	}
	f := strings.Fields(out)
	if len(f) == 0 {
		return "", fmt.Errorf("getent ahostsv4 %s: no output", name)
	}
	return f[0], nil
}

func TestResolvConfIsTheKubelets(t *testing.T) {
	got := mustKubectl(t, "exec", clientPod, "--", "cat", "/etc/resolv.conf")
	// The kubelet's: clusterDNS, the pod's search path, ndots:5; the node's
	// resolv.conf (run.sh) has no search line to append.
	want := "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver " + localDNS + "\noptions ndots:5"
	if got != want {
		t.Fatalf("client's /etc/resolv.conf:\n%s\nwant:\n%s", got, want)
	}
}

func TestResolveShortName(t *testing.T) {
	want := serviceIP(t, "default", "hello")
	got, err := getent("hello")
	if err != nil || got != want {
		t.Fatalf("hello: %q, %v; want %s", got, err, want)
	}
}

func TestResolveServiceDotNamespace(t *testing.T) {
	want := serviceIP(t, "e2e-other", "other")
	got, err := getent("other.e2e-other")
	if err != nil || got != want {
		t.Fatalf("other.e2e-other: %q, %v; want %s", got, err, want)
	}
}

func TestResolveExternalName(t *testing.T) {
	got, err := getent(externalName)
	if err != nil || got != externalIP {
		t.Fatalf("%s: %q, %v; want %s (from the node's resolver)", externalName, got, err, externalIP)
	}
}

// metric sums the samples of name (any labels) at url.
// mustMetric is metric failing t on error.
func mustMetric(t *testing.T, url, name string) float64 {
	t.Helper()
	v, err := metric(url, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func metric(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", url, line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("%s: no %s", url, name)
	}
	return sum, sc.Err()
}

func TestQueriesReachTheCacheNotKubeDNS(t *testing.T) {
	kubeDNSPod := mustKubectl(t, "-n", "kube-system", "get", "pod", "-l", "k8s-app=kube-dns", "-o", "jsonpath={.items[0].status.podIP}")
	clientIP := mustKubectl(t, "get", "pod", clientPod, "-o", "jsonpath={.status.podIP}")
	// The pods are host network: the node's address serves their metrics.
	nldURL := "http://127.0.0.1:9253/metrics"
	kdURL := "http://" + kubeDNSPod + ":9153/metrics"
	const lookups = 20
	name := "hello.default.svc.cluster.local"
	if _, err := getent(name); err != nil { // cached from here on
		t.Fatal(err)
	}
	nld0 := mustMetric(t, nldURL, "nodelocaldns_requests_total")
	kd0 := mustMetric(t, kdURL, "coredns_dns_requests_total")
	for range lookups {
		if _, err := getent(name); err != nil {
			t.Fatal(err)
		}
	}
	nld1 := mustMetric(t, nldURL, "nodelocaldns_requests_total")
	kd1 := mustMetric(t, kdURL, "coredns_dns_requests_total")
	t.Logf("%d lookups: nodelocaldns requests +%v, kube-dns requests +%v", lookups, nld1-nld0, kd1-kd0)
	if nld1-nld0 < lookups {
		t.Errorf("nodelocaldns counted %v requests for %d lookups", nld1-nld0, lookups)
	}
	// kube-dns may see the cache's own refreshes, never the pod's lookups.
	if kd1-kd0 >= lookups {
		t.Errorf("kube-dns counted %v requests for %d lookups: the pod reaches it directly", kd1-kd0, lookups)
	}
	// NOTRACK: the pod's DNS leaves no conntrack entry.
	for _, dst := range []string{localDNS, kubeDNSIP} {
		out, err := exec.Command("conntrack", "-L", "-s", clientIP, "-d", dst).CombinedOutput()
		if err != nil {
			t.Fatalf("conntrack -L -s %s -d %s: %v: %s", clientIP, dst, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "dport=53") {
				t.Errorf("conntrack entry for the pod's DNS to %s: %s", dst, line)
			}
		}
	}
}

// In iptables mode the cache also serves the kube-dns ClusterIP: a pod
// asking it directly reaches the cache, not kube-dns, whatever kube-proxy's
// mode (its DNAT, iptables or nftables, never sees the NOTRACK'ed packets:
// untracked packets skip NAT). Asked over UDP and TCP.
func TestClusterIPQueriesReachTheCache(t *testing.T) {
	kubeDNSPod := mustKubectl(t, "-n", "kube-system", "get", "pod", "-l", "k8s-app=kube-dns", "-o", "jsonpath={.items[0].status.podIP}")
	nldURL := "http://127.0.0.1:9253/metrics"
	kdURL := "http://" + kubeDNSPod + ":9153/metrics"
	const lookups = 20
	name := "hello.default.svc.cluster.local"
	want := serviceIP(t, "default", "hello")
	ask := func(proto string) error {
		out, err := inClient("dig", "+short", "+timeout=2", "+tries=1", proto, "@"+kubeDNSIP, name)
		if err != nil || strings.TrimSpace(out) != want {
			return fmt.Errorf("dig %s @%s %s: %q %v, want %s", proto, kubeDNSIP, name, out, err, want)
		}
		return nil
	}
	if err := ask("+notcp"); err != nil { // cached from here on
		t.Fatal(err)
	}
	nld0 := mustMetric(t, nldURL, "nodelocaldns_requests_total")
	kd0 := mustMetric(t, kdURL, "coredns_dns_requests_total")
	for i := range lookups {
		if err := ask([]string{"+notcp", "+tcp"}[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	nld1 := mustMetric(t, nldURL, "nodelocaldns_requests_total")
	kd1 := mustMetric(t, kdURL, "coredns_dns_requests_total")
	t.Logf("%d lookups at the ClusterIP %s (UDP and TCP): nodelocaldns requests +%v, kube-dns requests +%v", lookups, kubeDNSIP, nld1-nld0, kd1-kd0)
	if nld1-nld0 < lookups || kd1-kd0 >= lookups {
		t.Errorf("the ClusterIP's lookups went to kube-dns, not the cache")
	}
}

// nldPods returns the names of the DaemonSet's pods.
func nldPods(t *testing.T) []string {
	t.Helper()
	return strings.Fields(mustKubectl(t, "-n", "kube-system", "get", "pod", "-l", "k8s-app=nodelocaldns", "-o", "jsonpath={.items[*].metadata.name}"))
}

func TestProbesGreen(t *testing.T) {
	pods := nldPods(t)
	if len(pods) != 1 {
		t.Fatalf("nodelocaldns pods: %v, want 1", pods)
	}
	pod := pods[0]
	ready := mustKubectl(t, "-n", "kube-system", "get", "pod", pod, "-o", `jsonpath={.status.containerStatuses[0].ready} {.status.containerStatuses[0].started} {.status.containerStatuses[0].restartCount}`)
	if ready != "true true 0" {
		t.Errorf("container ready, started, restarts: %s; want true true 0", ready)
	}
	for _, probe := range []string{"ready", "health"} {
		out, err := kubectl("-n", "kube-system", "exec", pod, "--", "/nodelocaldns", "-probe", probe, "-state-dir", "/run/nodelocaldns")
		if err != nil {
			t.Errorf("-probe %s: %v: %s", probe, err, out)
		}
	}
	// The startup probe (every 1 s) may fail while the daemon starts; the
	// readiness and liveness probes, which run after it, never.
	ev := mustKubectl(t, "-n", "kube-system", "get", "events", "--field-selector", "involvedObject.name="+pod+",reason=Unhealthy", "-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
	for _, msg := range strings.Split(ev, "\n") {
		switch {
		case msg == "":
		case strings.Contains(msg, "Startup probe"):
			t.Logf("while starting: %s", msg)
		default:
			t.Errorf("probe failure recorded: %s", msg)
		}
	}
}

// resolver runs a lookup loop in the client pod until stop is called and
// returns its counts: each round a glibc lookup of a cluster name and of
// the external name, and a dig with one 1 s try (a lost packet shows as a
// failure instead of a glibc retry).
type resolver struct {
	pod  string
	cmd  *exec.Cmd
	out  testhost.SyncBuffer
	done chan error
}

const loopScript = addrFunc + `rm -f /tmp/stop; ok=0; fail=0; echo started
while [ ! -e /tmp/stop ]; do
  for n in hello.default.svc.cluster.local ` + externalName + `; do
    if getent ahostsv4 $n >/dev/null; then ok=$((ok+1)); else fail=$((fail+1)); echo "FAIL getent $n $(date +%T.%N)"; fi
  done
  if addr "$(dig +short +timeout=1 +tries=1 hello.default.svc.cluster.local)"; then ok=$((ok+1)); else fail=$((fail+1)); echo "FAIL dig $(date +%T.%N)"; fi
done
echo "ok=$ok fail=$fail"`

// addrFunc defines addr, true when its argument is an answer: dig +short
// prints its errors (";; communications error ...", ";; no servers could be
// reached") on stdout, so a non-empty output is not an answer.
const addrFunc = `addr() { case "$1" in [0-9]*.*[0-9]) return 0;; *) return 1;; esac; }
`

func startResolver(t *testing.T) *resolver {
	t.Helper()
	return startResolverIn(t, clientPod, loopScript)
}

// startResolverIn runs script (loopScript or one printing the same
// lines) in pod (default namespace).
func startResolverIn(t *testing.T, pod, script string) *resolver {
	t.Helper()
	r := &resolver{pod: pod, done: make(chan error, 1)}
	r.cmd = exec.Command(kubectlBin, "exec", pod, "--", "sh", "-c", script)
	r.cmd.Stdout = &r.out
	r.cmd.Stderr = &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	return r
}

// stop ends the loop and returns the successful and failed lookups.
func (r *resolver) stop(t *testing.T) (ok, fail int) {
	t.Helper()
	if out, err := kubectl("exec", r.pod, "--", "touch", "/tmp/stop"); err != nil {
		t.Fatalf("stop the loop: %v: %s", err, out)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("lookup loop: %v\n%s", err, r.out.String())
		}
	case <-time.After(time.Minute):
		_ = r.cmd.Process.Kill()
		t.Fatalf("lookup loop did not stop\n%s", r.out.String())
	}
	out := r.out.String()
	i := max(strings.LastIndex(out, "ok="), 0)
	if _, err := fmt.Sscanf(out[i:], "ok=%d fail=%d", &ok, &fail); i < 0 || err != nil {
		t.Fatalf("lookup loop output: %s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "SLOW") {
			t.Logf("%s: %s", r.pod, line)
		}
	}
	return ok, fail
}

func TestRolloutRestartLosesNoLookup(t *testing.T) {
	before := nldPods(t)
	r := startResolver(t)
	// The loop is running before the rollout starts.
	poll(t, 30*time.Second, func() error {
		if !strings.Contains(r.out.String(), "started") {
			return fmt.Errorf("lookup loop not started: %s", r.out.String())
		}
		return nil
	})
	// The hit ratio across the rollout: the old pod's counters before it,
	// the new pod's (its whole life: it serves from the handover on) after.
	nldURL := "http://127.0.0.1:9253/metrics"
	hitRatio := func(when string) {
		hits, err1 := metric(nldURL, "nodelocaldns_cache_hits_total")
		misses, err2 := metric(nldURL, "nodelocaldns_cache_misses_total")
		if err1 != nil || err2 != nil {
			t.Errorf("cache counters %s: %v %v", when, err1, err2)
			return
		}
		t.Logf("cache hit ratio %s: %.1f%% (%.0f hits, %.0f misses)", when, 100*hits/max(hits+misses, 1), hits, misses)
	}
	time.Sleep(2 * time.Second) // the loop runs a while on the old pod
	hitRatio("of the old pod before the rollout")
	start := time.Now()
	mustKubectl(t, "-n", "kube-system", "rollout", "restart", "daemonset/nodelocaldns")
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/nodelocaldns", "--timeout=180s")
	// The old pod is gone (its teardown done) once it is deleted.
	poll(t, 90*time.Second, func() error {
		now := nldPods(t)
		for _, p := range now {
			for _, b := range before {
				if p == b {
					return fmt.Errorf("old pod %s still there (pods %v)", b, now)
				}
			}
		}
		return nil
	})
	t.Logf("rollout done in %v", time.Since(start).Round(time.Millisecond))
	ok, fail := r.stop(t)
	hitRatio("of the new pod, from the handover to the end of the rollout")
	t.Logf("lookups during the rollout: %d ok, %d failed", ok, fail)
	if fail != 0 || ok == 0 {
		t.Fatalf("%d lookups failed (%d ok) during kubectl rollout restart", fail, ok)
	}
	// The cache went with the sockets: the new pod took the old one's
	// entries (the loop's names among them) and says how many.
	now := nldPods(t)
	if len(now) != 1 {
		t.Fatalf("nodelocaldns pods after the rollout: %v", now)
	}
	logs := mustKubectl(t, "-n", "kube-system", "logs", now[0])
	line := ""
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "took the twin's cache") {
			line = l
		}
	}
	var kept int
	if i := strings.Index(line, "kept="); i >= 0 {
		_, _ = fmt.Sscanf(line[i:], "kept=%d", &kept)
	}
	t.Logf("the new pod: %s", line)
	if kept == 0 {
		t.Fatalf("the new pod took no cache from the old one:\n%s", logs)
	}
}

// daemonPID finds the nodelocaldns process in this network namespace (the
// node's); other tests on the machine run theirs in their own.
func daemonPID(t *testing.T) int {
	t.Helper()
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(d + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "nodelocaldns" {
			continue
		}
		cmdline, _ := os.ReadFile(d + "/cmdline")
		if bytes.Contains(cmdline, []byte("-probe")) {
			continue // an exec probe
		}
		if ns, err := os.Readlink(d + "/ns/net"); err != nil || ns != self {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		pids = append(pids, pid)
	}
	if len(pids) != 1 {
		t.Fatalf("nodelocaldns processes in the node: %v, want 1", pids)
	}
	return pids[0]
}

// dig asks server for name from the node, one try: the answer's first
// line, or the error dig printed.
func dig(server, name string, timeout time.Duration) (string, error) {
	out, err := exec.Command("dig", "+short", "+tries=1", fmt.Sprintf("+timeout=%d", int(timeout.Seconds())), "@"+server, name).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil || s == "" || strings.HasPrefix(s, ";;") {
		return "", fmt.Errorf("dig @%s %s: %v: %s", server, name, err, s)
	}
	return strings.SplitN(s, "\n", 2)[0], nil
}

// digLoopScript asks both addresses every 100 ms with one 1 s try each and
// prints a FAIL line (tool, name, when it started) for every lookup not
// answered.
var digLoopScript = addrFunc + `rm -f /tmp/stop; ok=0; fail=0; echo started
while [ ! -e /tmp/stop ]; do
  for s in ` + localDNS + ` ` + kubeDNSIP + `; do
    st=$(date +%T.%N)
    if addr "$(dig +short +timeout=1 +tries=1 @$s hello.default.svc.cluster.local | tail -n1)"; then ok=$((ok+1)); else fail=$((fail+1)); echo "FAIL dig@$s hello $st"; fi
  done
  sleep 0.1
done
echo "ok=$ok fail=$fail"`

// waitSocketsGone waits until no socket on the link-local address belongs
// to pid: a killed process's sockets close when its last thread has
// exited, which can be after the thread group leader shows as a zombie,
// and what was queued in them goes with them. It returns when.
func waitSocketsGone(t *testing.T, pid int) time.Time {
	t.Helper()
	poll(t, 10*time.Second, func() error {
		out, err := exec.Command("ss", "-Hlunp", "src", localDNS+":53").CombinedOutput()
		if err != nil {
			return fmt.Errorf("ss: %v: %s", err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line != "" && (!strings.Contains(line, "pid=") || strings.Contains(line, fmt.Sprintf("pid=%d,", pid))) {
				return fmt.Errorf("a socket of the old process is still open: %s", line)
			}
		}
		return nil
	})
	return time.Now()
}

// checkLoop fails t for every failed lookup of r sent after from (a query
// sent before, while the killed process's sockets were closing, was queued
// in them and went with them: logged).
func checkLoop(t *testing.T, r *resolver, killed, from time.Time, what string) {
	t.Helper()
	ok, fail := r.stop(t)
	t.Logf("%s: %s: %d lookups answered, %d failed", what, resolverLabel(r.pod), ok, fail)
	if ok == 0 {
		t.Errorf("%s: %s: no lookup answered", what, resolverLabel(r.pod))
	}
	for _, f := range failLines(r.out.String(), killed) {
		if f.at.Before(from) && !f.at.Before(killed.Add(-time.Second)) {
			t.Logf("%s: %s: %s sent %v before the killed process's sockets were gone: lost with them", what, resolverLabel(r.pod), f.tool, from.Sub(f.at).Round(time.Millisecond))
			continue
		}
		t.Errorf("%s: %s: %s failed at %s (the kill %s)", what, resolverLabel(r.pod), f.tool, f.at.Format("15:04:05.000"), killed.UTC().Format("15:04:05.000"))
	}
}

// TestKill9Recovers: kill -9 of the daemon; the kubelet restarts it. A pod's
// one-try digs of both addresses never fail meanwhile (the fallback: kube-dns
// answers while no process serves), a host-network client's only within
// -fallback-after (2 s: its queries are given to our sockets while the
// heartbeat is fresh), and the restarted daemon reports what took the
// fallback.
func TestKill9Recovers(t *testing.T) {
	pods := nldPods(t)
	if len(pods) != 1 {
		t.Fatalf("nodelocaldns pods: %v", pods)
	}
	pod := pods[0]
	restarts := func() string {
		return mustKubectl(t, "-n", "kube-system", "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
	}
	r0 := restarts()
	pid := daemonPID(t)
	name := "hello.default.svc.cluster.local"
	want := serviceIP(t, "default", "hello")
	r := startResolverIn(t, clientPod, digLoopScript)
	poll(t, 30*time.Second, func() error {
		if !strings.Contains(r.out.String(), "started") {
			return fmt.Errorf("lookup loop not started: %s", r.out.String())
		}
		return nil
	})
	time.Sleep(time.Second)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The host's own digs (this test runs in the node's network).
	var hostFails []time.Duration
	hostDone := make(chan struct{})
	stopHost := make(chan struct{})
	go func() {
		defer close(hostDone)
		for {
			for _, server := range []string{localDNS, kubeDNSIP} {
				sent := time.Since(killed)
				if got, err := dig(server, name, time.Second); err != nil || got != want {
					hostFails = append(hostFails, sent)
				}
			}
			select {
			case <-stopHost:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	gone := waitSocketsGone(t, pid)
	poll(t, 30*time.Second, func() error {
		if r := restarts(); r == r0 {
			return fmt.Errorf("restartCount still %s", r)
		}
		return nil
	})
	mustKubectl(t, "-n", "kube-system", "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=60s")
	recovered := time.Since(killed)
	time.Sleep(2 * time.Second)
	close(stopHost)
	<-hostDone
	checkLoop(t, r, killed, gone, "kill -9")
	t.Logf("kill -9: the old sockets were gone %v after the kill; the restarted pod ready %v after; the host's digs failed at %v after the kill (-fallback-after 2 s)",
		gone.Sub(killed).Round(time.Millisecond), recovered.Round(time.Millisecond), hostFails)
	for _, f := range hostFails {
		if f > 2500*time.Millisecond {
			t.Errorf("a host-network dig failed %v after the kill, past -fallback-after", f)
		}
	}
	logs := mustKubectl(t, "-n", "kube-system", "logs", pod)
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "while no instance served") {
			t.Logf("the restarted daemon: %s", l)
		}
	}
}

// clusterIPClient asks the kube-dns ClusterIP (TestCrashLoopFallsBack's
// second pod), as kubeDNSClient does in the migration.
const clusterIPClient = "client-clusterip"

// TestCrashLoopFallsBack is a bad upgrade: the daemon is killed (kill -9)
// and its restarts run an image that exits at once (the e2e's image tag
// pointed at CoreDNS, which refuses the daemon's flags), so the container
// stays in CrashLoopBackOff. For 60 s the pods' getent and one-try dig
// lookups through 169.254.20.10 and 10.96.0.10 keep succeeding: kube-dns
// answers them through the rules the dead daemon left. Then the good image
// is back, the pod replaced, and the new daemon reports what took the
// fallback.
func TestCrashLoopFallsBack(t *testing.T) {
	pods := nldPods(t)
	if len(pods) != 1 {
		t.Fatalf("nodelocaldns pods: %v", pods)
	}
	pod := pods[0]
	spec := `apiVersion: v1
kind: Pod
metadata: {name: ` + clusterIPClient + `, namespace: default}
spec:
  dnsPolicy: None
  dnsConfig:
    nameservers: [` + kubeDNSIP + `]
    searches: [default.svc.cluster.local, svc.cluster.local, cluster.local]
    options: [{name: ndots, value: "5"}]
  terminationGracePeriodSeconds: 0
  containers:
    - name: client
      image: localhost/client:e2e
      imagePullPolicy: Never
      command: [sleep, infinity]
`
	if out, err := kubectlIn(spec, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _, _ = kubectl("delete", "pod", clusterIPClient, "--wait=false") })
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/"+clusterIPClient, "--timeout=120s")
	ctr := func(args ...string) {
		t.Helper()
		a := append([]string{"--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "tag", "--force"}, args...)
		if out, err := exec.Command("ctr", a...).CombinedOutput(); err != nil {
			t.Fatalf("ctr %v: %v: %s", a, err, out)
		}
	}
	good, image := "localhost/nodelocaldns:e2e-good", "localhost/nodelocaldns:e2e"
	ctr(image, good)
	ctr("localhost/coredns:e2e", image)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			ctr(good, image)
		}
	}
	t.Cleanup(restore)

	var loops []*resolver
	for _, p := range []string{clientPod, clusterIPClient} {
		loops = append(loops, startResolverIn(t, p, timedLoopScript))
	}
	poll(t, 30*time.Second, func() error {
		for _, r := range loops {
			if !strings.Contains(r.out.String(), "started") {
				return fmt.Errorf("lookup loop in %s not started: %s", r.pod, r.out.String())
			}
		}
		return nil
	})
	time.Sleep(time.Second)
	pid := daemonPID(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	gone := waitSocketsGone(t, pid)
	maxRestarts := ""
	for time.Since(killed) < 60*time.Second {
		st := mustKubectl(t, "-n", "kube-system", "get", "pod", pod, "-o",
			`jsonpath={.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.waiting.reason}{.status.containerStatuses[0].state.terminated.reason}`)
		if strings.HasPrefix(st, "true ") && time.Since(killed) > 5*time.Second {
			t.Fatalf("the container is ready again %v after the kill (%s): it was not kept from restarting", time.Since(killed).Round(time.Second), st)
		}
		maxRestarts = st
		time.Sleep(2 * time.Second)
	}
	t.Logf("60 s after the kill the container is %q (ready, restarts, state)", maxRestarts)
	for _, r := range loops {
		checkLoop(t, r, killed, gone, "killed, restarts crash")
	}
	st := nodeState(t)
	for backend, rules := range st.rules {
		for _, r := range rules {
			if strings.Contains(r, "-j NOTRACK") && strings.Contains(r, "--dport 53") && !strings.Contains(r, "-m recent --rcheck") {
				t.Errorf("%s: left by the dead daemon, a rule that NOTRACKs whether anyone serves: %s", backend, r)
			}
		}
	}
	t.Logf("left on the node while no cache serves: %v", st)

	restore()
	mustKubectl(t, "-n", "kube-system", "delete", "pod", pod, "--wait=false")
	poll(t, 120*time.Second, func() error {
		now := nldPods(t)
		if len(now) != 1 || now[0] == pod {
			return fmt.Errorf("pods %v", now)
		}
		if out, err := kubectl("-n", "kube-system", "wait", "--for=condition=Ready", "pod/"+now[0], "--timeout=5s"); err != nil {
			return fmt.Errorf("%s: %v: %s", now[0], err, out)
		}
		return nil
	})
	logs := mustKubectl(t, "-n", "kube-system", "logs", nldPods(t)[0])
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "while no instance served") {
			t.Logf("the new daemon: %s", l)
		}
	}
}

// metricLine returns the value of the series written exactly as series
// (name and labels) on url, summed when it appears more than once.
func metricLine(url, series string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(series):]), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %v", url, line, err)
			}
			sum += v
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("%s: no %s", url, series)
	}
	return sum, nil
}

// kubeDNSPodIPs returns the ready kube-dns pods' names and IPs.
func kubeDNSPodIPs(t *testing.T) map[string]string {
	t.Helper()
	out := mustKubectl(t, "-n", "kube-system", "get", "pod", "-l", "k8s-app=kube-dns", "-o",
		`jsonpath={range .items[*]}{.metadata.name}={.status.podIP}{"\n"}{end}`)
	pods := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if name, ip, ok := strings.Cut(strings.TrimSpace(l), "="); ok && ip != "" {
			pods[name] = ip
		}
	}
	return pods
}

// lookupLoad sends fresh cluster-domain names (so every one is a miss that
// goes to kube-dns) to the cache's link-local address from workers
// goroutines until stop is closed or n names are sent (n > 0). A lookup
// fails when it gets no answer within 2 s and a second try, or a SERVFAIL.
func lookupLoad(prefix string, workers, n int, stop <-chan struct{}) (sent, failed int, firstErrs []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var seq atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Timeout: 2 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				if n > 0 && i > int64(n) {
					return
				}
				m := new(dns.Msg)
				m.SetQuestion(fmt.Sprintf("%s-%d.default.svc.cluster.local.", prefix, i), dns.TypeA)
				var r *dns.Msg
				var err error
				for try := 0; try < 2; try++ { // a stub's one retry
					if r, _, err = c.Exchange(m, net.JoinHostPort(localDNS, "53")); err == nil {
						break
					}
				}
				mu.Lock()
				sent++
				if err == nil && r.Rcode == dns.RcodeServerFailure {
					err = fmt.Errorf("SERVFAIL")
				}
				if err != nil {
					failed++
					if len(firstErrs) < 5 {
						firstErrs = append(firstErrs, fmt.Sprintf("%s: %v (%s)", m.Question[0].Name, err, time.Now().Format("15:04:05.000")))
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return sent, failed, firstErrs
}

// TestKubeDNSLoadSpreadOverItsPods: with kube-dns scaled to 3 pods, the
// cache follows kube-dns-upstream's EndpointSlices and asks the pods
// directly: each pod's share of one node's cluster-domain queries (from the
// pods' own coredns_dns_requests_total) is within 10 points of a third; a
// kube-dns pod deleted under load costs no failed lookup.
func TestKubeDNSLoadSpreadOverItsPods(t *testing.T) {
	nldURL := "http://127.0.0.1:9253/metrics"
	mustKubectl(t, "-n", "kube-system", "scale", "deployment/coredns", "--replicas=3")
	t.Cleanup(func() {
		if out, err := kubectl("-n", "kube-system", "scale", "deployment/coredns", "--replicas=1"); err != nil {
			t.Logf("scale back: %v: %s", err, out)
		}
		_, _ = kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s")
	})
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=180s")
	poll(t, 60*time.Second, func() error {
		v, err := metricLine(nldURL, `nodelocaldns_kubedns_endpoints{state="in_use"}`)
		if err != nil || v != 3 {
			return fmt.Errorf("kube-dns endpoints in use: %v %v", v, err)
		}
		return nil
	})
	pods := kubeDNSPodIPs(t)
	if len(pods) != 3 {
		t.Fatalf("kube-dns pods: %v", pods)
	}
	count := func() map[string]float64 {
		out := map[string]float64{}
		for name, ip := range pods {
			v, err := metric("http://"+ip+":9153/metrics", "coredns_dns_requests_total")
			if err != nil && !strings.Contains(err.Error(), "no coredns_dns_requests_total") {
				t.Fatal(err) // a new pod has the series from its first request on: 0 until then
			}
			out[name] = v
		}
		return out
	}
	before := count()
	const n = 3000
	sent, failed, errs := lookupLoad("spread", 8, n, nil)
	if failed > 0 {
		t.Fatalf("%d of %d lookups failed: %v", failed, sent, errs)
	}
	after := count()
	var total float64
	for name := range pods {
		total += after[name] - before[name]
	}
	for name, ip := range pods {
		share := (after[name] - before[name]) / total
		t.Logf("kube-dns pod %s (%s): %.0f of %.0f queries (%.1f%%)", name, ip, after[name]-before[name], total, 100*share)
		if share < 1.0/3-0.10 || share > 1.0/3+0.10 {
			t.Errorf("pod %s has %.1f%% of the node's cluster-domain queries, want within 10 points of 33.3%%", name, 100*share)
		}
	}
	if total < n {
		t.Errorf("the kube-dns pods counted %.0f queries for %d fresh names", total, n)
	}

	// A kube-dns pod deleted under load: no lookup fails.
	var victim string
	for name := range pods {
		victim = name
		break
	}
	stop := make(chan struct{})
	type result struct {
		sent, failed int
		errs         []string
	}
	res := make(chan result, 1)
	go func() { s, f, e := lookupLoad("delete", 8, 0, stop); res <- result{s, f, e} }()
	time.Sleep(time.Second)
	start := time.Now()
	mustKubectl(t, "-n", "kube-system", "delete", "pod", victim, "--wait=true", "--timeout=120s")
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=180s")
	poll(t, 60*time.Second, func() error {
		v, err := metricLine(nldURL, `nodelocaldns_kubedns_endpoints{state="in_use"}`)
		if err != nil || v != 3 {
			return fmt.Errorf("kube-dns endpoints in use after the replacement: %v %v", v, err)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // the replacement takes load
	close(stop)
	r := <-res
	t.Logf("kube-dns pod %s deleted under load (replaced in %v): %d lookups, %d failed", victim, time.Since(start).Round(time.Millisecond), r.sent, r.failed)
	if r.failed > 0 || r.sent == 0 {
		t.Errorf("%d of %d lookups failed while a kube-dns pod was deleted: %v", r.failed, r.sent, r.errs)
	}
}

func TestStubDomainFromConfigMap(t *testing.T) {
	if got, err := getent(stubName); err == nil {
		t.Fatalf("%s resolves before the stub domain is set: %s", stubName, got)
	}
	cm := `apiVersion: v1
kind: ConfigMap
metadata: {name: kube-dns, namespace: kube-system}
data:
  stubDomains: |
    {"stub.e2e.example": ["` + stubIP + `"]}
`
	if out, err := kubectlIn(cm, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	start := time.Now()
	// The kubelet updates the ConfigMap volume on its sync (syncFrequency
	// 10s in run.sh), the daemon watches the file.
	poll(t, 120*time.Second, func() error {
		got, err := getent(stubName)
		if err != nil {
			return err
		}
		if got != stubAnswer {
			return fmt.Errorf("%s: %s, want %s", stubName, got, stubAnswer)
		}
		return nil
	})
	t.Logf("stub domain in effect %v after the ConfigMap was applied", time.Since(start).Round(time.Millisecond))
}

// digTTL asks server for name from the node, one try: the first answer's
// address and TTL.
func digTTL(server, name string) (addr string, ttl int, err error) {
	c := &dns.Client{Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := c.Exchange(m, net.JoinHostPort(server, "53"))
	if err != nil {
		return "", 0, err
	}
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String(), int(a.Hdr.Ttl), nil
		}
	}
	return "", 0, fmt.Errorf("%s: no address: %v", name, r)
}

// snapshotFiles is a glob of the files name in the cache snapshot's
// directory of every pod on the node: the manifest's emptyDir
// (-cache-snapshot-dir), under the kubelet's root directory (run.sh).
func snapshotFiles(name string) string {
	return filepath.Join(os.Getenv("NLD_E2E_WORK"), "kubelet", "pods", "*", "volumes", "kubernetes.io~empty-dir", "cache-snapshot", name)
}

// TestKill9RestartsWarm (issue 42, "Warm after a crash, too"): the cache
// outlives a kill -9. The killed process wrote it to its pod's emptyDir
// (-cache-snapshot-dir, in memory); the container the kubelet starts again
// loads it and answers a name it had cached from it: with what is left of
// its TTL, where kube-dns's answer through the node's resolver would come
// with the full 30 s.
func TestKill9RestartsWarm(t *testing.T) {
	pod := nldPods(t)[0]
	// An instance that loaded the snapshot is not fed it again if it dies
	// within a minute (TestKill9Recovers' restart may have): wait for its
	// marker to go.
	poll(t, 90*time.Second, func() error {
		if m, _ := filepath.Glob(snapshotFiles("cache.snapshot.loaded")); len(m) > 0 {
			return fmt.Errorf("the last loader is in its first minute: %v", m)
		}
		return nil
	})
	// A fresh entry: asked until the answer is the upstream's (TTL 30, the
	// cap), not an older entry's.
	var asked time.Time
	poll(t, 45*time.Second, func() error {
		asked = time.Now()
		addr, ttl, err := digTTL(localDNS, externalName)
		if err != nil || addr != externalIP || ttl != 30 {
			return fmt.Errorf("%s: %s TTL %d, %v", externalName, addr, ttl, err)
		}
		return nil
	})
	// The snapshot written after it (every 5 s when the cache took entries).
	poll(t, 15*time.Second, func() error {
		m, _ := filepath.Glob(snapshotFiles("cache.snapshot"))
		for _, f := range m {
			if st, err := os.Stat(f); err == nil && st.ModTime().After(asked) {
				return nil
			}
		}
		return fmt.Errorf("no snapshot written since %s: %v", asked.Format("15:04:05.000"), m)
	})
	// A second at least, so that an answer from the snapshot shows less
	// than the full TTL.
	time.Sleep(time.Until(asked.Add(1500 * time.Millisecond)))
	restarts := func() string {
		return mustKubectl(t, "-n", "kube-system", "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
	}
	r0 := restarts()
	if err := syscall.Kill(daemonPID(t), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The restarted container serving (whatever else answers meanwhile).
	var logs string
	poll(t, 60*time.Second, func() error {
		if r := restarts(); r == r0 {
			return fmt.Errorf("restartCount still %s", r)
		}
		logs, _ = kubectl("-n", "kube-system", "logs", pod)
		if !strings.Contains(logs, "msg=serving") {
			return fmt.Errorf("the restarted container does not serve yet")
		}
		return nil
	})
	var ttl int
	poll(t, 10*time.Second, func() error {
		addr, tt, err := digTTL(localDNS, externalName)
		if err != nil || addr != externalIP {
			return fmt.Errorf("%s: %s, %v", externalName, addr, err)
		}
		ttl = tt
		return nil
	})
	line := ""
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "cache snapshot") {
			line = l
		}
	}
	t.Logf("kill -9 %v after the lookup; the restarted container served %v later, answered with TTL %d; its log: %s",
		killed.Sub(asked).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond), ttl, line)
	if !strings.Contains(line, "loaded the cache snapshot") || strings.Contains(line, " kept=0 ") {
		t.Errorf("the restarted daemon loaded no snapshot:\n%s", logs)
	}
	if ttl >= 30 {
		t.Errorf("%s answered with TTL %d after the restart: fetched again, not from the snapshot", externalName, ttl)
	}
	mustKubectl(t, "-n", "kube-system", "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=60s")
}

// TestDeleteDaemonSetCleansUp runs last: it deletes the DaemonSet.
func TestDeleteDaemonSetCleansUp(t *testing.T) {
	mustKubectl(t, "-n", "kube-system", "delete", "daemonset/nodelocaldns", "--wait=true", "--timeout=120s")
	poll(t, 90*time.Second, func() error {
		if p := nldPods(t); len(p) != 0 {
			return fmt.Errorf("pods left: %v", p)
		}
		return nil
	})
	// The daemon's rules (each with a nodelocaldns comment), in either backend.
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		out, err := exec.Command(save).CombinedOutput()
		if err != nil {
			t.Logf("%s: %v (backend not usable here)", save, err)
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "nodelocaldns") {
				t.Errorf("%s: rule left: %s", save, line)
			}
		}
	}
	// run.sh made the link (no dummy type on this kernel) and the daemon
	// adopted it: its addresses go, the link stays. With a dummy link the
	// daemon made, the link itself goes.
	if noDummy := os.Getenv("NLD_E2E_NODUMMY"); noDummy != "" {
		t.Run("LinkDeleted", func(t *testing.T) {
			t.Skipf("cannot run on this kernel: ip link add nodelocaldns type dummy: %s; the daemon adopted the node's link, so only its addresses are removed (checked below)", noDummy)
		})
	} else if out, err := exec.Command("ip", "link", "show", "nodelocaldns").CombinedOutput(); err == nil {
		t.Errorf("link nodelocaldns left: %s", out)
	}
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", "nodelocaldns").CombinedOutput()
	if err == nil {
		for _, a := range []string{localDNS, kubeDNSIP} {
			if strings.Contains(string(out), " "+a+"/") {
				t.Errorf("address %s left on the link: %s", a, out)
			}
		}
	} else if !strings.Contains(string(out), "does not exist") {
		t.Errorf("ip addr show dev nodelocaldns: %v: %s", err, out)
	}
	// The kube-dns ClusterIP reaches kube-dns again, through kube-proxy.
	want := serviceIP(t, "default", "hello")
	poll(t, 30*time.Second, func() error {
		got, err := dig(kubeDNSIP, "hello.default.svc.cluster.local", 2*time.Second)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("got %s, want %s", got, want)
		}
		return nil
	})
}
