package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The Helm chart (deploy/chart, issue 39), rendered by real Helm 3 and 4:
// its default values give the objects of deploy/daemonset.yaml, each mode
// those of its static manifest, every value renders objects the manifest
// checks accept, and a bad value fails at install with a message naming it.
// The API server's own validation of the renders is in chart_api_test.go.

const chartPath = repoRoot + "/deploy/chart"

// helmBinary is Helm major (3 or 4) as test/helm/install.sh builds it
// (pinned there): $NLD_HELM3 or $NLD_HELM4, else its install directory.
// Missing, the test skips (CI fails: .ci/run installs both).
func helmBinary(t *testing.T, major string) string {
	t.Helper()
	if p := os.Getenv("NLD_HELM" + major); p != "" {
		return p
	}
	script, err := os.ReadFile(filepath.Join(repoRoot, "test", "helm", "install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^helm` + major + `=(v[0-9.]+)`).FindSubmatch(script)
	if m == nil {
		t.Fatalf("test/helm/install.sh pins no helm%s version", major)
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(strings.TrimSpace(string(gopath)), "helm", string(m[1]), "helm")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Helm %s not installed at %s (.ci/run runs test/helm/install.sh %s)", m[1], p, major)
		}
		t.Skipf("Helm %s not installed: test/helm/install.sh %s builds it (a few minutes)", m[1], major)
	}
	return p
}

// helms runs f for Helm 3 and Helm 4.
func helms(t *testing.T, f func(t *testing.T, helm string)) {
	for _, major := range []string{"3", "4"} {
		t.Run("helm"+major, func(t *testing.T) { f(t, helmBinary(t, major)) })
	}
}

// The values an operator gives for the manifest's tokens (manifest_test.go).
var testChartValues = []string{"image.repository=registry.example.com/nodelocaldns", "image.tag=test"}

// renderChart runs `helm template` in namespace kube-system with values
// (KEY=VALUE, as --set; KEY@=JSON as --set-json) and returns the
// manifest, or Helm's error output.
func renderChart(helm string, values ...string) (string, error) {
	return renderChartIn(helm, "kube-system", values...)
}

func renderChartIn(helm, namespace string, values ...string) (string, error) {
	args := []string{"template", "nodelocaldns", chartPath, "--namespace", namespace}
	for _, v := range values {
		if k, js, ok := strings.Cut(v, "@="); ok {
			args = append(args, "--set-json", k+"="+js)
		} else {
			args = append(args, "--set", v)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func mustRender(t *testing.T, helm string, values ...string) string {
	t.Helper()
	out, err := renderChart(helm, values...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// genericObjects decodes every YAML document into plain maps, keyed by
// apiVersion, kind, namespace and name.
func genericObjects(data string) (map[string]map[string]any, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(data)))
	out := map[string]map[string]any{}
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, err
		}
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%v %v %v/%v", o["apiVersion"], o["kind"], md["namespace"], md["name"])
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%s twice", key)
		}
		out[key] = o
	}
}

// sameObjects returns how the objects of got differ from those of want:
// missing and extra objects, and for each differing one the lines of its
// YAML that only one side has.
func sameObjects(got, want string) []error {
	g, err := genericObjects(got)
	if err != nil {
		return []error{fmt.Errorf("chart: %w", err)}
	}
	w, err := genericObjects(want)
	if err != nil {
		return []error{fmt.Errorf("manifest: %w", err)}
	}
	var errs []error
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		gv, ok := g[k]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("the chart has no %s", k))
		case !reflect.DeepEqual(gv, w[k]):
			errs = append(errs, fmt.Errorf("%s differs:\n%s", k, lineDiff(w[k], gv)))
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			errs = append(errs, fmt.Errorf("the chart has %s, the manifest does not", k))
		}
	}
	return errs
}

// lineDiff lists the YAML lines only the manifest (-) or only the chart (+)
// has.
func lineDiff(manifest, chart any) string {
	a, _ := yaml.Marshal(manifest)
	b, _ := yaml.Marshal(chart)
	count := map[string]int{}
	for _, l := range strings.Split(string(a), "\n") {
		count[l]++
	}
	for _, l := range strings.Split(string(b), "\n") {
		count[l]--
	}
	var out []string
	for _, l := range strings.Split(string(a), "\n") {
		if count[l] > 0 {
			out = append(out, "- "+l)
			count[l]--
		}
	}
	for _, l := range strings.Split(string(b), "\n") {
		if count[l] < 0 {
			out = append(out, "+ "+l)
			count[l]++
		}
	}
	return strings.Join(out, "\n")
}

// lrpManifests is deploy/lrp rendered as docs/deploy.md's sed does.
func lrpManifests(t *testing.T) string {
	t.Helper()
	var all []string
	for _, f := range []string{"nodelocaldns-lrp.yaml", "cilium-lrp.yaml"} {
		data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "lrp", f))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, strings.NewReplacer("__PILLAR__DNS__DOMAIN__", testDomain, "__NODELOCALDNS__IMAGE__", testImage).Replace(string(data)))
	}
	return strings.Join(all, "\n---\n")
}

// TestChartRendersTheManifests: with the values that stand for the tokens,
// the chart's iptables mode is deploy/daemonset.yaml after docs/deploy.md's
// iptables-mode sed, its linkLocal mode the manifest after the link-local
// sed, its lrp mode deploy/lrp's two files, and autopath.enabled the
// manifest with -autopath and deploy/autopath/rbac.yaml: the same objects,
// field for field. The static manifests stay the documented source; this keeps the
// chart from drifting.
func TestChartRendersTheManifests(t *testing.T) {
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		values []string
		want   func() string
	}{
		{"iptables", []string{"kubeDNS.clusterIP=" + testKubeDNS}, func() string { return substitute(string(raw), iptablesMode) }},
		{"linkLocal", []string{"mode=linkLocal"}, func() string { return substitute(string(raw), ipvsMode) }},
		{"lrp", []string{"mode=lrp"}, func() string { return lrpManifests(t) }},
		{"iptables with autopath", []string{"kubeDNS.clusterIP=" + testKubeDNS, "autopath.enabled=true"}, func() string {
			rbac, err := os.ReadFile(autopathRBACPath)
			if err != nil {
				t.Fatal(err)
			}
			// docs/autopath.md: uncomment -autopath, apply deploy/autopath/rbac.yaml.
			return strings.Replace(substitute(string(raw), iptablesMode), "# - -autopath", "- -autopath", 1) + "\n---\n" + string(rbac)
		}},
	}
	helms(t, func(t *testing.T, helm string) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				got := mustRender(t, helm, append(append([]string{}, testChartValues...), c.values...)...)
				for _, err := range sameObjects(got, c.want()) {
					t.Error(err)
				}
			})
		}
	})
}

// TestChartDefaultsAreTheManifest: without kubeDNS.clusterIP the only
// difference from the manifest is the ClusterIP taken from the pod's
// environment, which the kubelet sets from the kube-dns Service; the
// render passes every check of the manifest and -check-config with the
// kubelet's environment.
func TestChartDefaultsAreTheManifest(t *testing.T) {
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(substitute(string(raw), iptablesMode), ","+testKubeDNS+"\n", ",$(KUBE_DNS_SERVICE_HOST)\n", 1)
	helms(t, func(t *testing.T, helm string) {
		got := mustRender(t, helm, testChartValues...)
		for _, err := range sameObjects(got, want) {
			t.Error(err)
		}
		checkChartRender(t, got, iptablesMode, true)
	})
}

// TestChartLint: helm lint --strict passes with the values an install
// needs, and the packaged chart holds what the templates read.
func TestChartLint(t *testing.T) {
	helms(t, func(t *testing.T, helm string) {
		args := []string{"lint", chartPath, "--strict", "--namespace", "kube-system"}
		for _, v := range testChartValues {
			args = append(args, "--set", v)
		}
		for _, extra := range [][]string{nil, {"--set", "mode=lrp"}, {"--set", "metrics.prometheusRule.enabled=true", "--set", "dashboard.enabled=true"}} {
			if out, err := exec.Command(helm, append(args, extra...)...).CombinedOutput(); err != nil {
				t.Errorf("helm lint %v: %v\n%s", extra, err, out)
			}
		}
		dir := t.TempDir()
		out, err := exec.Command(helm, "package", chartPath, "--destination", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("helm package: %v\n%s", err, out)
		}
		tgz := filepath.Join(dir, "nodelocaldns-0.1.0.tgz")
		list, err := exec.Command("tar", "-tzf", tgz).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"files/dashboard.json", "files/nodelocaldns.rules.yaml", "files/coredns-names.rules.yaml", "values.schema.json"} {
			if !strings.Contains(string(list), "nodelocaldns/"+f+"\n") {
				t.Errorf("the packaged chart lacks %s", f)
			}
		}
	})
}
