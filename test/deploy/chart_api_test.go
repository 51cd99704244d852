package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// resourcePaths is where the API server takes each kind the chart renders
// (%s: the namespace; cluster-scoped kinds have none).
var resourcePaths = map[string]string{
	"v1 ServiceAccount":                               "/api/v1/namespaces/%s/serviceaccounts",
	"v1 Service":                                      "/api/v1/namespaces/%s/services",
	"v1 ConfigMap":                                    "/api/v1/namespaces/%s/configmaps",
	"apps/v1 DaemonSet":                               "/apis/apps/v1/namespaces/%s/daemonsets",
	"rbac.authorization.k8s.io/v1 Role":               "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
	"rbac.authorization.k8s.io/v1 RoleBinding":        "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
	"rbac.authorization.k8s.io/v1 ClusterRole":        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
	"rbac.authorization.k8s.io/v1 ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
	"monitoring.coreos.com/v1 ServiceMonitor":         "/apis/monitoring.coreos.com/v1/namespaces/%s/servicemonitors",
	"monitoring.coreos.com/v1 PodMonitor":             "/apis/monitoring.coreos.com/v1/namespaces/%s/podmonitors",
	"monitoring.coreos.com/v1 PrometheusRule":         "/apis/monitoring.coreos.com/v1/namespaces/%s/prometheusrules",
	"cilium.io/v2 CiliumLocalRedirectPolicy":          "/apis/cilium.io/v2/namespaces/%s/ciliumlocalredirectpolicies",
}

// installCRDs creates the CRDs of test/deploy/testdata/crds and waits until
// the API server serves them.
func installCRDs(t *testing.T, s *apiserver.Server) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in testdata/crds: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var crd struct {
			Metadata struct{ Name string }
		}
		_ = yaml.Unmarshal(data, &crd)
		s.MustDo(http.MethodPost, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", js, nil)
		path := "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + crd.Metadata.Name
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var st struct {
				Status struct {
					Conditions []struct{ Type, Status string }
				}
			}
			s.MustDo(http.MethodGet, path, nil, &st)
			established := false
			for _, c := range st.Status.Conditions {
				established = established || c.Type == "Established" && c.Status == "True"
			}
			if established {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CRD %s not established within 30s", crd.Metadata.Name)
			}
		}
	}
}

// dryRunCreate sends every object of a render to the API server as a
// server-side dry-run create with strict field validation: what `helm
// install` would have the API server check, schemas of the CRDs included.
func dryRunCreate(s *apiserver.Server, rendered string) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(rendered)))
	var errs []error
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return errors.Join(errs...)
		}
		if err != nil {
			return err
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string
			Metadata   struct{ Name, Namespace string }
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return err
		}
		if meta.Kind == "" {
			continue
		}
		p, ok := resourcePaths[meta.APIVersion+" "+meta.Kind]
		if !ok {
			errs = append(errs, fmt.Errorf("%s %s: no API path known", meta.APIVersion, meta.Kind))
			continue
		}
		if strings.Contains(p, "%s") {
			p = fmt.Sprintf(p, meta.Metadata.Namespace)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return err
		}
		q := url.Values{"dryRun": {"All"}, "fieldValidation": {"Strict"}}
		if err := s.Do(http.MethodPost, p+"?"+q.Encode(), js, nil); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", meta.Kind, meta.Metadata.Namespace, meta.Metadata.Name, err))
		}
	}
}

// TestChartAcceptedByTheAPIServer: a real kube-apiserver, with the Prometheus
// operator's and Cilium's CRDs installed, accepts every object of every
// render of chartCases (and of the three modes' defaults): Kubernetes' own
// validation and the CRDs' schemas, unknown fields refused. (make e2e
// installs the chart into its cluster; this covers every value.)
func TestChartAcceptedByTheAPIServer(t *testing.T) {
	helm := helmBinary(t, "3")
	s := apiserver.Start(t)
	installCRDs(t, s)
	s.CreateNamespace("monitoring")
	cases := append([]chartCase{
		{name: "lrp", values: []string{"mode=lrp"}},
		{name: "lrp with monitoring", values: []string{"mode=lrp", "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true", "metrics.prometheusRule.enabled=true"}},
	}, chartCases...)
	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			out := mustRender(t, helm, append(append([]string{}, testChartValues...), cc.values...)...)
			if err := dryRunCreate(s, out); err != nil {
				t.Error(err)
			}
		})
	}
	// And the API server does refuse: a PodMonitor field the CRD lacks.
	bad := "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x, namespace: kube-system}\nspec:\n  selector: {}\n  podMetricsEndpoints: [{prot: metrics}]\n"
	if err := dryRunCreate(s, bad); err == nil || !strings.Contains(err.Error(), "prot") {
		t.Errorf("a PodMonitor with an unknown field: %v", err)
	}
}
