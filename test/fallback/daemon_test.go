package fallback

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// daemonBinary builds cmd/nodelocaldns once for the package.
func daemonBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("NLD_FALLBACK_BINARY"); bin != "" {
		return bin // another build's (before-and-after figures)
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nld-fallback")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "nodelocaldns")
		if out, err := exec.Command("go", "build", "-o", builtBin, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// daemon is the node's nodelocaldns, started again and again with the same
// arguments and state directory, as a DaemonSet's container is.
type daemon struct {
	t       *testing.T
	argv    []string // the command line (behind unshare when it has an API server)
	env     []string
	metrics string
	log     testhost.SyncBuffer
	cmd     *exec.Cmd
	exited  chan error
	started time.Time
}

// cluster says how the daemon is set up: the iptables backend, the
// family, and whether it reaches an API server.
type cluster struct {
	backend string
	f       addrs
	api     *apiserver.Server
	token   string
	podName string
}

func newDaemon(t *testing.T, c cluster) *daemon {
	t.Helper()
	// Short: the state directory's control sockets must fit in sun_path.
	dir, err := os.MkdirTemp("", "nldfb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+c.f.kubeDNS.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, metrics: fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))}
	args := []string{
		"-localip", c.f.local.String() + "," + c.f.clusterIP.String(), "-upstreamsvc", "kube-dns-upstream",
		"-cluster-domain", "cluster.local", "-kubednscm", "", "-resolv-conf", resolv, "-state-dir", filepath.Join(dir, "state"),
		"-metrics-listen-address", d.metrics, "-health-port", "0", "-lameduck", "500ms", "-iptables-mode", c.backend,
		"-syncinterval", "5s",
	}
	d.env = append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST="+c.f.upstream.String(), "KUBE_DNS_UPSTREAM_SERVICE_PORT=53")
	d.argv = append([]string{daemonBinary(t)}, args...)
	if c.api != nil {
		// In a pod: the service account's files where client-go looks
		// (a tmpfs over /run in a mount namespace of the daemon's own;
		// /var/run is /run), the kubelet's environment.
		sa := filepath.Join(dir, "sa")
		if err := os.MkdirAll(sa, 0o755); err != nil {
			t.Fatal(err)
		}
		ca, err := os.ReadFile(filepath.Join(c.api.Dir, "certs", "apiserver.crt"))
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"token": []byte(c.token), "namespace": []byte("kube-system"), "ca.crt": ca} {
			if err := os.WriteFile(filepath.Join(sa, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		u := strings.TrimPrefix(c.api.URL, "https://")
		h, p, _ := strings.Cut(u, ":")
		d.env = append(d.env, "KUBERNETES_SERVICE_HOST="+h, "KUBERNETES_SERVICE_PORT="+p,
			"POD_NAME="+c.podName, "POD_NAMESPACE=kube-system", "NODE_NAME=node1")
		script := "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && " +
			"cp " + sa + "/* /run/secrets/kubernetes.io/serviceaccount/ && exec \"$@\""
		d.argv = append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"}, d.argv...)
	}
	t.Cleanup(func() {
		if d.cmd != nil && d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Signal(syscall.SIGCONT)
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	return d
}

// start starts the daemon and waits until it is ready.
func (d *daemon) start() {
	d.t.Helper()
	d.cmd = exec.Command(d.argv[0], d.argv[1:]...)
	d.cmd.Env = d.env
	d.cmd.Stdout, d.cmd.Stderr = &d.log, &d.log
	d.started = time.Now()
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(d.cmd, d.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + d.metrics + "/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-d.exited:
			d.t.Fatalf("daemon exited while starting: %v\n%s", err, d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon not ready within 30 s\n%s", d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// signal sends sig; SIGKILL and SIGTERM wait for the exit.
func (d *daemon) signal(sig syscall.Signal) error {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
	if sig != syscall.SIGKILL && sig != syscall.SIGTERM {
		return nil
	}
	select {
	case err := <-d.exited:
		return err
	case <-time.After(30 * time.Second):
		d.t.Fatalf("daemon did not exit within 30 s of %v", sig)
	}
	return nil
}

// metric sums the series written exactly as series.
func (d *daemon) metric(series string) float64 {
	d.t.Helper()
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			_, _ = fmt.Sscan(rest, &v)
			sum += v
		}
	}
	return sum
}

// rulesOf lists the rules naming nodelocaldns in the backend, both families.
func rulesOf(t *testing.T, backend string) []string {
	t.Helper()
	var out []string
	for _, save := range []string{"iptables-" + backend + "-save", "ip6tables-" + backend + "-save"} {
		for _, l := range strings.Split(sh(t, save), "\n") {
			if strings.HasPrefix(l, "-A ") && strings.Contains(l, "nodelocaldns") {
				out = append(out, l)
			}
		}
	}
	return out
}

// addrsOnLink lists the addresses on the adopted link but its fe80::.
func addrsOnLink(t *testing.T) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, f := range strings.Fields(sh(t, "ip", "-o", "addr", "show", "dev", "nodelocaldns")) {
		if p, err := netip.ParsePrefix(f); err == nil && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p.Addr())
		}
	}
	return out
}

// execQuiet runs a command, its output and failure ignored but returned.
func execQuiet(name string, args ...string) error {
	return exec.Command(name, args...).Run()
}

// execIn runs argv with env and returns its output.
func execIn(env []string, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}
