package daemon

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// kubeDNSPodSlice is kube-dns-upstream's EndpointSlice with these pods (ip → ready).
func kubeDNSPodSlice(rv string, ready map[string]bool) map[string]any {
	var eps []any
	for ip, r := range ready {
		eps = append(eps, map[string]any{"addresses": []string{ip},
			"conditions": map[string]any{"ready": r, "serving": true, "terminating": !r}})
	}
	meta := map[string]any{"name": "kube-dns-upstream-abcde", "namespace": "kube-system",
		"labels": map[string]any{"kubernetes.io/service-name": "kube-dns-upstream"}}
	if rv != "" {
		meta["resourceVersion"] = rv
	}
	return map[string]any{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta,
		"addressType": "IPv4", "endpoints": eps,
		"ports": []any{map[string]any{"name": "dns", "port": 53, "protocol": "UDP"},
			map[string]any{"name": "dns-tcp", "port": 53, "protocol": "TCP"}}}
}

// TestKubeDNSPodsAskedDirectly: the daemon follows kube-dns-upstream's EndpointSlices through
// a real kube-apiserver and asks the ready kube-dns pods (real DNS servers on loopback
// addresses) directly: each pod's share of the cluster-domain misses is within 10 points of
// even, the ClusterIP gets none; a pod turned not ready under load gets no new query and no
// lookup fails; with the API server gone the last known pods keep answering.
//
// The API server refuses loopback addresses in a slice, so the test re-runs itself in a
// network namespace of its own (unshare -n, as root) where 10.85.0.0/24 is on lo.
func TestKubeDNSPodsAskedDirectly(t *testing.T) {
	const marker = "NLD_KUBEDNS_PODS_NETNS"
	if os.Getenv(marker) == "" {
		if os.Geteuid() != 0 {
			apiserver.Skip(t, "not root: the kube-dns pods' addresses need a network namespace")
		}
		if _, err := exec.LookPath("unshare"); err != nil {
			apiserver.Skip(t, "no unshare")
		}
		cmd := exec.Command("unshare", "--net", "--", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
			os.Args[0], "-test.run=^TestKubeDNSPodsAskedDirectly$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), marker+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("in a network namespace of its own:\n%s", out)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if strings.Contains(string(out), "--- SKIP") {
			t.Skip("skipped inside the namespace")
		}
		return
	}
	s := apiserver.Start(t)
	pods := []string{"10.85.0.1", "10.85.0.2", "10.85.0.3"}
	for _, ip := range append(append([]string(nil), pods...), "10.85.0.10") {
		if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s: %v %s", ip, err, out)
		}
	}
	var counts [4]atomic.Int64
	for i, ip := range append(append([]string(nil), pods...), "10.85.0.10") {
		h := answerA("10.96.0." + fmt.Sprint(i+1))
		startUpstreamAt(t, ip+":53", func(r *dns.Msg) *dns.Msg { counts[i].Add(1); return h(r) })
	}
	const path = "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"
	s.MustDo(http.MethodPost, path, kubeDNSPodSlice("", map[string]bool{pods[0]: true, pods[1]: true, pods[2]: true}), nil)

	up := startUpstream(t, records)
	cfg := testConfig(up.addr)
	cfg.LocalMode = false
	cfg.KubeDNS = netip.MustParseAddrPort("10.85.0.10:53")
	cfg.KubeDNSSource, cfg.KubeDNSService = "$KUBE_DNS_UPSTREAM_SERVICE_HOST", "kube-dns-upstream"
	cfg.Autopath.NodeName = "node1"
	d, logs, stop := startDaemonOpt(t, cfg, Options{KubeConfig: s.Config(s.AdminToken), KubeNamespace: "kube-system"})
	metricsURL := "http://" + d.MetricsAddr().String() + "/metrics"
	waitMetric := func(what, line string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, body := httpStatus(t, metricsURL)
			if strings.Contains(body, line) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no %q in\n%s\n%s", what, line, grepLines(body, "kubedns"), logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitMetric("three pods in use", `nodelocaldns_kubedns_endpoints{state="in_use"} 3`)
	deadline := time.Now().Add(10 * time.Second)
	for len(d.run.KubeGroup().Endpoints()) != 3 { // handed to the group once the first list is in
		if time.Now().After(deadline) {
			t.Fatalf("the kube-dns group has endpoints %v", d.run.KubeGroup().Endpoints())
		}
		time.Sleep(5 * time.Millisecond)
	}

	var seq atomic.Int64
	ask := func() error {
		name := fmt.Sprintf("n%d.default.svc.cluster.local.", seq.Add(1))
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		c := &dns.Client{Timeout: 3 * time.Second}
		r, _, err := c.Exchange(m, d.Server.Addr().String())
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			return fmt.Errorf("%s: rcode %s, %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		return nil
	}
	// load sends from 8 clients until stop is closed (or n queries, n > 0); it returns the
	// queries sent and the failures.
	load := func(n int64, stop chan struct{}) (sent, failed int64, errs []error) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var cnt atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if n > 0 && cnt.Add(1) > n {
						return
					}
					err := ask()
					mu.Lock()
					sent++
					if err != nil {
						failed++
						if len(errs) < 5 {
							errs = append(errs, err)
						}
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return sent, failed, errs
	}

	// The spread.
	const n = 3000
	if sent, failed, errs := load(n, nil); failed > 0 {
		t.Fatalf("%d of %d lookups failed: %v", failed, sent, errs)
	}
	var total int64
	for i := range 3 {
		total += counts[i].Load()
	}
	for i := range 3 {
		share := float64(counts[i].Load()) / float64(total)
		t.Logf("kube-dns pod %s: %d of %d queries (%.1f%%)", pods[i], counts[i].Load(), total, 100*share)
		if share < 1.0/3-0.10 || share > 1.0/3+0.10 {
			t.Errorf("pod %s has %.1f%% of the queries, want within 10 points of 33.3%%", pods[i], 100*share)
		}
	}
	if c := counts[3].Load(); c != 0 {
		t.Errorf("the ClusterIP got %d queries while every pod answered", c)
	}

	// A pod turns not ready (terminating) under load: out at once, nothing fails.
	stopLoad := make(chan struct{})
	type result struct {
		sent, failed int64
		errs         []error
	}
	res := make(chan result, 1)
	go func() { s, f, e := load(0, stopLoad); res <- result{s, f, e} }()
	time.Sleep(300 * time.Millisecond)
	var cur struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	s.MustDo(http.MethodGet, path+"/kube-dns-upstream-abcde", nil, &cur)
	s.MustDo(http.MethodPut, path+"/kube-dns-upstream-abcde",
		kubeDNSPodSlice(cur.Metadata.ResourceVersion, map[string]bool{pods[0]: false, pods[1]: true, pods[2]: true}), nil)
	waitMetric("the not-ready pod out", `nodelocaldns_kubedns_endpoints{state="not_ready"} 1`)
	time.Sleep(200 * time.Millisecond) // its last queries answered
	out := counts[0].Load()
	time.Sleep(500 * time.Millisecond)
	close(stopLoad)
	r := <-res
	if r.failed > 0 {
		t.Errorf("%d of %d lookups failed while a pod was taken out: %v", r.failed, r.sent, r.errs)
	}
	if late := counts[0].Load() - out; late != 0 {
		t.Errorf("the not-ready pod got %d queries after it was taken out", late)
	}
	t.Logf("pod taken out under load: %d lookups, %d failed", r.sent, r.failed)
	_, body := httpStatus(t, metricsURL)
	if strings.Contains(body, `upstream="`+pods[0]+`:53"`) {
		t.Errorf("the removed pod's upstream series remain:\n%s", grepLines(body, pods[0]))
	}

	// The API server goes away: the last known pods answer on.
	s.Stop()
	before := counts[1].Load() + counts[2].Load()
	if sent, failed, errs := load(300, nil); failed > 0 {
		t.Errorf("%d of %d lookups failed with the API server down: %v", failed, sent, errs)
	}
	if got := counts[1].Load() + counts[2].Load() - before; got < 300 {
		t.Errorf("the pods answered %d of 300 lookups with the API server down", got)
	}
	if err := stop(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestKubeEndpointsFollowTheGroup: the endpoints go to a kube-dns group that replaces the
// first for the same ClusterIP (a Corefile edit), never to one for another address.
func TestKubeEndpointsFollowTheGroup(t *testing.T) {
	at := netip.MustParseAddrPort("10.96.0.11:53")
	group := func(addr netip.AddrPort) *forward.Group {
		g, err := forward.NewGroup(forward.GroupConfig{Name: "kube-dns", Servers: []netip.AddrPort{addr}, Proto: forward.TCP}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}
	g1, g2, other := group(at), group(at), group(netip.MustParseAddrPort("10.96.0.99:53"))
	eps := []netip.AddrPort{netip.MustParseAddrPort("10.244.0.2:53"), netip.MustParseAddrPort("10.244.0.3:53")}
	k := &kubeEndpoints{at: at, group: g1}
	k.set(eps)
	if got := g1.Endpoints(); len(got) != 2 {
		t.Fatalf("first group: %v", got)
	}
	k.setGroup(g2, at)
	if got := g2.Endpoints(); len(got) != 2 {
		t.Errorf("replacing group for the same address: %v", got)
	}
	k.setGroup(other, netip.MustParseAddrPort("10.96.0.99:53"))
	k.set(eps[:1])
	if got := other.Endpoints(); len(got) != 0 {
		t.Errorf("a group for another address got endpoints %v", got)
	}
	var nilK *kubeEndpoints
	nilK.setGroup(g1, at) // no watch: nothing to do
}
