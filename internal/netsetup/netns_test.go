package netsetup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv marks a test binary re-executed inside a test network namespace;
// its value is the namespace's name.
const childEnv = "NETSETUP_TEST_NETNS"

// emulatorEnv names the user-mode emulator the test binary runs under
// (test/crossarch/run.sh sets it), so a re-executed child runs under it too.
const emulatorEnv = "NLD_TEST_EMULATOR"

// childTimeout bounds one re-executed test. The slowest (the reconciler
// tests under -race) take a few seconds.
const childTimeout = 60 * time.Second

// Test addresses: the link-local address NodeLocal DNS deployments use, and
// a unique local IPv6 address.
var (
	testV4 = netip.MustParseAddr("169.254.20.10")
	testV6 = netip.MustParseAddr("fd00::10")
)

// inNetns runs body inside a network namespace of its own, created for the
// test and deleted after it.
//
// The whole test binary is re-executed inside the namespace
// (`ip netns exec NS <test binary> -test.run '^Test$/^sub$'`, marked by
// childEnv) rather than switching one goroutine's thread with setns: a
// namespace belongs to a thread, and the code under test has goroutines on
// other threads (netlink subscriptions) and starts iptables processes that
// inherit the namespace of whichever thread forks them. Re-executed, every
// thread and child process of the test lives in the namespace and the
// host's links and rules cannot be touched. The parent only creates and
// deletes the namespace and reports the child's result; env is added to the
// child's environment.
func inNetns(t *testing.T, env []string, body func(t *testing.T)) {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		body(t)
		return
	}
	requireNetns(t)
	ns, out, err := runInNewNetns(t, env)
	if emu := os.Getenv(emulatorEnv); emu != "" && emulatorDeadlock(err) {
		// Go programs under QEMU 7.2's user mode can hang starting a
		// process (docs/crossarch.md), and the emulated test starts
		// iptables for every rule. A child killed after
		// emulatedChildTimeout is tried once more, in a fresh namespace,
		// and logged (make crossarch counts these lines); a hang of ours
		// would hang again and fail.
		t.Logf("in netns %s under %s: killed after %v without a result; trying once more:\n%s", ns, emu, emulatedChildTimeout, out)
		ns, out, err = runInNewNetns(t, env)
	}
	switch {
	case strings.Contains(out, "--- SKIP: "+t.Name()+" "):
		t.Skip(skipReason(out, t.Name()))
	case err == nil && strings.Contains(out, "--- PASS: "+t.Name()+" "):
		if testing.Verbose() {
			t.Logf("in netns %s:\n%s", ns, out)
		}
	default:
		t.Fatalf("in netns %s: %v\n%s", ns, err, out)
	}
}

// emulatedChildTimeout bounds a re-executed test under emulation from
// outside (coreutils' timeout, native, signalling the child's whole process
// group): a deadlocked emulator never runs the guest's signal handlers, so
// only SIGKILL, emulatedKillAfter after SIGTERM, ends it. Such a child takes
// 1-5 s, tens of seconds on a loaded machine; natively childTimeout bounds it.
const (
	emulatedChildTimeout = 50 * time.Second
	emulatedKillAfter    = 5 * time.Second
)

// emulatorDeadlock reports whether err says the child was stopped for
// time: timeout(1) exits 124 when SIGTERM ended it; when it had to send
// SIGKILL, it sends it to its own process group, itself included (as the
// context's backstop would kill it).
func emulatorDeadlock(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ee.ExitCode() == 124 || ee.ExitCode() == 137 ||
		ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// runInNewNetns re-executes the test in a network namespace made for it
// (deleted at the end of the test) and returns the namespace, the child's
// output and its error.
func runInNewNetns(t *testing.T, env []string) (string, string, error) {
	t.Helper()
	ns := "nlt-" + randomHex(t, 5)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add unavailable: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	name, args := "ip", []string{"netns", "exec", ns, exe,
		"-test.run", runPattern(t.Name()), "-test.v", "-test.count=1", "-test.timeout=" + childTimeout.String()}
	bound := childTimeout
	// Under user-mode emulation (go test -exec qemu-ARCH-static, no binfmt
	// entry) the binary is foreign to the kernel: the child runs through the
	// same emulator, which the cross-architecture run names here, bounded
	// from outside by timeout(1): SIGTERM to its process group, SIGKILL
	// emulatedKillAfter later. The context is only a backstop then.
	if emu := os.Getenv(emulatorEnv); emu != "" {
		name = "timeout"
		args = append([]string{"-k", strconv.Itoa(int(emulatedKillAfter.Seconds())),
			strconv.Itoa(int(emulatedChildTimeout.Seconds())), "ip", "netns", "exec", ns, emu}, args[3:]...)
		bound = emulatedChildTimeout + 2*emulatedKillAfter
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	// A grandchild that outlives a killed child keeps the output pipe open:
	// stop waiting for it.
	cmd.WaitDelay = 5 * time.Second
	// A -race binary sleeps 1 s at exit (atexit_sleep_ms) to catch leaked
	// goroutines; the parent's own exit does that once for all children.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), childEnv+"="+ns, "GORACE="+gorace), env...)
	out, err := cmd.CombinedOutput()
	return ns, string(out), err
}

var (
	netnsOnce   sync.Once
	netnsReason string
)

// requireNetns skips t unless it runs as root with ip(8) and iptables.
func requireNetns(t *testing.T) {
	t.Helper()
	netnsOnce.Do(func() {
		if os.Geteuid() != 0 {
			netnsReason = "needs root to create network namespaces"
			return
		}
		for _, tool := range []string{"ip", "iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"} {
			if _, err := exec.LookPath(tool); err != nil {
				netnsReason = fmt.Sprintf("%s not found: %v", tool, err)
				return
			}
		}
	})
	if netnsReason != "" {
		t.Skip(netnsReason)
	}
}

// runPattern anchors each element of a test name for -test.run.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// skipReason extracts what the child logged for the skipped test: the
// indented lines just before its SKIP line (logs stream as they happen).
func skipReason(out, name string) string {
	var reason []string
	for line := range strings.Lines(out) {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "=== "):
			reason = reason[:0]
		case strings.HasPrefix(trimmed, "--- SKIP: "+name+" "):
			return "in netns: " + strings.Join(reason, "; ")
		case trimmed != "":
			reason = append(reason, trimmed)
		}
	}
	return "in netns: skipped"
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// sh runs a command and fails the test if it fails.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// stdout runs a command and returns its standard output only.
func stdout(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}

// eventually polls cond every 10 ms until it holds or within has passed,
// and returns how long it took.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// adoptableLink sets lo up and makes a veth end named name for Setup to
// adopt: this kernel may have no dummy link type, and adopting must work
// with any link type.
func adoptableLink(t *testing.T, name string) {
	t.Helper()
	sh(t, "ip", "link", "set", "lo", "up")
	sh(t, "ip", "link", "add", "nlt-a", "type", "veth", "peer", "name", "nlt-b")
	sh(t, "ip", "link", "set", "nlt-a", "name", name)
}

// dummySupported reports whether the namespace can have a dummy link, and
// if not, why.
func dummySupported(t *testing.T) (bool, string) {
	t.Helper()
	out, err := exec.Command("ip", "link", "add", "nlt-probe", "type", "dummy").CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("kernel has no dummy link type (ip link add type dummy: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	sh(t, "ip", "link", "del", "nlt-probe")
	return true, ""
}

// linkAddrs returns the addresses on a link, as `ip addr` lists them.
func linkAddrs(t *testing.T, name string) string {
	t.Helper()
	return stdout(t, "ip", "-o", "addr", "show", "dev", name)
}

func hasAddr(t *testing.T, link string, a netip.Addr) bool {
	t.Helper()
	return strings.Contains(linkAddrs(t, link), " "+netip.PrefixFrom(a, a.BitLen()).String()+" ")
}

// recorder is an Observer that remembers what it was told.
type recorder struct {
	mu       sync.Mutex
	errs     map[string]int
	backends []string
}

func (r *recorder) SetupError(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = make(map[string]int)
	}
	r.errs[kind]++
}

func (r *recorder) Backend(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.backends = append(r.backends, name)
}

func (r *recorder) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs[kind]
}

func (r *recorder) noErrors(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for kind, n := range r.errs {
		if n != 0 {
			t.Errorf("setup error %s counted %d times", kind, n)
		}
	}
}

func (r *recorder) backendsSeen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.backends...)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func familiesOf(addrs []netip.Addr) []family {
	var fams []family
	seen := map[family]bool{}
	for _, a := range addrs {
		if f := familyOf(a); !seen[f] {
			seen[f] = true
			fams = append(fams, f)
		}
	}
	return fams
}
