package deploy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// TestManifestRBACPerFeature (issue 41): through a real kube-apiserver, the
// service account's token can do what the enabled features need and
// nothing more. deploy/daemonset.yaml alone (the endpoint watch, on by
// default): list and watch endpointslices in kube-system, no pod anywhere.
// With deploy/autopath/rbac.yaml (-autopath): list and watch pods in every
// namespace too, still no get of a pod, no secret. With
// deploy/node-readiness/rbac.yaml (-node-condition): nothing on nodes as
// itself, only the constrained impersonation of its own node.
func TestManifestRBACPerFeature(t *testing.T) {
	s := apiserver.Start(t)
	// Every RBAC object the default manifest has, as kubectl apply creates it.
	kinds := []string{"ServiceAccount", "Role", "RoleBinding"}
	for _, o := range loadManifest(t, iptablesMode) {
		switch o.(type) {
		case *rbacv1.ClusterRole:
			kinds = append(kinds, "ClusterRole")
		case *rbacv1.ClusterRoleBinding:
			kinds = append(kinds, "ClusterRoleBinding")
		}
	}
	s.ApplyManifest(t, manifestPath, kinds...)
	token := s.ServiceAccountToken("kube-system", "nodelocaldns")
	type access struct {
		verb, resource, group, namespace string
	}
	can := func(a access) bool {
		var out struct {
			Status struct {
				Allowed bool `json:"allowed"`
			} `json:"status"`
		}
		attrs := map[string]any{"verb": a.verb, "resource": a.resource, "group": a.group}
		if a.namespace != "" {
			attrs["namespace"] = a.namespace
		}
		body := map[string]any{"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
			"spec": map[string]any{"resourceAttributes": attrs}}
		if err := s.DoAs(token, http.MethodPost, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body, &out); err != nil {
			t.Fatal(err)
		}
		return out.Status.Allowed
	}
	check := func(what string, want map[access]bool) {
		t.Helper()
		// RBAC changes reach the authorizer within a second or so.
		deadline := time.Now().Add(30 * time.Second)
		for {
			var wrong []string
			for a, w := range want {
				if got := can(a); got != w {
					wrong = append(wrong, fmt.Sprintf("%s %s.%s in %q: %v, want %v", a.verb, a.resource, a.group, a.namespace, got, w))
				}
			}
			if len(wrong) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s:\n%s", what, strings.Join(wrong, "\n"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	endpointWatch := map[access]bool{
		{"list", "endpointslices", "discovery.k8s.io", "kube-system"}:  true,
		{"watch", "endpointslices", "discovery.k8s.io", "kube-system"}: true,
		{"get", "endpointslices", "discovery.k8s.io", "kube-system"}:   false,
		{"list", "endpointslices", "discovery.k8s.io", "default"}:      false,
		{"list", "secrets", "", "kube-system"}:                         false,
		{"get", "pods", "", "kube-system"}:                             false,
		{"list", "services", "", "kube-system"}:                        false,
		{"get", "daemonsets", "apps", "kube-system"}:                   false, // only nodelocaldns, by name
		{"list", "daemonsets", "apps", "kube-system"}:                  false,
	}
	noPods := map[access]bool{
		{"list", "pods", "", ""}:            false,
		{"watch", "pods", "", ""}:           false,
		{"list", "pods", "", "kube-system"}: false,
	}
	check("deploy/daemonset.yaml alone", merge(endpointWatch, noPods))

	s.ApplyManifest(t, autopathRBACPath, "ClusterRole", "ClusterRoleBinding")
	check("with deploy/autopath/rbac.yaml", merge(endpointWatch, map[access]bool{
		{"list", "pods", "", ""}:        true,
		{"watch", "pods", "", ""}:       true,
		{"get", "pods", "", "default"}:  false,
		{"list", "secrets", "", ""}:     false,
		{"list", "pods", "", "default"}: true,
	}))

	// With deploy/node-readiness/rbac.yaml (-node-condition): as itself,
	// still nothing on nodes; it may only act as its own node
	// (internal/nodestatus's tests write through it, and are refused
	// another node and its own taints).
	s.ApplyManifest(t, "../../deploy/node-readiness/rbac.yaml", "ClusterRole", "ClusterRoleBinding")
	check("with deploy/node-readiness/rbac.yaml", merge(endpointWatch, map[access]bool{
		{"impersonate:associated-node", "nodes", "authentication.k8s.io", ""}: true,
		{"impersonate", "users", "", ""}:                                      false,
		{"patch", "nodes", "", ""}:                                            false,
		{"get", "nodes", "", ""}:                                              false,
		{"list", "nodes", "", ""}:                                             false,
	}))
}

func merge[K comparable](a, b map[K]bool) map[K]bool {
	out := map[K]bool{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
