package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// appScript is an application pod's shutdown: on SIGTERM it resolves an
// external name and a cluster name with glibc (getent, as applications
// do) every 250 ms for 20 s, one line per lookup into /out/app.log, then
// exits; until then it waits. Its grace period is 30 s.
const appScript = `log=/out/app.log
shutdown() {
  echo "TERM $(date +%s.%N)" >>$log
  end=$(( $(date +%s) + 20 ))
  while [ $(date +%s) -lt $end ]; do
    for n in ` + externalName + ` hello.default.svc.cluster.local; do
      if getent ahostsv4 $n >/dev/null; then echo "OK $(date +%s.%N) $n" >>$log; else echo "FAIL $(date +%s.%N) $n" >>$log; fi
    done
    sleep 0.25
  done
  echo "DONE $(date +%s.%N)" >>$log
  exit 0
}
trap shutdown TERM
echo "READY $(date +%s.%N)" >>$log
while true; do sleep 1 & wait $!; done`

// logindPID is test/e2e/logind's PID (node.sh writes it).
func logindPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(os.Getenv("NLD_E2E_WORK"), "logind.pid"))
	if err != nil {
		t.Fatalf("logind (node.sh) is not running: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitFileLine waits until file has a line starting with prefix and
// returns it.
func waitFileLine(t *testing.T, file, prefix string, within time.Duration) string {
	t.Helper()
	var found string
	poll(t, within, func() error {
		b, _ := os.ReadFile(file)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, prefix) {
				found = l
				return nil
			}
		}
		return fmt.Errorf("%s: no %q line yet", file, prefix)
	})
	return found
}

// unixField is the Unix time in line's second field ("WORD SECONDS.NANOS").
func unixField(t *testing.T, line string) time.Time {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 2 {
		t.Fatalf("no time in %q", line)
	}
	s, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	return time.Unix(0, int64(s*1e9))
}

// TestNodeShutdownLookupsSucceed: the kubelet's graceful node shutdown on
// the e2e node (logind's PrepareForShutdown, test/e2e/logind; the kubelet
// configured as docs/deploy.md says: shutdownGracePeriod 50 s, 20 s of it
// for critical pods). The kubelet stops the application pod first; its
// lookups during its own 20 s shutdown all succeed, because nodelocaldns,
// system-node-critical, gets its SIGTERM only after the application pod is
// gone, and its whole exit (lame duck, drain, teardown) fits the critical
// pods' 20 s. With -node-condition on, the condition says "Stopping" at
// the end. The shutdown is then cancelled (PrepareForShutdown(false)) and
// the node's pods come back. It runs last: it stops every pod of the node.
func TestNodeShutdownLookupsSucceed(t *testing.T) {
	work := os.Getenv("NLD_E2E_WORK")
	pid := logindPID(t)
	logindLog := filepath.Join(work, "logs", "logind.log")
	waitFileLine(t, logindLog, "", time.Second)
	if b, _ := os.ReadFile(logindLog); !strings.Contains(string(b), "inhibitor 1 taken") {
		t.Fatalf("the kubelet took no delay lock from logind:\n%s", b)
	}
	if len(nldPods(t)) == 0 { // alone: deploy the cache as shipped
		if out, err := kubectl("apply", "-f", os.Getenv("NLD_E2E_MANIFEST")); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/nodelocaldns", "--timeout=180s")
	cachePod := nldPods(t)[0]
	conditionOn := strings.Contains(mustKubectl(t, "-n", "kube-system", "get", "ds", "nodelocaldns", "-o", "jsonpath={.spec.template.spec.containers[0].args}"), "-node-condition=")

	out := filepath.Join(work, "shutdown")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	app := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: shutdown-app, namespace: default}
spec:
  dnsPolicy: ClusterFirst
  terminationGracePeriodSeconds: 30
  containers:
    - name: app
      image: localhost/client:e2e
      imagePullPolicy: Never
      command: [bash, -c, %q]
      volumeMounts: [{name: out, mountPath: /out}]
  volumes: [{name: out, hostPath: {path: %s, type: Directory}}]
`, appScript, out)
	if o, err := kubectlIn(app, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, o)
	}
	appLog := filepath.Join(out, "app.log")
	waitFileLine(t, appLog, "READY", 120*time.Second)

	// The cache's log, streamed until its container ends.
	cacheLog := exec.Command(kubectlBin, "-n", "kube-system", "logs", "-f", cachePod)
	var cacheOut strings.Builder
	cacheLog.Stdout, cacheLog.Stderr = &cacheOut, &cacheOut
	if err := cacheLog.Start(); err != nil {
		t.Fatal(err)
	}
	streamed := make(chan struct{})
	go func() { _ = cacheLog.Wait(); close(streamed) }()

	begin := time.Now()
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	defer recoverNode(t, pid)
	term := unixField(t, waitFileLine(t, appLog, "TERM", 30*time.Second))
	done := unixField(t, waitFileLine(t, appLog, "DONE", 40*time.Second))
	waitFileLine(t, logindLog, "", time.Second)
	poll(t, 60*time.Second, func() error {
		if b, _ := os.ReadFile(logindLog); !strings.Contains(string(b), "released by kubelet") {
			return fmt.Errorf("the kubelet has not released its delay lock: the node's pods are not down")
		}
		return nil
	})
	ended := time.Now()
	select {
	case <-streamed:
	case <-time.After(30 * time.Second):
		_ = cacheLog.Process.Kill()
		<-streamed // its copying goroutine is done with cacheOut
	}

	var ok, failed int
	b, _ := os.ReadFile(appLog)
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		switch l := sc.Text(); {
		case strings.HasPrefix(l, "OK "):
			ok++
		case strings.HasPrefix(l, "FAIL "):
			failed++
			t.Errorf("lookup failed during the application's shutdown: %s", l)
		}
	}
	if ok < 40 {
		t.Errorf("%d lookups during the application's shutdown, want about 2 every 250 ms for 20 s", ok)
	}
	// The cache's SIGTERM came after the application was gone.
	sig := regexp.MustCompile(`time=(\S+) level=INFO msg="signal received`).FindStringSubmatch(cacheOut.String())
	if sig == nil {
		t.Fatalf("the cache's log has no SIGTERM:\n%s", cacheOut.String())
	}
	sigAt, err := time.Parse(time.RFC3339Nano, sig[1])
	if err != nil {
		t.Fatal(err)
	}
	exited := strings.Contains(cacheOut.String(), `msg="exited cleanly"`)
	t.Logf("shutdown at %s: application SIGTERM +%.1fs, its last lookup +%.1fs (%d ok, %d failed); cache SIGTERM +%.1fs, exited cleanly %v; kubelet done +%.1fs",
		begin.Format(time.TimeOnly), term.Sub(begin).Seconds(), done.Sub(begin).Seconds(), ok, failed, sigAt.Sub(begin).Seconds(), exited, ended.Sub(begin).Seconds())
	if sigAt.Before(done) {
		t.Errorf("the cache got SIGTERM (%v) before the application's shutdown ended (%v)", sigAt, done)
	}
	if !exited {
		t.Errorf("the cache did not exit cleanly within the critical pods' 20 s:\n%s", cacheOut.String())
	}
	if conditionOn {
		if status, reason, _ := theNode(t).conditionOf("nodelocaldns.io/DNSReady"); status != "False" || reason != "Stopping" {
			t.Errorf("after the shutdown the condition is %s (%s), want False (Stopping)", status, reason)
		}
	}
}

// recoverNode cancels the shutdown (PrepareForShutdown(false)) and waits
// until the node and its pods are back: the cache (its DaemonSet replaces
// the pod the kubelet stopped) and kube-dns (its Deployment).
func recoverNode(t *testing.T, logind int) {
	t.Helper()
	if err := syscall.Kill(logind, syscall.SIGUSR2); err != nil {
		t.Errorf("cancel the shutdown: %v", err)
		return
	}
	_, _ = kubectl("delete", "pod", "shutdown-app", "--wait=false")
	n := theNode(t).Metadata.Name
	mustKubectl(t, "wait", "--for=condition=Ready", "node/"+n, "--timeout=120s")
	// While the node shut down, the DaemonSet controller made a pod again
	// and again, each refused by the kubelet (NodeShutdown, Failed), and
	// backs off for minutes; a new template generation starts afresh (its
	// backoff is per generation), as a node that comes back in a real
	// cluster is a new node. The refused pods go.
	_, _ = kubectl("-n", "kube-system", "delete", "pods", "--field-selector=status.phase=Failed", "--wait=false")
	mustKubectl(t, "-n", "kube-system", "rollout", "restart", "ds/nodelocaldns")
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/nodelocaldns", "--timeout=180s")
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "deploy/coredns", "--timeout=180s")
	poll(t, 60*time.Second, func() error {
		got, err := dig(localDNS, "hello.default.svc.cluster.local", 2*time.Second)
		if err != nil || got == "" {
			return fmt.Errorf("the cache does not answer after the shutdown was cancelled: %q %v", got, err)
		}
		return nil
	})
}
