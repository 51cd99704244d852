package cluster

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// TestQuestions asks a real API server, with the rights deploy/daemonset.yaml
// gives the pod: a DaemonSet's pod sees it staying, then leaving once the
// DaemonSet is deleted; a name no DaemonSet generates is unknown; the rights
// revoked are told apart; kube-dns' ClusterIP among our addresses is found.
func TestQuestions(t *testing.T) {
	s := apiserver.Start(t)
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount", "Role", "RoleBinding")
	spec := map[string]any{"containers": []map[string]any{{"name": "c", "image": "i"}}}
	s.MustDo(http.MethodPost, "/apis/apps/v1/namespaces/kube-system/daemonsets", map[string]any{
		"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "nodelocaldns"},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]string{"a": "b"}},
			"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{"a": "b"}}, "spec": spec}},
	}, nil)
	s.MustDo(http.MethodPost, "/api/v1/namespaces/kube-system/services", map[string]any{
		"apiVersion": "v1", "kind": "Service", "metadata": map[string]any{"name": "kube-dns"},
		"spec": map[string]any{"clusterIP": "10.96.0.10", "ports": []map[string]any{{"port": 53}}}}, nil)
	c, err := New(s.Config(s.ServiceAccountToken("kube-system", "nodelocaldns")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ask := func(pod string, want Owner) error {
		t.Helper()
		got, err := c.DaemonSet(ctx, "kube-system", pod)
		if got != want {
			t.Errorf("pod %q: %v (%v), want %v", pod, got, err, want)
		}
		return err
	}
	_ = ask("nodelocaldns-x7k2q", Staying)
	_ = ask("nodelocaldns", Unknown)
	_ = ask("nodelocaldns-X7K2Q", Unknown)
	_ = ask("", Unknown)
	// Another DaemonSet's name: the Role names ours only.
	if err := ask("other-x7k2q", Unknown); !Revoked(err) {
		t.Errorf("another DaemonSet: %v, want forbidden", err)
	}
	ips, err := c.ServiceIPs(ctx, "kube-system", "kube-dns", []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10")})
	if err != nil || !slices.Equal(ips, []netip.Addr{netip.MustParseAddr("10.96.0.10")}) {
		t.Errorf("ServiceIPs = %v, %v", ips, err)
	}
	s.MustDo(http.MethodDelete, "/apis/apps/v1/namespaces/kube-system/daemonsets/nodelocaldns", map[string]any{"propagationPolicy": "Orphan"}, nil)
	_ = ask("nodelocaldns-x7k2q", Leaving)
	s.MustDo(http.MethodDelete, "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/nodelocaldns", nil, nil)
	// The API server's authorizer learns of the deletion from its own watch
	// of RoleBindings, a few milliseconds later: until then the pod's rights
	// still stand (seen once in a CI run).
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.DaemonSet(ctx, "kube-system", "nodelocaldns-x7k2q")
		if got == Unknown && Revoked(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rights revoked 10 s ago: %v (%v), want %v and Revoked", got, err, Unknown)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
