package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// podCommand is the manifest's container as a process on this machine: its
// args and the kubelet's environment, the host paths it mounts moved to
// temporary directories, the node's resolv.conf a test file, and only the
// capabilities the manifest adds (setpriv: bounding set, no_new_privs,
// which is what allowPrivilegeEscalation: false sets).
type podCommand struct {
	bin      string
	caps     []string // lower case, for setpriv
	args     []string
	env      []string
	stateDir string
	probe    []string // the readiness probe, mapped the same way
}

func newPodCommand(t *testing.T, bin string, objs []any, extra ...string) *podCommand {
	t.Helper()
	ctr := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", ctr)
	state, cm := stateDir(t), t.TempDir()
	paths := strings.NewReplacer("=/run/nodelocaldns", "="+state, "=/etc/kube-dns", "="+cm)
	p := &podCommand{bin: bin, stateDir: state}
	for _, a := range containerArgs(ctr, env) {
		p.args = append(p.args, paths.Replace(a))
	}
	p.args = append(p.args, append([]string{"-resolv-conf=" + nodeResolvConf(t)}, extra...)...)
	// The image's PATH, where iptables-legacy and iptables-nft are.
	p.env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for k, v := range env {
		p.env = append(p.env, k+"="+v)
	}
	for _, c := range ctr.SecurityContext.Capabilities.Add {
		p.caps = append(p.caps, strings.ToLower(string(c)))
	}
	for _, a := range ctr.ReadinessProbe.Exec.Command[1:] {
		if a == "/run/nodelocaldns" {
			a = state
		}
		p.probe = append(p.probe, a)
	}
	return p
}

// setpriv prefixes argv with setpriv keeping only caps.
func setpriv(caps []string, argv ...string) []string {
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + c
	}
	return append([]string{"setpriv", "--bounding-set=" + bounding, "--inh-caps=-all", "--no-new-privs", "--"}, argv...)
}

// TestManifestCapabilities runs the real binary as the manifest runs it, in
// a network namespace, with exactly the manifest's capabilities: with both
// iptables backends it creates its addresses, installs its rules, answers
// on port 53, passes the manifest's readiness probe (run with the same
// capabilities, as an exec probe is), and removes everything on SIGTERM.
// Taking one capability away shows each one is needed.
func TestManifestCapabilities(t *testing.T) {
	dig := need(t, "dig")
	need(t, "setpriv")
	need(t, "iptables-legacy-save")
	need(t, "iptables-nft-save")
	bin := buildBinary(t)
	objs := loadManifest(t, iptablesMode)
	without := func(caps []string, c string) []string {
		return slices.DeleteFunc(slices.Clone(caps), func(x string) bool { return x == c })
	}
	tests := []struct {
		name    string
		extra   []string
		drop    string // capability taken away
		save    string
		serves  bool // becomes ready and answers
		rules   bool // installs its rules
		wantLog string
	}{
		// An empty namespace has no kube-proxy rules: auto picks nft.
		{name: "nft", save: "iptables-nft-save", serves: true, rules: true},
		{name: "legacy", extra: []string{"-iptables-mode=legacy"}, save: "iptables-legacy-save", serves: true, rules: true},
		// iptables-legacy talks to the kernel through a raw socket.
		{name: "legacy without NET_RAW", extra: []string{"-iptables-mode=legacy"}, drop: "net_raw", save: "iptables-legacy-save",
			serves: true, wantLog: "iptables rules not installed"},
		{name: "without NET_BIND_SERVICE", drop: "net_bind_service", save: "iptables-nft-save", wantLog: "permission denied"},
		{name: "without NET_ADMIN", drop: "net_admin", save: "iptables-nft-save", wantLog: "set up interface"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, in := netns(t)
			// This kernel has no dummy link type: the daemon adopts a link
			// of its name, as on such nodes.
			mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
			mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
			// -lameduck 0s: the grace arithmetic is TestDeployManifest's.
			p := newPodCommand(t, bin, objs, append([]string{"-lameduck=0s"}, tc.extra...)...)
			caps := p.caps
			if tc.drop != "" {
				if !slices.Contains(caps, tc.drop) {
					t.Fatalf("the manifest does not add %s", tc.drop)
				}
				caps = without(caps, tc.drop)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := in(setpriv(caps, append([]string{p.bin}, p.args...)...)...)
			cmd.Env = p.env
			d := startInstance(t, cmd)
			defer func() { t.Logf("daemon log:\n%s", d.log.String()) }()

			if !tc.serves {
				select {
				case <-d.exited:
					if !strings.Contains(strings.ToLower(d.log.String()), tc.wantLog) {
						t.Fatalf("exited (%v) without %q in the log:\n%s", d.err, tc.wantLog, d.log.String())
					}
				case <-ctx.Done():
					t.Fatalf("still running without %s\n%s", tc.drop, d.log.String())
				}
				return
			}
			probe := in(setpriv(caps, append([]string{p.bin}, p.probe...)...)...)
			for {
				out, err := probe.CombinedOutput()
				if err == nil {
					break
				}
				select {
				case <-d.exited:
					t.Fatalf("exited: %v\n%s", d.err, d.log.String())
				case <-ctx.Done():
					t.Fatalf("readiness probe never passed: %s\n%s", out, d.log.String())
				case <-time.After(50 * time.Millisecond):
				}
				probe = in(setpriv(caps, append([]string{p.bin}, p.probe...)...)...)
			}
			for _, ip := range []string{testLocalDNS, testKubeDNS} {
				out := mustRun(t, in(dig, "@"+ip, "+time=2", "+tries=1", "health-check.nodelocaldns.invalid"))
				if !strings.Contains(out, "status: NOERROR") {
					t.Errorf("dig @%s: %s", ip, out)
				}
			}
			rules := rulesOf(t, in, tc.save)
			if got := strings.Count(rules, "nodelocaldns: "); tc.rules && got == 0 || !tc.rules && got > 0 {
				t.Errorf("%s: %d rules of ours, want them %v:\n%s", tc.save, got, tc.rules, rules)
			}
			if tc.rules && !strings.Contains(rules, "-d "+testKubeDNS+"/32 -p udp -m udp --dport 53") {
				t.Errorf("no NOTRACK for the kube-dns ClusterIP:\n%s", rules)
			}
			if tc.wantLog != "" && !strings.Contains(d.log.String(), tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, d.log.String())
			}
			if !tc.rules {
				return
			}
			if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			select {
			case <-d.exited:
				if d.err != nil {
					t.Fatalf("exit: %v\n%s", d.err, d.log.String())
				}
			case <-ctx.Done():
				t.Fatal("no exit after SIGINT")
			}
			if left := rulesOf(t, in, tc.save); strings.Contains(left, "nodelocaldns") {
				t.Errorf("rules left after exit:\n%s", left)
			}
		})
	}
}

// TestCheckConfigTouchesNothingTraced runs -check-config with the
// manifest's args under strace: no socket, no file opened for writing, no
// directory made, nothing removed or renamed, no program run.
func TestCheckConfigTouchesNothingTraced(t *testing.T) {
	strace := need(t, "strace")
	bin := buildBinary(t)
	objs := loadManifest(t, iptablesMode)
	ctr := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", ctr)
	// A kube-dns ConfigMap to read, as mounted.
	cm := t.TempDir()
	if err := os.WriteFile(filepath.Join(cm, "stubDomains"), []byte(`{"acme.local": ["192.0.2.7"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{}
	for _, a := range containerArgs(ctr, env) {
		args = append(args, strings.Replace(a, "=/etc/kube-dns", "="+cm, 1))
	}
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(strace, append([]string{"-f", "-qq", "-o", trace,
		"-e", "trace=%network,%process,openat,open,creat,mkdir,mkdirat,unlink,unlinkat,rename,renameat,renameat2,rmdir,truncate,chmod,fchmodat,symlink,link",
		bin}, append(args, "-resolv-conf="+nodeResolvConf(t), "-check-config")...)...)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "ptrace") {
			t.Skipf("strace cannot trace here: %s", out)
		}
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "configuration is valid") || !strings.Contains(string(out), "acme.local") {
		t.Errorf("-check-config output:\n%s", out)
	}
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	execs := 0
	for _, l := range strings.Split(string(data), "\n") {
		call := l
		if i := strings.IndexByte(call, ' '); i >= 0 {
			call = strings.TrimSpace(call[i:]) // drop the PID
		}
		name, _, _ := strings.Cut(call, "(")
		bad := ""
		switch name {
		case "", "clone", "clone3", "exit_group", "wait4", "+++ exited with 0 +++":
		case "tgkill", "tkill":
			// The Go runtime preempts its own threads with SIGURG.
			if !strings.Contains(call, "SIGURG") {
				bad = "signals a thread"
			}
		case "execve":
			if execs++; execs > 1 {
				bad = "runs a program"
			}
		case "openat", "open":
			if strings.Contains(call, "O_WRONLY") || strings.Contains(call, "O_RDWR") || strings.Contains(call, "O_CREAT") {
				bad = "opens a file for writing"
			}
		default:
			if strings.HasPrefix(name, "+++") || strings.HasPrefix(name, "---") {
				continue
			}
			bad = "is not a read-only check"
		}
		if bad != "" {
			t.Errorf("-check-config %s: %s", bad, l)
		}
	}
	if execs != 1 {
		t.Errorf("trace shows %d execve, want the binary's own", execs)
	}
}
