package podwatch

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
)

// followWithin: the bound on how fast the view follows the API.
const followWithin = time.Second

func createPod(t *testing.T, s *apiserver.Server, ns, name, node string, spec map[string]any) {
	t.Helper()
	sp := map[string]any{
		"nodeName":   node,
		"containers": []any{map[string]any{"name": "c", "image": "example.invalid/app"}},
	}
	for k, v := range spec {
		sp[k] = v
	}
	s.MustDo(http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name}, "spec": sp,
	}, nil)
}

func deletePod(t *testing.T, s *apiserver.Server, ns, name string) {
	t.Helper()
	s.MustDo(http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/"+name+"?gracePeriodSeconds=0", nil, nil)
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWatchFollowsTheAPIServer(t *testing.T) {
	s := apiserver.Start(t)
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount")
	s.ApplyManifest(t, "../../deploy/autopath/rbac.yaml", "ClusterRole", "ClusterRoleBinding")
	for _, ns := range []string{"shop", "billing"} {
		s.CreateNamespace(ns)
	}
	token := s.ServiceAccountToken("kube-system", "nodelocaldns")

	// A pod on this node before the watch starts, one on another node.
	createPod(t, s, "shop", "early", "node1", nil)
	s.SetPodIP("shop", "early", "10.244.1.2")
	createPod(t, s, "shop", "elsewhere", "node2", nil)
	s.SetPodIP("shop", "elsewhere", "10.244.2.2")

	w, err := New(Config{
		Rest: s.Config(token), NodeName: "node1", ClusterDomain: "cluster.local.",
		Node:   NodeResolvConf{Search: []string{"corp.example"}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, 30*time.Second, "first sync", func() bool { return w.State() == kubewatch.Synced })
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	if p, _ := w.Lookup(ip("10.244.1.2")); p == nil || p.Name != "early" {
		t.Fatalf("pod listed at start: %+v", p)
	}
	if p, _ := w.Lookup(ip("10.244.2.2")); p != nil {
		t.Fatalf("a pod of another node is in the view: %+v", p)
	}
	if want := []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"}; !reflect.DeepEqual(w.view.Load().byIP[ip("10.244.1.2")].Search, want) {
		t.Errorf("search %q, want %q", w.view.Load().byIP[ip("10.244.1.2")].Search, want)
	}

	// Created, then given its IPs through the status subresource.
	createPod(t, s, "shop", "web", "node1", map[string]any{
		"dnsConfig": map[string]any{"options": []any{map[string]any{"name": "ndots", "value": "2"}}},
	})
	s.SetPodIP("shop", "web", "10.244.1.3", "fd00::3")
	eventually(t, followWithin, "new pod's addresses", func() bool {
		p4, _ := w.Lookup(ip("10.244.1.3"))
		p6, _ := w.Lookup(ip("fd00::3"))
		return p4 != nil && p6 == p4 && p4.Ndots == 2
	})

	// A host-network pod never enters the view (its address is the node's).
	createPod(t, s, "shop", "hostnet", "node1", map[string]any{"hostNetwork": true})
	s.SetPodIP("shop", "hostnet", "192.168.0.10")

	// Deleted, and its IP reused by a pod of another namespace.
	deletePod(t, s, "shop", "web")
	eventually(t, followWithin, "deleted pod gone", func() bool { p, _ := w.Lookup(ip("10.244.1.3")); return p == nil })
	createPod(t, s, "billing", "api", "node1", nil)
	s.SetPodIP("billing", "api", "10.244.1.3")
	eventually(t, followWithin, "reused IP belongs to the new pod", func() bool {
		p, _ := w.Lookup(ip("10.244.1.3"))
		return p != nil && p.Namespace == "billing" && p.Search[0] == "billing.svc.cluster.local" && p.Ineligible == ""
	})
	if p, _ := w.Lookup(ip("192.168.0.10")); p != nil {
		t.Errorf("host-network pod in the view: %+v", p)
	}
	if got := w.Pods(); got != 2 {
		t.Errorf("%d pods known, want 2 (early, api)", got)
	}

	// The API server goes away: lost; it comes back: synced, and a change
	// made while the watch was away arrives.
	s.Stop()
	eventually(t, 30*time.Second, "state lost", func() bool { return w.State() == kubewatch.Lost })
	if p, _ := w.Lookup(ip("10.244.1.2")); p == nil {
		t.Error("the view was dropped when the API server went away")
	}
	s.Restart()
	createPod(t, s, "shop", "late", "node1", nil)
	s.SetPodIP("shop", "late", "10.244.1.9")
	// The reflector backs off up to 30 s between tries, more under load.
	eventually(t, 60*time.Second, "synced again", func() bool { return w.State() == kubewatch.Synced })
	eventually(t, 30*time.Second, "pod made after the restart", func() bool {
		p, _ := w.Lookup(ip("10.244.1.9"))
		return p != nil
	})
	if !strings.Contains(metricsText(t, w), "nodelocaldns_autopath_pod_watch_losses_total 1") {
		t.Errorf("losses metric:\n%s", metricsText(t, w))
	}
}

func TestWatchNeedsItsRights(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("shop")
	s.MustDo(http.MethodPost, "/api/v1/namespaces/kube-system/serviceaccounts", map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "nodelocaldns"},
	}, nil)
	// No ClusterRoleBinding (deploy/daemonset.yaml alone): the list is
	// forbidden, the watch never syncs, and one line says what to apply.
	logs := &logSink{}
	w, err := New(Config{
		Rest: s.Config(s.ServiceAccountToken("kube-system", "nodelocaldns")), NodeName: "node1",
		ClusterDomain: "cluster.local", Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, 30*time.Second, "list refused", func() bool { return w.State() == kubewatch.Lost })
	if l := logs.String(); !strings.Contains(l, "pod watch forbidden") || !strings.Contains(l, "deploy/autopath/rbac.yaml") {
		t.Errorf("log:\n%s", l)
	}
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount")
	s.ApplyManifest(t, "../../deploy/autopath/rbac.yaml", "ClusterRole", "ClusterRoleBinding")
	// RBAC changes reach the authorizer within a second or so; the
	// reflector retries with backoff.
	eventually(t, 60*time.Second, "synced with deploy/autopath/rbac.yaml's ClusterRole", func() bool { return w.State() == kubewatch.Synced })
}

// logSink is a log destination safe for concurrent writes.
type logSink struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
