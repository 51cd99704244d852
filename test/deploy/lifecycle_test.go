package deploy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// instance is one running daemon process.
type instance struct {
	cmd    *exec.Cmd
	log    *testhost.SyncBuffer
	exited chan struct{}
	err    error
}

func startInstance(t *testing.T, cmd *exec.Cmd) *instance {
	t.Helper()
	in := &instance{cmd: cmd, log: &testhost.SyncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = in.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		in.err = cmd.Wait()
		close(in.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-in.exited:
		default:
			_ = cmd.Process.Kill()
			<-in.exited
		}
	})
	return in
}

func (in *instance) pid() int { return in.cmd.Process.Pid }

// exitCode waits up to d for the process to exit and returns its code.
func (in *instance) exitCode(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-in.exited:
	case <-time.After(d):
		t.Fatalf("pid %d: no exit within %v\n%s", in.pid(), d, in.log)
	}
	var ee *exec.ExitError
	switch {
	case in.err == nil:
		return 0
	case errors.As(in.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("wait: %v", in.err)
	return -1
}

// probeCmd runs the exec probe the manifest uses, for one instance, in
// its network namespace (as the kubelet runs it in the container): the
// control socket is the namespace's.
func probeCmd(bin, stateDir, what string, in *instance) error {
	args := []string{bin, "-probe", what, "-state-dir", stateDir, "-probe-pid", fmt.Sprint(in.pid())}
	if ns := in.netns(); ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// netns is the namespace the instance was started in with `ip netns exec`,
// "" for the test's own.
func (in *instance) netns() string {
	if a := in.cmd.Args; len(a) > 3 && filepath.Base(a[0]) == "ip" && a[1] == "netns" && a[2] == "exec" {
		return a[3]
	}
	return ""
}

// waitProbe polls the exec probe until it succeeds.
func waitProbe(t *testing.T, bin, stateDir string, in *instance) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := probeCmd(bin, stateDir, "ready", in)
		if err == nil {
			return
		}
		select {
		case <-in.exited:
			t.Fatalf("daemon exited: %v\n%s", in.err, in.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v\n%s", err, in.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stateDir is a short temporary directory (unix socket paths are bounded).
func stateDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "nld")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// startDnsmasq runs the node's resolver inside namespace ns on 127.0.0.1:53
// and returns a resolv.conf pointing at it.
func startDnsmasq(t *testing.T, ctx context.Context, ns string) string {
	t.Helper()
	dnsmasq := need(t, "dnsmasq")
	dir := t.TempDir()
	up := exec.CommandContext(ctx, "ip", "netns", "exec", ns, dnsmasq, "--no-daemon", "--no-resolv", "--no-hosts",
		"--listen-address=127.0.0.1", "--bind-interfaces", "--port=53", "--local-ttl=60", "--address=/example.com/192.0.2.1",
		"--pid-file="+filepath.Join(dir, "dnsmasq.pid"))
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Process.Kill(); _ = up.Wait() })
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return rc
}

// enterNetns moves the calling goroutine, locked to its thread for good,
// into namespace ns: sockets it opens live there. The thread is discarded
// when the goroutine returns.
func enterNetns(ns string) error {
	runtime.LockOSThread()
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// tally counts what load clients saw.
type tally struct {
	sent, ok, servfail, other, lost atomic.Int64
	mu                              sync.Mutex
	lostAt                          []string // when and what was lost
}

func (c *tally) lose(what string) {
	c.lost.Add(1)
	c.mu.Lock()
	c.lostAt = append(c.lostAt, time.Now().Format("15:04:05.000")+" "+what)
	c.mu.Unlock()
}

func (c *tally) String() string {
	return fmt.Sprintf("sent %d, NOERROR %d, SERVFAIL %d, other %d, lost %d",
		c.sent.Load(), c.ok.Load(), c.servfail.Load(), c.other.Load(), c.lost.Load())
}

func (c *tally) count(b []byte, id uint16) {
	switch {
	case len(b) < 12 || binary.BigEndian.Uint16(b) != id:
		c.other.Add(1)
	case b[3]&0x0F == dns.RcodeSuccess:
		c.ok.Add(1)
	case b[3]&0x0F == dns.RcodeServerFailure:
		c.servfail.Add(1)
	default:
		c.other.Add(1)
	}
}

// load sends queries to addr from inside namespace ns until stop closes:
// udpClients sequential UDP clients, each moving to a new source port (so
// to another SO_REUSEPORT socket) every 20 queries, and tcpClients that
// open one connection per query as glibc does. A query is lost when no
// answer comes within a second. Every client pauses between queries, so
// the load is bounded in rate as well as in time.
func load(t *testing.T, ns, addr string, udpClients, tcpClients int, pause time.Duration, stop <-chan struct{}) (udp, tcp *tally, wait func()) {
	t.Helper()
	udp, tcp = &tally{}, &tally{}
	var wg sync.WaitGroup
	query := func(i int) []byte {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("q%d.example.com.", i%40), dns.TypeA)
		m.Id = uint16(i)
		b, _ := m.Pack()
		return b
	}
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	errs := make(chan error, udpClients+tcpClients)
	for range udpClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := enterNetns(ns); err != nil {
				errs <- err
				return
			}
			buf := make([]byte, 1500)
			var conn net.Conn
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for i := 0; !stopped(); i++ {
				if i%20 == 0 {
					if conn != nil {
						conn.Close()
					}
					var err error
					if conn, err = net.Dial("udp", addr); err != nil {
						errs <- err
						return
					}
				}
				udp.sent.Add(1)
				_, _ = conn.Write(query(i))
				_ = conn.SetReadDeadline(time.Now().Add(time.Second))
				for {
					n, err := conn.Read(buf)
					if err != nil {
						udp.lose(fmt.Sprintf("udp id %d from %s: %v", i, conn.LocalAddr(), err))
						break
					}
					if n >= 2 && binary.BigEndian.Uint16(buf) != uint16(i) {
						continue // late answer to an earlier query
					}
					udp.count(buf[:n], uint16(i))
					break
				}
				time.Sleep(pause)
			}
		}()
	}
	for range tcpClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := enterNetns(ns); err != nil {
				errs <- err
				return
			}
			for i := 0; !stopped(); i++ {
				tcp.sent.Add(1)
				if b, err := tcpQuery(addr, query(i)); err != nil {
					tcp.lose(fmt.Sprintf("tcp id %d: %v", i, err))
				} else {
					tcp.count(b, uint16(i))
				}
				time.Sleep(pause)
			}
		}()
	}
	return udp, tcp, func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("load client: %v", err)
		}
	}
}

func tcpQuery(addr string, q []byte) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return nil, err
	}
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(lb[:]))
	_, err = io.ReadFull(c, b)
	return b, err
}

// TestRollingUpdateLosesNothing is a DaemonSet rollout with maxSurge 1 on
// one node: instance A serves 169.254.20.10 in a namespace (adopted link,
// iptables rules) under steady UDP and TCP load; B starts on the same
// addresses and takes A's sockets over the control socket; A gets SIGTERM
// and exits leaving link and rules to B; the load goes on. Not one query
// is lost or answered SERVFAIL. Then B stops, alone, and removes exactly
// what was added: the namespace's rules and the link's address are as
// before A started.
func TestRollingUpdateLosesNothing(t *testing.T) {
	need(t, "iptables-save")
	ns, in := netns(t)
	bin := buildBinary(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
	before := rulesOf(t, in, "iptables-save")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rc := startDnsmasq(t, ctx, ns)
	dir := stateDir(t)
	daemon := func() *instance {
		return startInstance(t, exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "-local-mode",
			"-setupinterface=true", "-setupiptables=true", "-localip", "169.254.20.10", "-resolv-conf", rc,
			"-metrics-listen-address", "127.0.0.1:9253", "-state-dir", dir, "-udp-sockets", "2", "-lameduck", "3s"))
	}

	a := daemon()
	waitProbe(t, bin, dir, a)
	stop := make(chan struct{})
	udp, tcp, wait := load(t, ns, "169.254.20.10:53", 4, 2, 2*time.Millisecond, stop)
	time.Sleep(time.Second)

	t.Logf("%s starting B", time.Now().Format("15:04:05.000"))
	b := daemon()
	waitProbe(t, bin, dir, b)
	t.Logf("%s B ready", time.Now().Format("15:04:05.000"))
	if !strings.Contains(b.log.String(), "serving a twin's listening sockets") {
		t.Errorf("B did not adopt A's sockets:\n%s", b.log)
	}
	if l := b.log.String(); strings.Contains(l, "iptables rules inserted") || strings.Contains(l, "duplicate iptables rules deleted") {
		t.Errorf("B changed the rules A installed:\n%s", l)
	}
	// Both instances' health and metrics listeners coexist, and each exec
	// probe reaches its own instance.
	if err := probeCmd(bin, dir, "health", a); err != nil {
		t.Errorf("A health: %v", err)
	}
	if err := probeCmd(bin, dir, "health", b); err != nil {
		t.Errorf("B health: %v", err)
	}
	time.Sleep(500 * time.Millisecond)

	t.Logf("%s SIGTERM to A", time.Now().Format("15:04:05.000"))
	_ = a.cmd.Process.Signal(unix.SIGTERM)
	began := time.Now()
	if code := a.exitCode(t, 20*time.Second); code != 0 {
		t.Fatalf("A exited %d\n%s", code, a.log)
	}
	t.Logf("A exited %v after SIGTERM", time.Since(began).Round(time.Millisecond))
	for _, want := range []string{"no lame duck", "leaving link and rules to it"} {
		if !strings.Contains(a.log.String(), want) {
			t.Errorf("A's log lacks %q:\n%s", want, a.log)
		}
	}
	time.Sleep(2 * time.Second) // B alone, under load
	close(stop)
	wait()
	t.Logf("udp: %v", udp)
	t.Logf("tcp: %v", tcp)
	for name, c := range map[string]*tally{"udp": udp, "tcp": tcp} {
		if c.lost.Load() != 0 || c.servfail.Load() != 0 || c.other.Load() != 0 {
			t.Errorf("%s: %v; lost:\n%s", name, c, strings.Join(c.lostAt, "\n"))
		}
	}
	if udp.ok.Load() < 500 || tcp.ok.Load() < 100 {
		t.Errorf("too little load to prove anything: udp %v, tcp %v", udp, tcp)
	}
	during := mustRun(t, in("iptables-save"))
	if !strings.Contains(during, "-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53") {
		t.Errorf("A took the rules with it:\n%s", during)
	}
	if !strings.Contains(mustRun(t, in("ip", "addr", "show", "nodelocaldns")), "169.254.20.10/32") {
		t.Error("A took the address with it")
	}

	_ = b.cmd.Process.Signal(unix.SIGTERM)
	if code := b.exitCode(t, 20*time.Second); code != 0 {
		t.Fatalf("B exited %d\n%s", code, b.log)
	}
	if after := rulesOf(t, in, "iptables-save"); after != before {
		t.Errorf("teardown left a different rule set:\nbefore:\n%s\nafter:\n%s\nB:\n%s", before, after, b.log)
	}
	if strings.Contains(mustRun(t, in("ip", "addr", "show", "nodelocaldns")), "169.254.20.10") {
		t.Errorf("the address A added is still on the link\nB:\n%s", b.log)
	}
}

// TestSIGTERMLameDuckAndSecondSignal: on SIGTERM readiness fails at once
// (exec probe and HTTP /ready) while DNS is still answered for the lame
// duck period; the exit is 0 and comes after the lame duck and well within
// the deadline. A second signal exits at once with code 3.
func TestSIGTERMLameDuckAndSecondSignal(t *testing.T) {
	bin := buildBinary(t)
	nodeIP := testhost.Loopback()
	serveZone(t, nodeIP+":53", "node")
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+nodeIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := stateDir(t)
	ip := testhost.Loopback()
	port := testhost.FreePort(t, ip)
	health := fmt.Sprintf("%s:%d", ip, testhost.FreePort(t, ip))
	start := func(lameduck string) *instance {
		in := startInstance(t, exec.Command(bin, "-local-mode", "-localip", ip, "-port", fmt.Sprint(port), "-resolv-conf", rc,
			"-metrics-listen-address", fmt.Sprintf("%s:%d", ip, testhost.FreePort(t, ip)), "-health-listen-address", health,
			"-state-dir", dir, "-lameduck", lameduck))
		waitProbe(t, bin, dir, in)
		return in
	}
	ask := func() error {
		c := &dns.Client{Timeout: time.Second}
		m := new(dns.Msg)
		m.SetQuestion("example.com.", dns.TypeA)
		r, _, err := c.Exchange(m, fmt.Sprintf("%s:%d", ip, port))
		if err == nil && r.Rcode != dns.RcodeSuccess {
			err = fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
		}
		return err
	}
	readyCode := func() int {
		resp, err := http.Get("http://" + health + "/ready")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	// The lame duck is long enough that the checks below, each an exec or
	// an HTTP request that a loaded machine may stretch to a second or
	// more, all fall inside it: the bounds are about the lame duck, not
	// about speed.
	const lameDuck = 5 * time.Second
	a := start(lameDuck.String())
	if code := readyCode(); code != 200 {
		t.Fatalf("/ready %d", code)
	}
	_ = a.cmd.Process.Signal(unix.SIGTERM)
	began := time.Now()
	deadline := began.Add(lameDuck / 2)
	for probeCmd(bin, dir, "ready", a) == nil || readyCode() != 503 {
		if time.Now().After(deadline) {
			t.Fatalf("still ready %v after SIGTERM\n%s", lameDuck/2, a.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := ask(); err != nil {
		t.Fatalf("no answer during the lame duck: %v", err)
	}
	if err := probeCmd(bin, dir, "health", a); err != nil {
		t.Fatalf("not healthy during the lame duck: %v", err)
	}
	if code := a.exitCode(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, a.log)
	}
	// Prompt: well inside the shutdown deadline (lame duck + 12 s).
	if took := time.Since(began); took < lameDuck || took > lameDuck+4*time.Second {
		t.Fatalf("exit %v after SIGTERM; want the %v lame duck and a prompt drain", took, lameDuck)
	}

	b := start("10s")
	_ = b.cmd.Process.Signal(unix.SIGTERM)
	time.Sleep(200 * time.Millisecond)
	_ = b.cmd.Process.Signal(unix.SIGTERM)
	if code := b.exitCode(t, 5*time.Second); code != 3 { // long before its 10s lame duck ends
		t.Fatalf("second signal: exit %d, want 3\n%s", code, b.log)
	}
}

// TestSIGTERMDuringReloadTearsDown: a kube-dns ConfigMap change has just
// been applied (the replaced groups are still being retired) when SIGTERM
// comes; the daemon still exits 0 within its deadline and removes its
// rules.
func TestSIGTERMDuringReloadTearsDown(t *testing.T) {
	need(t, "iptables-save")
	ns, in := netns(t)
	bin := buildBinary(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	before := rulesOf(t, in, "iptables-save")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc := startDnsmasq(t, ctx, ns)
	cm := t.TempDir()
	if err := os.WriteFile(filepath.Join(cm, "stubDomains"), []byte(`{"acme.local": ["127.0.0.1"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := stateDir(t)
	d := startInstance(t, exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "-local-mode",
		"-setupinterface=true", "-setupiptables=true", "-localip", "169.254.20.10", "-resolv-conf", rc,
		"-metrics-listen-address", "127.0.0.1:9253", "-state-dir", dir, "-lameduck", "1s", "-kubednscm", cm))
	waitProbe(t, bin, dir, d)
	// Point the stub domain elsewhere: the old group is retired over the
	// next few seconds (-forward-timeout + 1 s).
	if err := os.WriteFile(filepath.Join(cm, "stubDomains"), []byte(`{"acme.local": ["127.0.0.2"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.log.String(), "routes updated") {
		if time.Now().After(deadline) {
			t.Fatalf("the ConfigMap change was not applied\n%s", d.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = d.cmd.Process.Signal(unix.SIGTERM)
	began := time.Now()
	if code := d.exitCode(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.log)
	}
	if took := time.Since(began); took > 4*time.Second {
		t.Errorf("exit took %v (1s lame duck); the reload held it up\n%s", took, d.log)
	}
	if after := rulesOf(t, in, "iptables-save"); after != before {
		t.Fatalf("rules left after exit:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
