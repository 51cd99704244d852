package autopath_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// upstream serves the zone over UDP and TCP: kube-dns and the node's
// resolver at once.
type upstream struct {
	z       zone
	queries atomic.Int64
}

func (u *upstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	u.queries.Add(1)
	q := r.Question[0]
	res := u.z.lookup(q.Name, q.Qtype)
	m := new(dns.Msg)
	m.SetRcode(r, res.Rcode)
	m.Answer, m.Ns = res.Answer, res.Ns
	m.RecursionAvailable = true
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(1232, false)
	}
	_ = w.WriteMsg(m)
}

func startUpstream(t *testing.T, addr string) *upstream {
	t.Helper()
	u := &upstream{z: newZone()}
	startUpstreamHandler(t, addr, u)
	return u
}

func startUpstreamHandler(t *testing.T, addr string, u dns.Handler) {
	t.Helper()
	for _, network := range []string{"udp", "tcp"} {
		s := &dns.Server{Addr: addr, Net: network, Handler: u}
		var started sync.WaitGroup
		started.Add(1)
		s.NotifyStartedFunc = started.Done
		errc := make(chan error, 1)
		go func() { errc <- s.ListenAndServe() }()
		done := make(chan struct{})
		go func() { started.Wait(); close(done) }()
		select {
		case <-done:
		case err := <-errc:
			t.Fatalf("upstream %s %s: %v", network, addr, err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
	}
}

// daemon is the nodelocaldns binary serving the pod's nameserver address.
type daemon struct {
	t       *testing.T
	pid     int
	metrics string
	stderr  *testhost.SyncBuffer
	cancel  func()
	done    chan error
}

// startDaemon runs bin with args. With creds, it runs in a mount namespace
// of its own where the service account's token and CA are where a pod has
// them (/var/run/secrets/kubernetes.io/serviceaccount): the binary uses its
// in-cluster credentials as in a real pod.
func startDaemon(t *testing.T, bin string, creds map[string]string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, metrics: "127.0.0.1:" + strconv.Itoa(testhost.FreePort(t, "127.0.0.1")), stderr: &testhost.SyncBuffer{}, done: make(chan error, 1)}
	args = append([]string{"-metrics-listen-address", d.metrics, "-health-port", "0", "-state-dir", "",
		"-lameduck", "0s", "-setupinterface=false", "-setupiptables=false"}, args...)
	ctx, cancel := context.WithCancel(context.Background())
	var cmd *exec.Cmd
	if creds == nil {
		cmd = exec.CommandContext(ctx, bin, args...)
	} else {
		// tmpfs over /run/secrets, private to the daemon's mount namespace.
		if err := os.MkdirAll("/run/secrets", 0o755); err != nil {
			t.Fatal(err)
		}
		const sa = "/run/secrets/kubernetes.io/serviceaccount"
		script := `mount -t tmpfs tmpfs /run/secrets && mkdir -p ` + sa + ` && cp "$0" ` + sa + `/token && cp "$1" ` + sa + `/ca.crt && shift && exec "$@"`
		cmd = exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", script,
			creds["token"], creds["ca"], bin}, args...)...)
		cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST="+creds["host"], "KUBERNETES_SERVICE_PORT="+creds["port"])
	}
	cmd.Stderr = d.stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 20 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.pid = cmd.Process.Pid // unshare and sh exec the daemon: the same process
	go func() { d.done <- cmd.Wait() }()
	d.cancel = func() {
		cancel()
		<-d.done
	}
	t.Cleanup(d.stop)
	d.waitFor(`^nodelocaldns_requests_total`, "ready")
	return d
}

var stopOnce sync.Map

func (d *daemon) stop() {
	if _, done := stopOnce.LoadOrStore(d, true); !done {
		d.cancel()
	}
}

// scrape returns the metrics page.
func (d *daemon) scrape() string {
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitFor polls the metrics until a line matches re (30 s).
func (d *daemon) waitFor(re, what string) {
	d.t.Helper()
	rx := regexp.MustCompile("(?m)" + re)
	deadline := time.Now().Add(60 * time.Second)
	for !rx.MatchString(d.scrape()) {
		select {
		case err := <-d.done:
			d.t.Fatalf("daemon exited (%v) waiting for %s\n%s", err, what, d.stderr)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("not %s in 60 s\n%s", what, d.stderr)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

var requestsRE = regexp.MustCompile(`(?m)^nodelocaldns_requests_total\{proto="(?:udp|tcp)"\} (\d+)`)

// requests is the daemon's request metric, UDP and TCP: what clients sent.
func (d *daemon) requests() int64 {
	var n int64
	for _, m := range requestsRE.FindAllStringSubmatch(d.scrape(), -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

// The same table of real stub resolvers, in a network namespace standing
// for a pod known to a real kube-apiserver, against the nodelocaldns
// binary without and with -autopath: every lookup ends the same way, and
// each sends no more queries (the daemon's request metric), api.example.com
// 2 instead of 10. Then the API server stops: DNS keeps answering, autopath
// turns off (metric, log line); it restarts: autopath is on again.
// apiWithPod starts a real kube-apiserver that knows one pod, name in
// namespace shop on node1 (dnsPolicy ClusterFirst), at address ip.
func apiWithPod(t *testing.T, name, ip string) *apiserver.Server {
	t.Helper()
	api := apiserver.Start(t)
	api.CreateNamespace("shop")
	api.MustDo(http.MethodPost, "/api/v1/namespaces/shop/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"nodeName": "node1", "dnsPolicy": "ClusterFirst",
			"containers": []any{map[string]any{"name": "c", "image": "x.invalid/y"}}},
	}, nil)
	api.SetPodIP("shop", name, ip)
	return api
}

func TestStubResolversAgainstTheDaemon(t *testing.T) {
	clients := buildClients(t)
	need(t, "needs unshare (util-linux)", lookPath("unshare"))
	p, _ := setupPod(t)
	api := apiWithPod(t, "web", p.ip.String())

	dir := t.TempDir()
	bin := filepath.Join(dir, "nodelocaldns")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// The upstream: a loopback address of its own on port 53, as the node's
	// resolver (resolv.conf) and as kube-dns.
	upIP := testhost.Loopback()
	up := startUpstream(t, upIP+":53")
	nodeResolv := filepath.Join(dir, "node.resolv.conf")
	if err := os.WriteFile(nodeResolv, []byte("nameserver "+upIP+"\nsearch corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"-localip", p.hostIP.String(), "-kube-dns", upIP, "-resolv-conf", nodeResolv, "-kubednscm", ""}
	creds := credentials(t, api, dir)

	type result struct {
		out string
		n   int64
	}
	runTable := func(d *daemon) map[string]result {
		res := map[string]result{}
		for _, client := range []string{"glibc", "musl", "go"} {
			for _, name := range names {
				for _, family := range []string{"unspec", "inet", "inet6"} {
					before := d.requests()
					out := lookup(t, p, clients, client, name, family)
					res[client+" "+name+" "+family] = result{out, d.requests() - before}
				}
			}
		}
		return res
	}

	off := startDaemon(t, bin, nil, common...)
	without := runTable(off)
	off.stop()

	on := startDaemon(t, bin, creds, append(common, "-autopath", "-node-name", "node1")...)
	on.waitFor(`^nodelocaldns_autopath_pod_watch_synced 1`, "synced")
	on.waitFor(`^nodelocaldns_autopath_pods 1`, "knowing the pod")
	with := runTable(on)

	var totalOff, totalOn int64
	for what, w := range with {
		wo := without[what]
		totalOff, totalOn = totalOff+wo.n, totalOn+w.n
		switch {
		case wo.out == w.out:
		case strings.HasPrefix(wo.out, "error") && strings.HasPrefix(w.out, "error"):
			// docs/autopath.md: glibc AF_INET6 for an A-only name, EAI_NODATA
			// without, EAI_NONAME with. Both: no address.
			t.Logf("%s: %q without autopath, %q with", what, wo.out, w.out)
		default:
			t.Errorf("%s: %q without autopath, %q with", what, wo.out, w.out)
		}
		if w.n > wo.n {
			t.Errorf("%s: %d queries with autopath, %d without", what, w.n, wo.n)
		}
	}
	for _, client := range []string{"glibc", "musl", "go"} {
		what := client + " api.example.com unspec"
		if without[what].n != 10 || with[what].n != 2 {
			t.Errorf("%s: %d queries without autopath, %d with; want 10 and 2", what, without[what].n, with[what].n)
		}
	}
	t.Logf("client queries for %d lookups: %d without autopath, %d with (upstream queries in all: %d)",
		len(with), totalOff, totalOn, up.queries.Load())
	if totalOn >= totalOff {
		t.Errorf("autopath saved nothing: %d vs %d queries", totalOn, totalOff)
	}
	page := on.scrape()
	for _, m := range []string{"nodelocaldns_autopath_answers_total", "nodelocaldns_autopath_client_queries_saved_total",
		"nodelocaldns_autopath_candidates_resolved_total"} {
		if !regexp.MustCompile(`(?m)^` + m + ` [1-9]`).MatchString(page) {
			t.Errorf("%s not counted", m)
		}
	}

	// The API server goes away: DNS answers on, without autopath.
	want := with["glibc api.example.com unspec"].out
	api.Stop()
	on.waitFor(`^nodelocaldns_autopath_pod_watch_synced 0`, "lost")
	for i := 0; i < 3; i++ {
		before := on.requests()
		if got := lookup(t, p, clients, "glibc", "api.example.com", "unspec"); got != want {
			t.Errorf("API server down: %q, want %q", got, want)
		}
		if n := on.requests() - before; n != 10 {
			t.Errorf("API server down: %d queries, want 10 (autopath off)", n)
		}
	}
	if !strings.Contains(on.stderr.String(), "pod watch lost") {
		t.Errorf("no log line for the lost watch:\n%s", on.stderr)
	}
	// Back: autopath on again.
	api.Restart()
	on.waitFor(`^nodelocaldns_autopath_pod_watch_synced 1`, "synced again")
	before := on.requests()
	if got := lookup(t, p, clients, "glibc", "api.example.com", "unspec"); got != want || on.requests()-before != 2 {
		t.Errorf("API server back: %q in %d queries, want %q in 2", got, on.requests()-before, want)
	}
	if !strings.Contains(on.stderr.String(), "pod watch recovered") {
		t.Errorf("no log line for the recovered watch:\n%s", on.stderr)
	}
}

// credentials are what startDaemon puts where a pod has its service
// account: the API server's address, a token and its CA.
func credentials(t *testing.T, api *apiserver.Server, dir string) map[string]string {
	t.Helper()
	u, _ := netip.ParseAddrPort(strings.TrimPrefix(api.URL, "https://"))
	creds := map[string]string{"token": filepath.Join(dir, "token"), "ca": filepath.Join(api.Dir, "certs", "apiserver.crt"),
		"host": u.Addr().String(), "port": strconv.Itoa(int(u.Port()))}
	if err := os.WriteFile(creds["token"], []byte(api.AdminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	return creds
}

// lookup runs one client in the pod's network namespace.
func lookup(t *testing.T, p *pod, clients map[string]string, client, name, family string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", p.ns, clients[client], name, family).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s %s: %v\n%s", client, name, family, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if client == "go" {
		// Go orders by RFC 6724 with the answers' arrival as the tie
		// breaker: A and AAAA race, the order is not part of the result.
		slices.Sort(lines)
	}
	return strings.Join(lines, "\n")
}
