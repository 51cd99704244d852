package dropin

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s not installed", tool)
	}
	return p
}

func mustRun(t *testing.T, c *exec.Cmd) string {
	t.Helper()
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", c.Args, err, out)
	}
	return string(out)
}

// netns creates a network namespace for one test and removes it after.
func netns(t *testing.T) (string, func(args ...string) *exec.Cmd) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	need(t, "ip")
	name := fmt.Sprintf("nld-dropin-%d", rand.IntN(1_000_000))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	in := func(args ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", name}, args...)...)
	}
	mustRun(t, in("ip", "link", "set", "lo", "up"))
	return name, in
}

// referenceCorefile is the reference manifest's ConfigMap after the docs'
// sed for the mode.
func referenceCorefile(t *testing.T, ipvs bool) string {
	t.Helper()
	tmpl, err := os.ReadFile(filepath.Join(repoRoot(t), "internal/corefile/testdata/reference.Corefile.tmpl"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.NewReplacer("__PILLAR__LOCAL__DNS__", "169.254.20.10", "__PILLAR__DNS__DOMAIN__", "cluster.local").Replace(string(tmpl))
	if ipvs {
		s = strings.ReplaceAll(s, ",__PILLAR__DNS__SERVER__", "")
		return strings.ReplaceAll(s, "__PILLAR__CLUSTER__DNS__", "10.96.0.10")
	}
	return strings.ReplaceAll(s, "__PILLAR__DNS__SERVER__", "10.96.0.10")
}

// The reference manifest run unchanged in a network namespace: its
// container args, its ConfigMap as /etc/coredns/Corefile.base, the kube-dns
// ConfigMap directory as /etc/kube-dns, the kubelet's *_SERVICE_HOST
// environment; /etc and /tmp are overlays and /run a tmpfs private to the
// test (a mount namespace), so the paths are the manifest's own. It serves on every
// address, installs its rules, answers health where the Corefile says and
// metrics on :9253, writes the pidfile and the rendered Corefile, routes a
// stub domain to its own upstream, and applies a ConfigMap edit within 2 s.
func TestReferenceManifestInNamespace(t *testing.T) {
	for _, mode := range []string{"iptables", "ipvs"} {
		t.Run(mode, func(t *testing.T) { referenceManifest(t, mode == "ipvs") })
	}
}

func referenceManifest(t *testing.T, ipvs bool) {
	dig, dnsmasq := need(t, "dig"), need(t, "dnsmasq")
	need(t, "iptables-save")
	need(t, "unshare")
	need(t, "nsenter")
	need(t, "curl")
	ns, in := netns(t)
	bin := buildNodelocaldns(t)
	// No dummy link type on this kernel: the daemon adopts a link of the name.
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))

	// Upstreams inside the namespace: kube-dns behind its upstream Service
	// (iptables mode) or its ClusterIP (IPVS mode), the node's resolver,
	// two stub-domain servers.
	kube := "10.96.0.11"
	if ipvs {
		kube = "10.96.0.10"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	for i, u := range []struct{ addr, answer string }{
		{kube, "/cluster.local/10.96.5.5"},
		{"127.0.0.1", "/example.com/192.0.2.1"},
		{"10.150.0.1", "/acme.local/10.150.9.1"},
		{"10.150.0.2", "/acme.local/10.150.9.2 /other.test/10.150.9.3"},
	} {
		if u.addr != "127.0.0.1" {
			mustRun(t, in("ip", "addr", "add", u.addr+"/32", "dev", "lo"))
		}
		c := exec.CommandContext(ctx, "ip", "netns", "exec", ns, dnsmasq, "--no-daemon", "--no-resolv", "--no-hosts",
			"--listen-address="+u.addr, "--bind-interfaces", "--port=53", "--local-ttl=60",
			fmt.Sprintf("--pid-file=%s/dnsmasq%d.pid", dir, i))
		for _, a := range strings.Fields(u.answer) {
			c.Args = append(c.Args, "--address="+a)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}

	// /etc and /tmp as the pod sees them: overlays whose upper layers hold
	// the ConfigMaps and the node's resolv.conf.
	etcUp, tmpUp := filepath.Join(dir, "etc-up"), filepath.Join(dir, "tmp-up")
	for _, d := range []string{etcUp + "/coredns", etcUp + "/kube-dns", tmpUp, dir + "/etc-work", dir + "/tmp-work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(etcUp+"/coredns/Corefile.base", referenceCorefile(t, ipvs))
	write(etcUp+"/kube-dns/stubDomains", `{"acme.local": ["10.150.0.1"]}`)
	write(etcUp+"/resolv.conf", "nameserver 127.0.0.1\n")
	// The manifest's args, after the docs' sed.
	args := []string{"-localip", "169.254.20.10,10.96.0.10", "-conf", "/etc/Corefile", "-upstreamsvc", "kube-dns-upstream", "-pidfile", "/tmp/node-cache.pid"}
	if ipvs {
		args[1] = "169.254.20.10"
	}
	// /run too: our state directory for twins (/run/nodelocaldns by
	// default) must not meet another test's daemon on the host.
	script := fmt.Sprintf("mount -t overlay overlay -o lowerdir=/etc,upperdir=%s,workdir=%s/etc-work /etc && "+
		"mount -t overlay overlay -o lowerdir=/tmp,upperdir=%s,workdir=%s/tmp-work /tmp && "+
		"mount -t tmpfs tmpfs /run && exec \"$@\"", etcUp, dir, tmpUp, dir)
	argv := append([]string{"netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", bin}, args...)
	d := exec.CommandContext(ctx, "ip", argv...)
	d.Env = append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST=10.96.0.11", "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"KUBE_DNS_SERVICE_HOST=10.96.0.10", "KUBE_DNS_SERVICE_PORT=53", "KUBERNETES_SERVICE_HOST=10.96.0.1")
	var logs testhost.SyncBuffer
	d.Stdout, d.Stderr = &logs, &logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	defer func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
	}()

	// Health where the Corefile says (the manifest's liveness probe).
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := in("curl", "-sf", "http://169.254.20.10:8080/health").CombinedOutput()
		if len(bytes.TrimSpace(out)) > 0 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("daemon exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no health at 169.254.20.10:8080 within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out := mustRun(t, in("curl", "-sf", "http://169.254.20.10:9253/metrics")); !strings.Contains(out, "nodelocaldns_") {
		t.Errorf("metrics on :9253 lack our series")
	}
	if out := mustRun(t, in("curl", "-sf", "http://127.0.0.1:9353/metrics")); !strings.Contains(out, "nodelocaldns_setup_errors_total") {
		t.Errorf("node-cache's own endpoint :9353 lacks the setup error series")
	}
	digA := func(server, name string) string {
		return strings.TrimSpace(mustRun(t, in(dig, "@"+server, "+short", "+time=2", "+tries=1", name)))
	}
	servers := []string{"169.254.20.10"}
	if !ipvs {
		servers = append(servers, "10.96.0.10")
	}
	for _, s := range servers {
		if got := digA(s, "web.default.svc.cluster.local"); got != "10.96.5.5" {
			t.Errorf("@%s cluster name: %q", s, got)
		}
		if got := digA(s, "www.example.com"); got != "192.0.2.1" {
			t.Errorf("@%s external name: %q", s, got)
		}
		if got := digA(s, "a.acme.local"); got != "10.150.9.1" {
			t.Errorf("@%s stub domain: %q", s, got)
		}
	}
	rules := mustRun(t, in("iptables-save"))
	for _, s := range servers {
		if !strings.Contains(rules, "-A PREROUTING -d "+s+"/32 -p udp -m udp --dport 53") {
			t.Errorf("no NOTRACK rule for %s:\n%s", s, rules)
		}
	}
	if !strings.Contains(rules, "--dport 8080") {
		t.Errorf("no rule for the health port 8080")
	}
	pid := d.Process.Pid
	inMnt := func(args ...string) *exec.Cmd {
		// The daemon is a child of ip netns exec / unshare / sh (exec'd):
		// find the process with our binary in the namespace tree.
		return exec.Command("nsenter", append([]string{"-t", daemonPID(t, pid), "-m", "--"}, args...)...)
	}
	if got := strings.TrimSpace(mustRun(t, inMnt("cat", "/tmp/node-cache.pid"))); got != daemonPID(t, pid) {
		t.Errorf("pidfile says %q, daemon is %s", got, daemonPID(t, pid))
	}
	if c := mustRun(t, inMnt("cat", "/etc/Corefile")); !strings.Contains(c, "acme.local:53 {") || strings.Contains(c, "__PILLAR__") {
		t.Errorf("rendered /etc/Corefile:\n%s", c)
	}

	// A kube-dns ConfigMap edit, the kubelet's way (a rename), applies within 2 s.
	mustRun(t, inMnt("sh", "-c", `printf '{"acme.local": ["10.150.0.2"]}' > /etc/kube-dns/.stub.tmp && mv /etc/kube-dns/.stub.tmp /etc/kube-dns/stubDomains`))
	began := time.Now()
	for i := 0; ; i++ {
		if digA("169.254.20.10", fmt.Sprintf("n%d.acme.local", i)) == "10.150.9.2" {
			t.Logf("ConfigMap edit applied in %v", time.Since(began))
			break
		}
		if time.Since(began) > 2*time.Second {
			t.Fatal("ConfigMap edit not applied within 2s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A node-local-dns ConfigMap edit (a new server block) applies within 2 s.
	mustRun(t, inMnt("sh", "-c", `cp /etc/coredns/Corefile.base /etc/coredns/.new && printf 'other.test:53 {\n    bind 169.254.20.10\n    forward . 10.150.0.2\n}\n' >> /etc/coredns/.new && mv /etc/coredns/.new /etc/coredns/Corefile.base`))
	began = time.Now()
	for i := 0; ; i++ {
		if digA("169.254.20.10", fmt.Sprintf("n%d.other.test", i)) == "10.150.9.3" {
			t.Logf("Corefile edit applied in %v", time.Since(began))
			break
		}
		if time.Since(began) > 2*time.Second {
			t.Fatal("Corefile edit not applied within 2s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	_ = exec.Command("kill", "-TERM", daemonPID(t, pid)).Run()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit within 30s of SIGTERM")
	}
	// In a pod ($KUBERNETES_SERVICE_HOST) with no API access (the reference
	// manifest grants none), the exit cannot tell an uninstall from a
	// rollout: it leaves link and rules, the fallback serving until the
	// next pod (docs/design.md, "No black hole"). Nothing left may NOTRACK
	// a query while no socket is bound: every such rule is gated.
	if !strings.Contains(logs.String(), "leaving link, addresses and rules") {
		t.Errorf("the exit did not say it leaves the fallback")
	}
	for _, l := range strings.Split(mustRun(t, in("iptables-save")), "\n") {
		if strings.Contains(l, "--dport 53") && strings.Contains(l, "-j NOTRACK") && !strings.Contains(l, "-m recent --rcheck") {
			t.Errorf("a rule left after exit NOTRACKs queries whether anyone listens or not: %s", l)
		}
	}
}

// daemonPID finds our binary's PID under the launcher's process tree.
func daemonPID(t *testing.T, root int) string {
	t.Helper()
	pids := []int{root}
	for len(pids) > 0 {
		p := pids[0]
		pids = pids[1:]
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
		if strings.HasSuffix(exe, "/nodelocaldns") {
			return fmt.Sprint(p)
		}
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p, p))
		for _, k := range strings.Fields(string(kids)) {
			var n int
			fmt.Sscan(k, &n)
			pids = append(pids, n)
		}
	}
	t.Fatalf("no nodelocaldns under PID %d", root)
	return ""
}
