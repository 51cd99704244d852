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
	for _, c := range straceCalls(string(data)) {
		bad := ""
		switch c.name {
		case "clone", "clone3", "exit_group", "wait4":
		case "tgkill", "tkill":
			// The Go runtime preempts its own threads with SIGURG.
			if !strings.Contains(c.call, "SIGURG") {
				bad = "signals a thread"
			}
		case "execve":
			if execs++; execs > 1 {
				bad = "runs a program"
			}
		case "openat", "open":
			if strings.Contains(c.call, "O_WRONLY") || strings.Contains(c.call, "O_RDWR") || strings.Contains(c.call, "O_CREAT") {
				bad = "opens a file for writing"
			}
		default:
			bad = "is not a read-only check"
		}
		if bad != "" {
			t.Errorf("-check-config %s: %s", bad, c.call)
		}
	}
	if execs != 1 {
		t.Errorf("trace shows %d execve, want the binary's own", execs)
	}
}

// straceCall is one system call from a trace, its two halves joined when
// strace split it.
type straceCall struct {
	name string // the system call's name ("openat"), or "" for a note
	call string // the call as strace prints it, without the PID
}

// straceCalls parses strace -f -o output: "PID name(args) = ret". With
// several threads, strace splits a call that another thread's call
// interrupts into "PID name(args <unfinished ...>" and, later,
// "PID <... name resumed>rest"; the halves are joined into one call. A
// call still unfinished when the trace ends (the process exited during it)
// is returned as far as it got. Signal deliveries ("--- SIGURG ... ---")
// and clean thread exits ("+++ exited with 0 +++") are not calls and are
// left out; any other "+++" line (killed by a signal, a non-zero exit) is
// returned with name "" so a caller sees it.
func straceCalls(trace string) []straceCall {
	var calls []straceCall
	pending := map[string]string{} // PID -> first half of an unfinished call
	var order []string             // PIDs with a pending call, first seen first
	for _, l := range strings.Split(trace, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		pid, rest, ok := strings.Cut(l, " ")
		if !ok || strings.Trim(pid, "0123456789") != "" {
			pid, rest = "", l // no PID column: a single-threaded trace
		}
		rest = strings.TrimSpace(rest)
		switch {
		case strings.HasPrefix(rest, "---"):
			continue
		case strings.HasPrefix(rest, "+++"):
			if rest != "+++ exited with 0 +++" {
				calls = append(calls, straceCall{call: rest})
			}
			continue
		case strings.HasPrefix(rest, "<... "):
			// "<... name resumed>rest": join with the first half.
			end := strings.Index(rest, " resumed>")
			first, ok := pending[pid]
			if end < 0 || !ok {
				calls = append(calls, straceCall{call: rest}) // unparseable: let the caller judge it
				continue
			}
			delete(pending, pid)
			rest = first + rest[end+len(" resumed>"):]
		case strings.HasSuffix(rest, "<unfinished ...>"):
			if _, ok := pending[pid]; !ok {
				order = append(order, pid)
			}
			pending[pid] = strings.TrimSpace(strings.TrimSuffix(rest, "<unfinished ...>"))
			continue
		}
		name, _, _ := strings.Cut(rest, "(")
		calls = append(calls, straceCall{name: name, call: rest})
	}
	for _, pid := range order {
		if first, ok := pending[pid]; ok {
			name, _, _ := strings.Cut(first, "(")
			calls = append(calls, straceCall{name: name, call: first + " <unfinished at exit>"})
		}
	}
	return calls
}

// TestStraceCalls: the trace parser joins split calls (the line
// "<... tgkill resumed>" once failed CI under load), keeps calls cut short
// by the exit, and passes on what it cannot parse.
func TestStraceCalls(t *testing.T) {
	trace := `4242  execve("/tmp/nodelocaldns", ["nodelocaldns"], 0x7ffc /* 3 vars */) = 0
4243  tgkill(4242, 4244, SIGURG <unfinished ...>
4244  openat(AT_FDCWD, "/etc/kube-dns/stubDomains", O_RDONLY|O_CLOEXEC <unfinished ...>
4243  <... tgkill resumed>)             = 0
4244  <... openat resumed>)             = 3
4244  --- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=4242, si_uid=0} ---
4245  openat(AT_FDCWD, "/tmp/x", O_WRONLY|O_CREAT <unfinished ...>
4242  tgkill(4242, 4243, SIGTERM <unfinished ...>
4242  <... tgkill resumed>)             = 0
4244  +++ exited with 0 +++
4246  +++ killed by SIGKILL +++
4247  <... socket resumed>)             = 3
4242  exit_group(0)                     = ?
`
	want := []straceCall{
		{"execve", `execve("/tmp/nodelocaldns", ["nodelocaldns"], 0x7ffc /* 3 vars */) = 0`},
		{"tgkill", "tgkill(4242, 4244, SIGURG)             = 0"},
		{"openat", `openat(AT_FDCWD, "/etc/kube-dns/stubDomains", O_RDONLY|O_CLOEXEC)             = 3`},
		{"tgkill", "tgkill(4242, 4243, SIGTERM)             = 0"},
		{"", "+++ killed by SIGKILL +++"},
		{"", "<... socket resumed>)             = 3"},
		{"exit_group", "exit_group(0)                     = ?"},
		{"openat", `openat(AT_FDCWD, "/tmp/x", O_WRONLY|O_CREAT <unfinished at exit>`},
	}
	got := straceCalls(trace)
	if !slices.Equal(got, want) {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}
