package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// -autopath with the API server: the pod watch runs in the daemon, its
// metrics are served, and DNS answers whatever the API server does.
func TestAutopathPodWatchInTheDaemon(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("shop")
	up := startUpstream(t, records)
	cfg := testConfig(up.addr)
	cfg.Autopath.Enabled = true
	cfg.Autopath.NodeName = "node1"
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("search corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Autopath.NodeResolvConf = rc
	logs := &logBuffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{KubeConfig: s.Config(s.AdminToken)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("start: %v\n%s", err, logs)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = d.shutdown(ctx, 0)
		})
	}
	t.Cleanup(stop)

	s.MustDo(http.MethodPost, "/api/v1/namespaces/shop/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "web"},
		"spec": map[string]any{"nodeName": "node1", "containers": []any{map[string]any{"name": "c", "image": "x.invalid/y"}}},
	}, nil)
	s.SetPodIP("shop", "web", "10.244.1.7")
	url := "http://" + d.MetricsAddr().String() + "/metrics"
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := httpStatus(t, url)
		if strings.Contains(body, "nodelocaldns_autopath_pod_watch_synced 1") && strings.Contains(body, "nodelocaldns_autopath_pods 1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod watch metrics never showed the pod:\n%s\n%s", grepLines(body, "autopath"), logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p, _ := d.PodWatch.Lookup(netip.MustParseAddr("10.244.1.7")); p == nil || p.Search[3] != "corp.example" {
		t.Errorf("pod view: %+v", p)
	}

	// The API server goes away: DNS answers on.
	s.Stop()
	c := &dns.Client{Timeout: 2 * time.Second}
	for i := 0; i < 5; i++ {
		m := new(dns.Msg)
		m.SetQuestion("example.org.", dns.TypeA)
		r, _, err := c.Exchange(m, d.Server.Addr().String())
		if err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("query %d with the API server down: %v %v", i, r, err)
		}
	}
	stop()
}

// Without credentials (-autopath outside a pod, token not mounted) the
// daemon serves and says once that autopath is off.
func TestAutopathWithoutCredentialsServesOn(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	up := startUpstream(t, records)
	cfg := testConfig(up.addr)
	cfg.Autopath.Enabled = true
	cfg.Autopath.NodeName = "node1"
	cfg.Autopath.NodeResolvConf = "/nonexistent"
	d, logs, _ := startDaemon(t, cfg, "")
	if !strings.Contains(logs.String(), "autopath off") || d.PodWatch != nil {
		t.Errorf("logs:\n%s", logs)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
