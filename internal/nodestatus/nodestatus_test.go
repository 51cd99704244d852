package nodestatus

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

const (
	condType = "nodelocaldns.io/DNSReady"
	label    = "addon.gke.io/node-local-dns-ds-ready"
)

// cluster is a real kube-apiserver run as clusters run it for kubelets
// (Node,RBAC and NodeRestriction), two nodes (n1 tainted, as a Node
// Readiness Controller rule leaves a new node) and the DaemonSet's
// ServiceAccount with a pod on n1.
func cluster(t *testing.T) *apiserver.Server {
	t.Helper()
	s := apiserver.Start(t, apiserver.NodeAuthorization())
	for _, n := range []string{"n1", "n2"} {
		node := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": n}}
		if n == "n1" {
			node["spec"] = map[string]any{"taints": []any{map[string]any{"key": "readiness.k8s.io/nodelocaldns-dns-ready", "value": "pending", "effect": "NoSchedule"}}}
		}
		s.MustDo(http.MethodPost, "/api/v1/nodes", node, nil)
	}
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount")
	s.MustDo(http.MethodPost, "/api/v1/namespaces/kube-system/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "nodelocaldns-n1"},
		"spec": map[string]any{"nodeName": "n1", "serviceAccountName": "nodelocaldns",
			"containers": []any{map[string]any{"name": "c", "image": "nodelocaldns"}}},
	}, nil)
	return s
}

func reporter(t *testing.T, s *apiserver.Server, token, node string, asNode bool) (*Reporter, context.CancelFunc) {
	t.Helper()
	r, err := New(Config{Rest: s.Config(token), Node: node, Condition: condType, Label: label, AsNode: asNode,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, cancel
}

type nodeObj struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Taints []corev1.Taint `json:"taints"`
	} `json:"spec"`
	Status struct {
		Conditions []corev1.NodeCondition `json:"conditions"`
	} `json:"status"`
}

func getNode(t *testing.T, s *apiserver.Server, name string) nodeObj {
	t.Helper()
	var n nodeObj
	s.MustDo(http.MethodGet, "/api/v1/nodes/"+name, nil, &n)
	return n
}

func condition(n nodeObj) *corev1.NodeCondition {
	for i, c := range n.Status.Conditions {
		if c.Type == condType {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func flush(t *testing.T, r *Reporter) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Flush(ctx)
}

// TestNarrowGrantWritesItsOwnNodeOnly: with deploy/node-readiness/rbac.yaml
// the pod's token, as its own node, sets and clears the condition and the
// label on that node, keeping the Node's other conditions; as another
// node, or lifting its own taint, it is refused. Without the grant the
// write is refused, counted and retried, and succeeds once the grant is
// applied.
func TestNarrowGrantWritesItsOwnNodeOnly(t *testing.T) {
	s := cluster(t)
	// A condition of the kubelet's, which our patch must keep.
	s.MustDo(http.MethodPatch, "/api/v1/nodes/n1/status", []byte(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}]}}`), nil)
	token := s.PodToken("kube-system", "nodelocaldns", "nodelocaldns-n1")

	r, _ := reporter(t, s, token, "n1", true)
	r.Set(State{Ready: true, Reason: "Serving", Message: "answering"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := r.Flush(ctx)
	cancel()
	if err == nil || !apierrors.IsForbidden(errors.Unwrap(err)) {
		t.Fatalf("without the grant: %v, want forbidden", err)
	}

	s.ApplyManifest(t, "../../deploy/node-readiness/rbac.yaml", "ClusterRole", "ClusterRoleBinding")
	if err := flush(t, r); err != nil {
		t.Fatalf("with the grant: %v", err)
	}
	n := getNode(t, s, "n1")
	c := condition(n)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != "Serving" || n.Metadata.Labels[label] != "true" {
		t.Fatalf("n1 after Ready: condition %+v, labels %v", c, n.Metadata.Labels)
	}
	if len(n.Status.Conditions) != 2 {
		t.Fatalf("the kubelet's condition was not kept: %+v", n.Status.Conditions)
	}
	first := c.LastTransitionTime
	time.Sleep(1100 * time.Millisecond) // times are in seconds
	r.Set(State{Ready: true, Reason: "Serving", Message: "answering again"})
	r.Set(State{Ready: false, Reason: "Stopping", Message: "SIGTERM"})
	if err := flush(t, r); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, s, "n1")
	if c := condition(n); c == nil || c.Status != corev1.ConditionFalse || c.Reason != "Stopping" || !c.LastTransitionTime.After(first.Time) {
		t.Fatalf("n1 after NotReady: %+v (first transition %v)", c, first)
	}
	if _, ok := n.Metadata.Labels[label]; ok {
		t.Fatalf("label kept when not ready: %v", n.Metadata.Labels)
	}

	// As n2, or lifting its own taint: refused.
	other, _ := reporter(t, s, token, "n2", true)
	other.Set(State{Ready: true, Reason: "Serving"})
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	err = other.Flush(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("as another node: %v, want forbidden", err)
	}
	if condition(getNode(t, s, "n2")) != nil {
		t.Fatal("n2 got our condition")
	}
	lift := r.patch(context.Background(), "", types.MergePatchType, map[string]any{"spec": map[string]any{"taints": nil}})
	if !apierrors.IsForbidden(lift) || !strings.Contains(lift.Error(), "not allowed to modify taints") {
		t.Fatalf("lifting its own taint: %v, want forbidden", lift)
	}
	if taints := getNode(t, s, "n1").Spec.Taints; !slices.ContainsFunc(taints, func(x corev1.Taint) bool { return x.Key == "readiness.k8s.io/nodelocaldns-dns-ready" }) {
		t.Fatalf("n1's taint went: %v", taints)
	}
	if got := testutilCounter(t, r, "forbidden"); got < 1 {
		t.Fatalf("forbidden writes counted %v", got)
	}
}

// TestAnyNodeGrantAsServiceAccount: -node-status-as=serviceaccount with
// deploy/node-readiness/rbac-any-node.yaml writes as the account itself,
// which then may write any node: what that file says it allows.
func TestAnyNodeGrantAsServiceAccount(t *testing.T) {
	s := cluster(t)
	s.ApplyManifest(t, "../../deploy/node-readiness/rbac-any-node.yaml", "ClusterRole", "ClusterRoleBinding")
	token := s.PodToken("kube-system", "nodelocaldns", "nodelocaldns-n1")
	for _, node := range []string{"n1", "n2"} {
		r, _ := reporter(t, s, token, node, false)
		r.Set(State{Ready: true, Reason: "Serving"})
		if err := flush(t, r); err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		if c := condition(getNode(t, s, node)); c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("%s: %+v", node, c)
		}
	}
	// The narrow grant's impersonation is not part of this one.
	r, _ := reporter(t, s, token, "n1", true)
	r.Set(State{Ready: false, Reason: "Stopping"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := r.Flush(ctx); err == nil {
		t.Fatal("impersonation allowed by the any-node grant")
	}
}

func testutilCounter(t *testing.T, r *Reporter, result string) float64 {
	t.Helper()
	return testutil.ToFloat64(r.writes.WithLabelValues(result))
}
