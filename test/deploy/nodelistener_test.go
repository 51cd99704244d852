package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// counters reads the packet counters of the mangle table's OUTPUT rules
// tagged with a comment (the daemon's own rules are in raw and filter: a
// packet is counted here whatever they do), by comment.
func counters(t *testing.T, in func(args ...string) *exec.Cmd) map[string]int {
	t.Helper()
	out := mustRun(t, in("iptables", "-t", "mangle", "-L", "OUTPUT", "-v", "-x", "-n"))
	re := regexp.MustCompile(`^\s*(\d+)\s+\d+\s.*/\* (\S+) \*/`)
	got := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			got[m[2]] += n
		}
	}
	return got
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers in
// different goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// delta is after minus before, per counter.
func delta(before, after map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// TestNodeListenerServesTheNode runs the real binary as on a node whose
// own resolv.conf points at the node listener (-node-listen), the way
// docs/deploy.md says to: the node's getent is answered through it from
// the node's resolver, and a second lookup from the cache (no packet
// upstream); the daemon's resolver list, which names the node listener
// too (as the node's own file does once it points there), loses that
// address. When the resolver dies, a lookup is SERVFAIL at once, with
// the packets counted: one to the node listener per client query, none
// from the daemon to itself. A resolver that forwards back to the node
// listener (a loop through a forwarder) costs a bounded number of packets,
// not a storm: the looped question joins the flight it came from.
func TestNodeListenerServesTheNode(t *testing.T) {
	dig := need(t, "dig")
	dnsmasq := need(t, "dnsmasq")
	need(t, "getent")
	ns, in := netns(t)
	bin := buildBinary(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
	for _, r := range [][]string{
		{"-d", "127.0.0.1", "-p", "udp", "--dport", "53", "-m", "comment", "--comment", "upstream"},
		{"-d", "127.0.0.1", "-p", "tcp", "--dport", "53", "-m", "comment", "--comment", "upstream"},
		{"-d", "127.0.0.2", "-p", "udp", "--dport", "53", "-m", "comment", "--comment", "forwarder"},
		{"-d", "169.254.20.11", "-p", "udp", "--dport", "53", "-m", "comment", "--comment", "node-listener"},
		{"-d", "169.254.20.11", "-p", "tcp", "--dport", "53", "-m", "comment", "--comment", "node-listener"},
	} {
		mustRun(t, in(append([]string{"iptables", "-t", "mangle", "-A", "OUTPUT"}, r...)...))
	}
	// The node's resolv.conf, as ip netns exec shows it to what runs in
	// the namespace (getent and the daemon alike): the node listener.
	etc := filepath.Join("/etc/netns", ns)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 169.254.20.11\noptions timeout:5 attempts:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	up := exec.CommandContext(ctx, "ip", "netns", "exec", ns, dnsmasq, "--no-daemon", "--no-resolv", "--no-hosts",
		"--listen-address=127.0.0.1", "--bind-interfaces", "--port=53", "--local-ttl=60",
		"--host-record=www.example.com,192.0.2.1,2001:db8::1", "--host-record=other.example.com,192.0.2.2,2001:db8::2",
		"--pid-file="+filepath.Join(dir, "up.pid"))
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	upDone := make(chan struct{})
	go func() { _ = up.Wait(); close(upDone) }()
	defer func() { _ = up.Process.Kill(); <-upDone }()

	// The daemon's resolvers: the node's list as systemd-resolved would
	// write it with the node listener configured, ours first.
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 169.254.20.11\nnameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "-local-mode", "-setupinterface=true", "-setupiptables=true",
		"-localip", "169.254.20.10", "-node-listen", "169.254.20.11", "-resolv-conf", rc, "-syncinterval", "1s",
		"-metrics-listen-address", "127.0.0.1:9253", "-state-dir", stateDir(t), "-lameduck", "200ms")
	var stderr lockedBuffer // written by exec's copying goroutine while read here
	d.Stderr = &stderr
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	defer func() {
		_ = d.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = d.Process.Kill()
		}
	}()
	waitNodeReady(t, in, exited, &stderr)
	// The "serving" line comes just after /ready turns ok.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(stderr.String(), `msg=serving`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no serving line:\n%s", stderr.String())
		}
	}
	if !strings.Contains(stderr.String(), `nameservers=[127.0.0.1:53]`) {
		t.Fatalf("the daemon did not drop its own node listener from its resolvers:\n%s", stderr.String())
	}
	addrs := mustRun(t, in("ip", "addr", "show", "nodelocaldns"))
	if !strings.Contains(addrs, "169.254.20.11/32") || !strings.Contains(addrs, "169.254.20.10/32") {
		t.Fatalf("the link lacks an address:\n%s", addrs)
	}

	// The node's own lookups: through the node listener, then the cache.
	c0 := counters(t, in)
	if got := strings.Fields(mustRun(t, in("getent", "hosts", "www.example.com"))); len(got) == 0 || got[0] != "2001:db8::1" {
		t.Fatalf("getent hosts www.example.com: %v", got)
	}
	c1 := counters(t, in)
	if d := delta(c0, c1); d["upstream"] == 0 || d["node-listener"] == 0 {
		t.Fatalf("first lookup: packets %v: the node's query did not go through the node listener to its resolver", d)
	}
	if got := strings.Fields(mustRun(t, in("getent", "hosts", "www.example.com"))); len(got) == 0 || got[0] != "2001:db8::1" {
		t.Fatalf("second getent: %v", got)
	}
	c2 := counters(t, in)
	if d := delta(c1, c2); d["upstream"] != 0 || d["node-listener"] == 0 {
		t.Fatalf("second lookup: packets %v, want none upstream (answered from the cache)", d)
	}

	// The resolver dies: SERVFAIL at once, one packet in, none to ourselves.
	_ = up.Process.Kill()
	<-upDone
	start := time.Now()
	out := mustRun(t, in(dig, "@169.254.20.11", "+tries=1", "+time=10", "gone.example.com"))
	took := time.Since(start)
	c3 := counters(t, in)
	d3 := delta(c2, c3)
	t.Logf("dead resolver: dig answered in %v; packets %v", took, d3)
	if !strings.Contains(out, "status: SERVFAIL") {
		t.Fatalf("dead resolver: %s", out)
	}
	if took > 2*time.Second || d3["node-listener"] != 1 || d3["upstream"] > 4 {
		t.Fatalf("dead resolver: %v, packets %v: want SERVFAIL without waiting out a timeout, one query in, a few out", took, d3)
	}
	start = time.Now()
	if out, err := in("getent", "hosts", "other.example.com").CombinedOutput(); err == nil {
		t.Fatalf("getent with a dead resolver succeeded: %s", out)
	}
	c4 := counters(t, in)
	t.Logf("dead resolver: getent failed after %v; packets %v", time.Since(start), delta(c3, c4))
	if time.Since(start) > 4*time.Second || delta(c3, c4)["node-listener"] > 4 {
		t.Fatalf("getent with a dead resolver: %v, packets %v", time.Since(start), delta(c3, c4))
	}

	testForwarderLoop(t, ctx, ns, in, dnsmasq, dig, rc, dir)

	// Killed: the node's lookups go to its own resolver (the fallback's
	// DNAT, once the gate is stale), not to kube-dns and not lost.
	if err := os.WriteFile(rc, []byte("nameserver 169.254.20.11\nnameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	up2 := exec.CommandContext(ctx, "ip", "netns", "exec", ns, dnsmasq, "--no-daemon", "--no-resolv", "--no-hosts",
		"--listen-address=127.0.0.1", "--bind-interfaces", "--port=53", "--local-ttl=60",
		"--host-record=after.example.com,192.0.2.3,2001:db8::3", "--pid-file="+filepath.Join(dir, "up2.pid"))
	if err := up2.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = up2.Process.Kill(); _ = up2.Wait() }()
	waitNAT(t, in, "--to-destination 127.0.0.1:53")
	_ = d.Process.Kill()
	<-exited
	exited <- nil               // for the deferred stop
	time.Sleep(3 * time.Second) // -fallback-after (2 s): the host's gate goes stale
	if got := strings.Fields(mustRun(t, in("getent", "hosts", "after.example.com"))); len(got) == 0 || got[0] != "2001:db8::3" {
		t.Fatalf("killed: getent hosts through the node listener: %v", got)
	}
}

// testForwarderLoop points the daemon's resolvers at a forwarder that
// sends everything back to the node listener, and counts the packets of
// one client query while the loop runs until the daemon's forward timeout.
func testForwarderLoop(t *testing.T, ctx context.Context, ns string, in func(args ...string) *exec.Cmd, dnsmasq, dig, rc, dir string) {
	fw := exec.CommandContext(ctx, "ip", "netns", "exec", ns, dnsmasq, "--no-daemon", "--no-resolv", "--no-hosts",
		"--listen-address=127.0.0.2", "--bind-interfaces", "--port=53", "--server=169.254.20.11", "--cache-size=0",
		"--pid-file="+filepath.Join(dir, "fw.pid"))
	if err := fw.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fw.Process.Kill(); _ = fw.Wait() }()
	if err := os.WriteFile(rc, []byte("nameserver 169.254.20.11\nnameserver 127.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Applied once the node listener's fallback DNAT names the forwarder
	// (written every -syncinterval from the resolvers as applied); until
	// then the dead resolver would answer SERVFAIL and prove nothing.
	waitNAT(t, in, "--to-destination 127.0.0.2:53")
	c0 := counters(t, in)
	start := time.Now()
	out, _ := in(dig, "@169.254.20.11", "+tries=1", "+time=15", "loop.example.com").CombinedOutput()
	took := time.Since(start)
	time.Sleep(time.Second)
	d := delta(c0, counters(t, in))
	t.Logf("forwarder loop: dig after %v: %s; packets %v", took, firstLine(string(out), "status:"), d)
	if d["node-listener"] > 20 || d["forwarder"] > 20 {
		t.Fatalf("forwarder loop: packets %v for one query: a storm", d)
	}
	if d["forwarder"] == 0 {
		t.Fatalf("forwarder loop: packets %v: the daemon never asked the forwarder (no loop to bound)", d)
	}
	if !strings.Contains(string(out), "status: SERVFAIL") {
		t.Fatalf("forwarder loop: %s", out)
	}
}

// waitNAT waits (15 s at most) until the nat table's rules contain want:
// the node listener's fallback DNAT names the node's resolvers as the
// daemon applied them.
func waitNAT(t *testing.T, in func(args ...string) *exec.Cmd, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(mustRun(t, in("iptables", "-t", "nat", "-S")), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the node listener's fallback does not name %q:\n%s", want, mustRun(t, in("iptables", "-t", "nat", "-S")))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// waitNodeReady waits until the daemon in the namespace answers /ready.
func waitNodeReady(t *testing.T, in func(args ...string) *exec.Cmd, exited <-chan error, stderr fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := in("curl", "-sf", "http://127.0.0.1:9253/ready").CombinedOutput()
		if strings.TrimSpace(string(out)) == "ok" {
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("daemon exited: %v\n%s", err, stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready\n%s", stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
