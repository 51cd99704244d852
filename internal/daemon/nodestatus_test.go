package daemon

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// nodeCondition reads condition typ of node n.
func nodeCondition(t *testing.T, s *apiserver.Server, n, typ string) *corev1.NodeCondition {
	t.Helper()
	var node struct {
		Status struct {
			Conditions []corev1.NodeCondition `json:"conditions"`
		} `json:"status"`
	}
	s.MustDo(http.MethodGet, "/api/v1/nodes/"+n, nil, &node)
	for i, c := range node.Status.Conditions {
		if string(c.Type) == typ {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// waitCondition waits until node n's condition typ has status and reason.
func waitCondition(t *testing.T, s *apiserver.Server, n, typ string, status corev1.ConditionStatus, reason string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // against a hang
	for {
		c := nodeCondition(t, s, n, typ)
		if c != nil && c.Status == status && c.Reason == reason {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s condition %s: %+v, want %s %s", n, typ, c, status, reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeConditionFollowsTheLifecycle runs the daemon against a real
// kube-apiserver with deploy/node-readiness/rbac.yaml, as its pod's token
// (bound to a pod on node n1): a condition left True by a killed instance
// is rewritten by this one ("Serving") once it answers; a wedged serving
// loop makes it False within a health check period, and True again; a
// twin's start and its elder's exit (a rollout) leave it True; the last
// exit without a twin leaves it False ("Stopping").
func TestNodeConditionFollowsTheLifecycle(t *testing.T) {
	s := apiserver.Start(t, apiserver.NodeAuthorization())
	s.MustDo(http.MethodPost, "/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n1"}}, nil)
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount")
	s.ApplyManifest(t, "../../deploy/node-readiness/rbac.yaml", "ClusterRole", "ClusterRoleBinding")
	s.MustDo(http.MethodPost, "/api/v1/namespaces/kube-system/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "nodelocaldns-n1"},
		"spec": map[string]any{"nodeName": "n1", "serviceAccountName": "nodelocaldns",
			"containers": []any{map[string]any{"name": "c", "image": "nodelocaldns"}}},
	}, nil)
	token := s.PodToken("kube-system", "nodelocaldns", "nodelocaldns-n1")
	const typ = "nodelocaldns.io/DNSReady"
	s.MustDo(http.MethodPatch, "/api/v1/nodes/n1/status", []byte(`{"status":{"conditions":[{"type":"`+typ+`","status":"True","reason":"LeftByAKilledInstance"}]}}`), nil)

	defer func(d time.Duration) { statusCheckEvery = d }(statusCheckEvery)
	statusCheckEvery = 200 * time.Millisecond
	up := startUpstream(t, records)
	mk, _, _, pidns := twins(t, up.addr)
	cfg := func() *config.Config {
		c := mk()
		c.Node.Condition, c.Node.StatusAs, c.Autopath.NodeName = typ, config.StatusAsNode, "n1"
		return c
	}
	opt := func(pid int) Options {
		return Options{KubeConfig: s.Config(token), InstanceIDForTest: fmt.Sprintf("%d-%d", pidns, pid)}
	}
	a, logsA, stopA := startDaemonOpt(t, cfg(), opt(5000011))
	waitCondition(t, s, "n1", typ, corev1.ConditionTrue, "Serving")
	if !strings.Contains(logsA.String(), "node status written") {
		t.Fatalf("A wrote nothing:\n%s", logsA)
	}

	// A wedged loop: the health check fails, the node is not ready.
	resume := a.Server.PauseUDP(1)
	waitCondition(t, s, "n1", typ, corev1.ConditionFalse, "Unhealthy")
	resume()
	waitCondition(t, s, "n1", typ, corev1.ConditionTrue, "Serving")

	// A rollout: B adopts A's sockets, A exits; the node stays ready.
	_, logsB, stopB := startDaemonOpt(t, cfg(), opt(5000012))
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logsA.String(), "node status left to the twin") {
		t.Fatalf("A's exit did not leave the status to B:\n%s", logsA)
	}
	if c := nodeCondition(t, s, "n1", typ); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("after the rollout: %+v", c)
	}

	// The last one exits: not ready.
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if c := nodeCondition(t, s, "n1", typ); c == nil || c.Status != corev1.ConditionFalse || c.Reason != "Stopping" {
		t.Fatalf("after the last exit: %+v\n%s", c, logsB)
	}
}
