package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/statedir"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// logBuffer collects a daemon's log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testConfig(node netip.AddrPort) *config.Config {
	return &config.Config{
		LocalIPs:      []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		LocalMode:     true,
		ClusterDomain: "cluster.local.",
		Nameservers:   []netip.AddrPort{node},
		MetricsAddr:   "127.0.0.1:0",
		Cache: config.CacheConfig{
			SuccessCapacity: 9984, DenialCapacity: 9984, MaxBytes: 64 << 20,
			ClusterSuccessTTL: 30 * time.Second, ClusterDenialTTL: 5 * time.Second,
			SuccessTTL: 30 * time.Second, DenialTTL: 30 * time.Second, ServFailTTL: 2 * time.Second,
		},
		UDPSockets:     2,
		MaxUDPSize:     1232,
		MaxInflight:    1024,
		MaxTCPConns:    100,
		TCPIdleTimeout: 10 * time.Second,
		ForwardTimeout: 2 * time.Second,
		TCPPoolSize:    2,
	}
}

// startDaemon starts a daemon from cfg with the given instance id (""
// for the real one) and logs into the returned buffer. The caller shuts it
// down (stop), at most once.
func startDaemon(t *testing.T, cfg *config.Config, id string) (*Daemon, *logBuffer, func() error) {
	t.Helper()
	return startDaemonOpt(t, cfg, Options{InstanceIDForTest: id})
}

// startDaemonOpt is startDaemon with all of Options.
func startDaemonOpt(t *testing.T, cfg *config.Config, opt Options) (*Daemon, *logBuffer, func() error) {
	t.Helper()
	logs := &logBuffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("start: %v\n%s", err, logs)
	}
	var once sync.Once
	var serr error
	stop := func() error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			serr = d.shutdown(ctx, 0)
		})
		return serr
	}
	t.Cleanup(func() { _ = stop() })
	return d, logs, stop
}

// freeUDPAndTCP returns an address of 127.0.0.0/8 that no other test
// uses and a port free there for both UDP and TCP (a UDP port alone may be
// some test's TCP port: that failed under the load of the full run).
func freeUDPAndTCP(t *testing.T) (netip.Addr, int) {
	t.Helper()
	ip := netip.AddrFrom4([4]byte{127, byte(100 + rand.IntN(100)), byte(1 + rand.IntN(250)), byte(1 + rand.IntN(250))})
	for try := 0; try < 50; try++ {
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(ip, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, uint16(port)).String())
		pc.Close()
		if err == nil {
			ln.Close()
			return ip, port
		}
	}
	t.Fatal("no port free for both UDP and TCP")
	return ip, 0
}

// waitTimers waits until code under test waits on a timer of c, so that
// moving c reaches it.
func waitTimers(t *testing.T, c *clock.Fake) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Timers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nothing waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthFailsWhenAServingLoopIsWedged: /health is 500 while one of the
// UDP receive loops is stuck (the test hook pauses it), although the
// kernel may steer the probe's query to the other, healthy socket; it is
// 200 again once the loop runs.
func TestHealthFailsWhenAServingLoopIsWedged(t *testing.T) {
	node := startUpstream(t, records)
	d, _, _ := startDaemon(t, testConfig(node.addr), "")
	url := "http://" + d.MetricsAddr().String() + "/health"
	if code, body := httpStatus(t, url); code != 200 {
		t.Fatalf("healthy daemon: /health %d %s", code, body)
	}
	resume := d.Server.PauseUDP(1)
	code, body := httpStatus(t, url)
	if code != 500 || !strings.Contains(body, "udp loop 1") {
		resume()
		t.Fatalf("wedged loop: /health %d %q, want 500 naming udp loop 1", code, body)
	}
	resume()
	deadline := time.Now().Add(10 * time.Second) // against a hang, not a speed claim
	for {
		if code, _ := httpStatus(t, url); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/health not 200 again after the loop resumed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReadyIsUnreadyFromShutdownOn: /ready is 200 once started and 503 as
// soon as shutdown begins, while queries are still answered for the whole
// lame duck, which ends when the clock has passed it.
func TestReadyIsUnreadyFromShutdownOn(t *testing.T) {
	node := startUpstream(t, records)
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, _, _ := startDaemonOpt(t, testConfig(node.addr), Options{Clock: fake})
	url := "http://" + d.MetricsAddr().String() + "/ready"
	if code, _ := httpStatus(t, url); code != 200 {
		t.Fatalf("/ready %d after start", code)
	}
	const lameDuck = 5 * time.Second
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- d.shutdown(ctx, lameDuck)
	}()
	// Readiness fails at once; the bound is only against a hang.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _ := httpStatus(t, url)
		if code == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready %d after shutdown began", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Lame duck: still answering.
	c := &dns.Client{Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion("lame.example.com.", dns.TypeA)
	if r, _, err := c.Exchange(m, d.Server.Addr().String()); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("query during lame duck: %v %v", r, err)
	}
	// Just short of the lame duck: still serving, shutdown not done.
	waitTimers(t, fake)
	fake.Advance(lameDuck - time.Millisecond)
	if r, _, err := c.Exchange(m, d.Server.Addr().String()); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("query at the end of the lame duck: %v %v", r, err)
	}
	select {
	case err := <-done:
		t.Fatalf("shutdown returned before the lame duck ended: %v", err)
	default:
	}
	fake.Advance(time.Millisecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("shutdown did not finish after the lame duck")
	}
}

// TestTwinAdoptsSocketsAndProbesReachEachInstance runs two instances on
// one address and port in one process (ids as two PIDs would give): the
// second adopts the first's sockets over the control socket, each
// instance's exec probe reaches that instance, and after the first exits
// the second serves alone, with its registry entry gone.
// twins prepares instances that meet as twins: a state directory of their
// own, an address and port, and the PID namespace's inode their ids start
// with. mk returns a fresh configuration for one of them; it skips the test
// where the namespace cannot be read.
func twins(t *testing.T, node netip.AddrPort) (mk func() *config.Config, ip netip.Addr, port int, pidns uint64) {
	t.Helper()
	stateDir, err := os.MkdirTemp("", "nld")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(stateDir) })
	if pidns, err = statedir.NSInode("pid"); err != nil {
		t.Skip(err)
	}
	ip, port = freeUDPAndTCP(t)
	mk = func() *config.Config {
		c := testConfig(node)
		c.LocalIPs = []netip.Addr{ip}
		c.Port = port
		c.StateDir = stateDir
		return c
	}
	return mk, ip, port, pidns
}

func TestTwinAdoptsSocketsAndProbesReachEachInstance(t *testing.T) {
	node := startUpstream(t, records)
	mk, _, _, pidns := twins(t, node.addr)
	stateDir := mk().StateDir
	// PIDs above the kernel's pid_max: no live process can have them.
	const pidA, pidB = 5000001, 5000002
	a, logsA, stopA := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidA))
	b, logsB, _ := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidB))
	if !strings.Contains(logsB.String(), "serving a twin's listening sockets") || !strings.Contains(logsB.String(), "udp=2 tcp=1") {
		t.Fatalf("B did not adopt A's sockets:\n%s", logsB)
	}
	if !strings.Contains(logsA.String(), "handed listening sockets to a twin") {
		t.Fatalf("A did not hand over:\n%s", logsA)
	}
	for _, pid := range []int{pidA, pidB} {
		if err := Probe(stateDir, "ready", pid, 2*time.Second); err != nil {
			t.Fatalf("probe ready %d: %v", pid, err)
		}
		if err := Probe(stateDir, "health", pid, 2*time.Second); err != nil {
			t.Fatalf("probe health %d: %v", pid, err)
		}
	}
	if err := Probe(stateDir, "ready", 0, 2*time.Second); err == nil || !strings.Contains(err.Error(), "-probe-pid") {
		t.Fatalf("ambiguous probe: %v", err)
	}
	// A shuts down: readiness of A fails at once, B stays ready.
	a.stopping.Store(true)
	if err := Probe(stateDir, "ready", pidA, 2*time.Second); err == nil {
		t.Fatal("A ready while stopping")
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logsA.String(), "leaving link and rules to it") || !strings.Contains(logsA.String(), "twin_pids="+fmt.Sprint(pidB)) {
		t.Fatalf("A did not see its twin on exit:\n%s", logsA)
	}
	if err := Probe(stateDir, "ready", pidA, 2*time.Second); err == nil || !strings.Contains(err.Error(), "no running nodelocaldns") {
		t.Fatalf("probe of exited A: %v", err)
	}
	if err := Probe(stateDir, "ready", 0, 2*time.Second); err != nil {
		t.Fatalf("only B left, probe without pid: %v", err)
	}
	c := &dns.Client{Timeout: 2 * time.Second}
	for _, network := range []string{"udp", "tcp"} {
		c.Net = network
		m := new(dns.Msg)
		m.SetQuestion("after.example.com.", dns.TypeA)
		if r, _, err := c.Exchange(m, b.Server.Addr().String()); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s to B after A exited: %v %v", network, r, err)
		}
	}
}

// TestTwinAdoptsWildcardSockets: two instances listening on the wildcard
// (bind 0.0.0.0) meet as twins as well, the second adopting the first's
// wildcard sockets; after the first exits the second answers on an
// address nobody listed (127.0.0.2), over UDP from that address, and TCP.
func TestTwinAdoptsWildcardSockets(t *testing.T) {
	node := startUpstream(t, records)
	mk0, _, port, pidns := twins(t, node.addr)
	// twins' port is free on its loopback address; the wildcard needs one
	// free on every address.
	port = testhost.FreeWildcardPort(t)
	mk := func() *config.Config {
		c := mk0()
		c.LocalIPs = []netip.Addr{netip.IPv4Unspecified()}
		c.Port = port
		return c
	}
	const pidA, pidB = 5000003, 5000004
	_, logsA, stopA := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidA))
	_, logsB, _ := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidB))
	if !strings.Contains(logsB.String(), "serving a twin's listening sockets") || !strings.Contains(logsB.String(), "udp=2 tcp=1") {
		t.Fatalf("B did not adopt A's wildcard sockets:\n%s", logsB)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logsA.String(), "handed listening sockets to a twin") {
		t.Fatalf("A did not hand over:\n%s", logsA)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port))
	pc, err := net.ListenUDP("udp4", nil) // unconnected: the answer's source is read
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	m := new(dns.Msg)
	m.SetQuestion("after.example.com.", dns.TypeA)
	q, _ := m.Pack()
	if _, err := pc.WriteToUDPAddrPort(q, dst); err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := pc.ReadFromUDPAddrPort(buf)
	r := new(dns.Msg)
	if err == nil {
		err = r.Unpack(buf[:n])
	}
	if err != nil || r.Rcode != dns.RcodeSuccess || from != dst {
		t.Fatalf("udp to B at %s after A exited: from %s: %v %v", dst, from, r, err)
	}
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	if r, _, err := c.Exchange(m, dst.String()); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("tcp to B at %s after A exited: %v %v", dst, r, err)
	}
}

// TestGroupLockHeldByAnyoneDelaysStartOnly: anyone who can write the state
// directory can hold the group's flock (issue 41). A start waits for it
// at most startLockWait, then starts without it, saying so, instead of
// failing (a crash loop would take the node's DNS).
func TestGroupLockHeldByAnyoneDelaysStartOnly(t *testing.T) {
	node := startUpstream(t, records)
	mk, _, _, pidns := twins(t, node.addr)
	cfg := mk()
	thief, err := statedir.Open(cfg.StateDir, "thief", cfg.LocalIPs, cfg.Port)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := thief.LockGroup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	defer func(w time.Duration) { startLockWait = w }(startLockWait)
	startLockWait = 300 * time.Millisecond
	began := time.Now()
	d, logs, _ := startDaemon(t, cfg, fmt.Sprintf("%d-%d", pidns, 5000011))
	if took := time.Since(began); took < startLockWait {
		t.Errorf("started after %v, before the wait for the lock ended", took)
	}
	if !strings.Contains(logs.String(), "starting without the group lock") {
		t.Errorf("no line says so:\n%s", logs)
	}
	m := new(dns.Msg)
	m.SetQuestion("a.example.com.", dns.TypeA)
	if r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, d.Server.Addr().String()); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("not serving: %v %v", r, err)
	}
}
