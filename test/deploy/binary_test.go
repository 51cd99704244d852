package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// need skips a test when a tool is missing, except in CI, where .ci/run
// installs every tool and a missing one is a failure.
func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (CI installs it: see .ci/run)", tool)
		}
		t.Skipf("%s not installed", tool)
	}
	return p
}

// built is the daemon binary, built once for the package's tests into
// builtDir (removed by TestMain).
var (
	builtOnce sync.Once
	builtDir  string
	built     string
	builtErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// daemonBinary builds cmd/nodelocaldns once and returns its path.
func daemonBinary() (string, error) {
	builtOnce.Do(func() {
		builtDir, builtErr = os.MkdirTemp("", "nld-bin")
		if builtErr != nil {
			return
		}
		built = filepath.Join(builtDir, "nodelocaldns")
		if out, err := exec.Command("go", "build", "-o", built, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
			builtErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	return built, builtErr
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin, err := daemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// runBinary runs the daemon binary with args (and this process's
// environment) and returns its exit code and output.
func runBinary(args []string, stdout, stderr io.Writer) (int, error) {
	bin, err := daemonBinary()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, err
}

// serveZone starts a DNS server on addr (UDP and TCP) answering every A
// question with 192.0.2.1 and a TXT naming who answered.
func serveZone(t *testing.T, addr, who string) {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch q.Qtype {
		case dns.TypeA:
			rr, _ := dns.NewRR(q.Name + " 60 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		case dns.TypeTXT:
			rr, _ := dns.NewRR(q.Name + ` 60 IN TXT "` + who + `"`)
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	for _, network := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: addr, Net: network, Handler: h}
		started := make(chan error, 1)
		srv.NotifyStartedFunc = func() { started <- nil }
		go func() { started <- srv.ListenAndServe() }()
		if err := <-started; err != nil {
			t.Skipf("cannot listen on %s (%v): needs root for port 53", addr, err)
		}
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
}

func TestEndToEndWithDig(t *testing.T) {
	endToEndWithDig(t, []string{buildBinary(t)})
}

// endToEndWithDig runs the daemon (the command line daemon, its flags
// appended) between a node resolver and a kube-dns on loopback, and asks it
// with dig: misses to each upstream over UDP and TCP, a hit from the cache,
// the counters that say so.
func endToEndWithDig(t *testing.T, daemon []string) {
	dig := need(t, "dig")
	nodeIP := testhost.Loopback()
	serveZone(t, nodeIP+":53", "node")
	kubeAddr := fmt.Sprintf("%s:%d", testhost.Loopback(), 0)
	kubeIP := strings.Split(kubeAddr, ":")[0]
	kubePort := testhost.FreePort(t, kubeIP)
	serveZone(t, fmt.Sprintf("%s:%d", kubeIP, kubePort), "kube-dns")

	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+nodeIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ip := testhost.Loopback()
	port := testhost.FreePort(t, ip)
	metrics := fmt.Sprintf("%s:%d", ip, testhost.FreePort(t, ip))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(daemon[1:len(daemon):len(daemon)], "-localip", ip, "-port", fmt.Sprint(port),
		"-kube-dns", fmt.Sprintf("%s:%d", kubeIP, kubePort), "-resolv-conf", rc,
		"-setupinterface=false", "-setupiptables=false", "-metrics-listen-address", metrics, "-state-dir", stateDir(t), "-lameduck", "200ms")
	cmd := exec.CommandContext(ctx, daemon[0], args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("exit after SIGINT: %v\n%s", err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Errorf("no exit within 10s of SIGINT")
		}
	}()
	waitReady(t, "http://"+metrics+"/ready", exited, &stderr)

	digOut := func(args ...string) string {
		t.Helper()
		all := append([]string{"@" + ip, "-p", fmt.Sprint(port), "+time=2", "+tries=1"}, args...)
		out, err := exec.Command(dig, all...).CombinedOutput()
		if err != nil {
			t.Fatalf("dig %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := digOut("+short", "example.com"); got != "192.0.2.1" {
		t.Fatalf("dig example.com: %q", got)
	}
	if got := digOut("+short", "+tcp", "example.com"); got != "192.0.2.1" {
		t.Fatalf("dig +tcp example.com: %q", got)
	}
	if got := digOut("+short", "TXT", "example.com"); got != `"node"` {
		t.Fatalf("external name answered by %s", got)
	}
	if got := digOut("+short", "TXT", "web.default.svc.cluster.local"); got != `"kube-dns"` {
		t.Fatalf("cluster name answered by %s", got)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`nodelocaldns_cache_hits_total{type="success"} 1`, `nodelocaldns_requests_total{proto="tcp"} 1`, `nodelocaldns_responses_total{rcode="NOERROR"} 5`} {
		if !strings.Contains(body.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func waitReady(t *testing.T, url string, exited chan error, stderr *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("daemon exited: %v\n%s", err, stderr.String())
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 10s\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
