package fallback

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// nodeEnv marks the test binary re-executed inside the node's namespace;
// its value is the namespace's name.
const nodeEnv = "NLD_FALLBACK_NODE"

// TestMain runs the whole test binary inside a network namespace of its own
// (the node): the daemon, the API server and the kube-proxy stand-in then
// share it, and the host's network is never touched. Without root the
// tests skip.
func TestMain(m *testing.M) {
	if os.Getenv(nodeEnv) != "" || os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	name := fmt.Sprintf("nldfb-node-%06d", rand.IntN(1_000_000))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "fallback: ip netns add %s: %v: %s\n", name, err, out)
		os.Exit(1)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", name, os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), nodeEnv+"="+name)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err := cmd.Run()
	if out, derr := exec.Command("ip", "netns", "del", name).CombinedOutput(); derr != nil {
		fmt.Fprintf(os.Stderr, "fallback: ip netns del %s: %v: %s\n", name, derr, out)
	}
	code := 0
	if err != nil {
		code = 1
		if x, ok := err.(*exec.ExitError); ok {
			code = x.ExitCode()
		}
	}
	os.Exit(code)
}

// inNode skips t unless it runs in the node's namespace (as root), with the
// tools the tests run.
func inNode(t *testing.T, tools ...string) {
	t.Helper()
	if os.Getenv(nodeEnv) == "" {
		t.Skip("needs root: the tests run in network namespaces they create")
	}
	for _, tool := range append([]string{"ip", "iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft", "unshare"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true and %s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s not installed", tool)
		}
	}
}

// sh runs a command in the node and fails t if it fails.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// shIn runs a command in network namespace ns.
func shIn(t *testing.T, ns, name string, args ...string) string {
	t.Helper()
	return sh(t, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Addresses: the node's link-local address and kube-dns' ClusterIP (what
// the cache serves), kube-dns-upstream's ClusterIP (what it forwards to),
// the pod's and the kube-dns pod's addresses, per family.
type addrs struct {
	local, clusterIP, upstream netip.Addr
	pod, kubeDNS, gateway      netip.Addr
	podCIDR                    string
}

var (
	v4 = addrs{
		local: netip.MustParseAddr("169.254.20.10"), clusterIP: netip.MustParseAddr("10.96.0.10"),
		upstream: netip.MustParseAddr("10.96.0.11"), pod: netip.MustParseAddr("10.244.0.7"),
		kubeDNS: netip.MustParseAddr("10.244.0.5"), gateway: netip.MustParseAddr("10.244.0.1"), podCIDR: "10.244.0.0/16",
	}
	v6 = addrs{
		local: netip.MustParseAddr("fd00::10"), clusterIP: netip.MustParseAddr("fd00:96::a"),
		upstream: netip.MustParseAddr("fd00:96::b"), pod: netip.MustParseAddr("fd00:244::7"),
		kubeDNS: netip.MustParseAddr("fd00:244::5"), gateway: netip.MustParseAddr("fd00:244::1"), podCIDR: "fd00:244::/64",
	}
)

func host(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// node is the test's node: the adopted link the daemon puts its addresses
// on, a pod and a kube-dns pod, each in a namespace of its own, reached
// through a veth with a host route (no bridge: nothing but routing and the
// rules under test between them).
type node struct {
	pod, kubeDNS string // namespace names
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{pod: fmt.Sprintf("nldfb-pod-%06d", rand.IntN(1_000_000)), kubeDNS: fmt.Sprintf("nldfb-dns-%06d", rand.IntN(1_000_000))}
	sh(t, "ip", "link", "set", "lo", "up")
	sh(t, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	// No dummy link type on this kernel: the daemon adopts a link of the name.
	sh(t, "ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer")
	sh(t, "ip", "link", "set", "nld-peer", "up")
	for _, p := range []struct{ ns, veth string }{{n.pod, "vp"}, {n.kubeDNS, "vk"}} {
		sh(t, "ip", "netns", "add", p.ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.ns).Run() })
		sh(t, "ip", "link", "add", p.veth, "type", "veth", "peer", "name", "eth0", "netns", p.ns)
		sh(t, "ip", "link", "set", p.veth, "up")
		shIn(t, p.ns, "ip", "link", "set", "lo", "up")
		shIn(t, p.ns, "ip", "link", "set", "eth0", "up")
		for _, f := range []addrs{v4, v6} {
			self := f.pod
			if p.veth == "vk" {
				self = f.kubeDNS
			}
			sh(t, "ip", "addr", "add", host(f.gateway), "dev", p.veth, "nodad")
			sh(t, "ip", "route", "add", host(self), "dev", p.veth)
			shIn(t, p.ns, "ip", "addr", "add", host(self), "dev", "eth0", "nodad")
			shIn(t, p.ns, "ip", "route", "add", "default", "via", f.gateway.String(), "dev", "eth0", "onlink")
		}
	}
	// The node's default route (Service addresses need one before the
	// DNAT): the network behind the kube-dns pod.
	sh(t, "ip", "route", "add", "default", "via", v4.kubeDNS.String(), "dev", "vk", "onlink")
	sh(t, "ip", "-6", "route", "add", "default", "via", v6.kubeDNS.String(), "dev", "vk", "onlink")
	// kube-dns runs on another node, which has the same link-local
	// address and ClusterIP on its own link: a reply to one of them would
	// stay there. The host's fallback must masquerade.
	for _, f := range []addrs{v4, v6} {
		for _, a := range []netip.Addr{f.local, f.clusterIP} {
			shIn(t, n.kubeDNS, "ip", "addr", "add", host(a), "dev", "lo", "nodad")
		}
	}
	return n
}

// inNetns runs f on a thread switched to network namespace ns: sockets it
// creates belong to ns for their whole life.
func inNetns(ns string, f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with the goroutine: never
		// reused in the wrong namespace.
		return fmt.Errorf("setns back: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}
