package deploy

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// init keeps the main goroutine on the main thread for the whole run, so no
// other goroutine ever runs there. Tests move a locked thread into another
// network namespace (enterNetns) or change its filesystem uid: a goroutine
// that exits locked has its thread thrown away, except the main thread,
// which Go keeps. Had such a goroutine run on the main thread, the process
// itself (its thread group leader, which is what the kernel reports as a
// unix socket peer) would stay in that namespace: TestStateDirThiefGetsNothing
// then saw the test process as a twin of the daemon (1 run in 4).
func init() { runtime.LockOSThread() }

// netns creates a network namespace for one test and removes it after.
func netns(t *testing.T) (name string, in func(args ...string) *exec.Cmd) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	need(t, "ip")
	name = fmt.Sprintf("nld-e2e-%d", rand.IntN(1_000_000))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	in = func(args ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", name}, args...)...)
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := in(args...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	run("ip", "link", "set", "lo", "up")
	return name, in
}

func mustRun(t *testing.T, c *exec.Cmd) string {
	t.Helper()
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", c.Args, err, out)
	}
	return string(out)
}

// rulesOf lists a namespace's iptables rules for comparing before and
// after: counters dropped, and tables without rules left out (using a
// table instantiates it empty, which is not a rule we added).
func rulesOf(t *testing.T, in func(args ...string) *exec.Cmd, save string) string {
	t.Helper()
	var out, table []string
	rules := 0
	for _, l := range strings.Split(mustRun(t, in(save)), "\n") {
		switch {
		case strings.HasPrefix(l, "#") || l == "":
		case strings.HasPrefix(l, "*"):
			table, rules = []string{l}, 0
		case l == "COMMIT":
			if rules > 0 {
				out = append(out, table...)
			}
		case strings.HasPrefix(l, ":"):
			if i := strings.IndexByte(l, '['); i > 0 {
				l = l[:i]
			}
			table = append(table, l)
		default:
			table = append(table, l)
			rules++
		}
	}
	return strings.Join(out, "\n")
}

// TestDaemonInNamespace runs the real binary as it runs on a node: in its
// own network namespace, adopting a pre-created link named nodelocaldns
// (this build kernel has no dummy type), installing iptables rules, and
// answering dig on the link-local address; SIGTERM removes exactly what it
// added.
func TestDaemonInNamespace(t *testing.T) {
	dig := need(t, "dig")
	dnsmasq := need(t, "dnsmasq")
	need(t, "iptables-save")
	ns, in := netns(t)
	bin := buildBinary(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
	// A foreign rule that must survive our teardown.
	mustRun(t, in("iptables", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"))
	before := rulesOf(t, in, "iptables-save")

	// The node's resolver, inside the namespace.
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	up := exec.CommandContext(ctx, "ip", "netns", "exec", ns, dnsmasq, "--no-daemon", "--no-resolv", "--no-hosts",
		"--listen-address=127.0.0.1", "--bind-interfaces", "--port=53", "--local-ttl=60", "--address=/example.com/192.0.2.1",
		"--pid-file="+filepath.Join(dir, "dnsmasq.pid"))
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = up.Process.Kill(); _ = up.Wait() }()
	rc := filepath.Join(dir, "resolv.conf")
	_ = os.WriteFile(rc, []byte("nameserver 127.0.0.1\n"), 0o644)

	d := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "-local-mode", "-setupinterface=true", "-setupiptables=true",
		"-localip", "169.254.20.10", "-resolv-conf", rc, "-metrics-listen-address", "127.0.0.1:9253", "-state-dir", stateDir(t), "-lameduck", "200ms")
	var stderr bytes.Buffer
	d.Stderr = &stderr
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := in("curl", "-sf", "http://127.0.0.1:9253/ready").CombinedOutput()
		if strings.TrimSpace(string(out)) == "ok" {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("daemon exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := strings.TrimSpace(mustRun(t, in(dig, "@169.254.20.10", "+short", "+time=2", "+tries=1", "example.com"))); got != "192.0.2.1" {
		t.Fatalf("dig: %q\n%s", got, stderr.String())
	}
	if got := strings.TrimSpace(mustRun(t, in(dig, "@169.254.20.10", "+short", "+tcp", "+time=2", "+tries=1", "example.com"))); got != "192.0.2.1" {
		t.Fatalf("dig +tcp: %q", got)
	}
	during := mustRun(t, in("iptables-save"))
	for _, want := range []string{"-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53", "-A OUTPUT -s 169.254.20.10/32 -p tcp -m tcp --sport 53", "NOTRACK", "nodelocaldns"} {
		if !strings.Contains(during, want) {
			t.Errorf("rules lack %q:\n%s", want, during)
		}
	}
	if !strings.Contains(mustRun(t, in("ip", "addr", "show", "nodelocaldns")), "169.254.20.10/32") {
		t.Error("address not on the link")
	}

	_ = d.Process.Signal(os.Interrupt)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit within 15s of SIGINT")
	}
	if after := rulesOf(t, in, "iptables-save"); after != before {
		t.Fatalf("teardown left a different rule set:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if strings.Contains(mustRun(t, in("ip", "addr", "show", "nodelocaldns")), "169.254.20.10") {
		t.Error("address left on the adopted link")
	}
}

// TestNoDummyIsOneClearError: where the kernel lacks the dummy type, the
// daemon exits 1 with one line that says so and names the way out.
func TestNoDummyIsOneClearError(t *testing.T) {
	_, in := netns(t)
	if err := in("ip", "link", "add", "probe0", "type", "dummy").Run(); err == nil {
		t.Skip("this kernel has the dummy link type")
	}
	bin := buildBinary(t)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	_ = os.WriteFile(rc, []byte("nameserver 192.0.2.53\n"), 0o644)
	out, err := in(bin, "-local-mode", "-setupinterface=true", "-setupiptables=false", "-localip", "169.254.20.10",
		"-resolv-conf", rc, "-metrics-listen-address", "127.0.0.1:9253").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "dummy") || !strings.Contains(string(out), "-setupinterface=false") {
		t.Fatalf("output does not explain:\n%s", out)
	}
}
