package deploy

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// nodeReadinessRule is the Node Readiness Controller's NodeReadinessRule
// (readiness.node.x-k8s.io/v1alpha1, api/v1alpha1/nodereadinessrule_types.go
// of kubernetes-sigs/node-readiness-controller): its spec's fields with
// their JSON names, so that strict decoding catches a misspelt one.
type nodeReadinessRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Conditions []struct {
			Type           string                 `json:"type"`
			RequiredStatus corev1.ConditionStatus `json:"requiredStatus"`
			DefaultStatus  corev1.ConditionStatus `json:"defaultStatus,omitempty"`
		} `json:"conditions"`
		EnforcementMode string               `json:"enforcementMode"`
		Taint           corev1.Taint         `json:"taint"`
		NodeSelector    metav1.LabelSelector `json:"nodeSelector"`
		ConditionPolicy string               `json:"conditionPolicy,omitempty"`
		DryRun          bool                 `json:"dryRun,omitempty"`
	} `json:"spec"`
}

// nodeReadinessObjects decodes deploy/node-readiness/FILE.
func nodeReadinessObjects(t *testing.T, file string) []any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "node-readiness", file))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return objs
}

// TestNodeReadinessManifests checks deploy/node-readiness against the
// DaemonSet and the daemon: the rule waits for the condition the manifest's
// commented -node-condition line sets, its taint is one the controller
// accepts (its CRD's rules: a readiness.k8s.io/ key, a valid name, an
// effect), it selects the nodes the DaemonSet runs on and is bootstrap-only
// (an uninstall never taints a node); both grants bind the DaemonSet's
// ServiceAccount, the narrow one with constrained impersonation only.
func TestNodeReadinessManifests(t *testing.T) {
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^ *# - -node-condition=(\S+)$`).FindStringSubmatch(string(raw))
	if line == nil {
		t.Fatal("deploy/daemonset.yaml has no commented '# - -node-condition=TYPE' line")
	}
	objs := loadManifest(t, iptablesMode)
	ds := daemonSets(objs)[0]

	var rule *nodeReadinessRule
	for _, o := range nodeReadinessObjects(t, "rule.yaml") {
		if r, ok := o.(*nodeReadinessRule); ok {
			rule = r
		}
	}
	if rule == nil {
		t.Fatal("rule.yaml has no NodeReadinessRule")
	}
	s := rule.Spec
	if len(s.Conditions) != 1 || s.Conditions[0].Type != line[1] || s.Conditions[0].RequiredStatus != corev1.ConditionTrue {
		t.Errorf("the rule waits for %+v, the manifest sets %s", s.Conditions, line[1])
	}
	key := regexp.MustCompile(`^readiness\.k8s\.io/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	if !key.MatchString(s.Taint.Key) || len(s.Taint.Value) > 63 || !slices.Contains([]corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}, s.Taint.Effect) {
		t.Errorf("taint %+v: the controller's CRD refuses it", s.Taint)
	}
	if s.Taint.Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taint effect %s: NoSchedule keeps new pods off without evicting running ones", s.Taint.Effect)
	}
	if s.EnforcementMode != "bootstrap-only" {
		t.Errorf("enforcementMode %q: continuous would taint every node for good after an uninstall", s.EnforcementMode)
	}
	sel, err := metav1.LabelSelectorAsSelector(&s.NodeSelector)
	if err != nil || s.NodeSelector.MatchLabels == nil && s.NodeSelector.MatchExpressions == nil {
		t.Errorf("nodeSelector %+v: %v (the CRD requires one)", s.NodeSelector, err)
	} else if nodeLabels := ds.Spec.Template.Spec.NodeSelector; !sel.Matches(labels.Set(nodeLabels)) {
		t.Errorf("the rule's nodeSelector %v does not select the DaemonSet's nodes %v", sel, nodeLabels)
	}
	// The DaemonSet starts where the taint is.
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, func(x corev1.Toleration) bool {
		return x.Operator == corev1.TolerationOpExists && x.Key == "" && x.Effect == "" // every taint, as the manifest's
	}) {
		t.Error("the DaemonSet does not tolerate the rule's taint: the cache could never start on a new node")
	}

	for file, want := range map[string][]string{
		"rbac.yaml":          {"impersonate:associated-node", "impersonate-on:associated-node:patch"},
		"rbac-any-node.yaml": {"patch"},
	} {
		var role *rbacv1.ClusterRole
		var binding *rbacv1.ClusterRoleBinding
		for _, o := range nodeReadinessObjects(t, file) {
			switch v := o.(type) {
			case *rbacv1.ClusterRole:
				role = v
			case *rbacv1.ClusterRoleBinding:
				binding = v
			}
		}
		if role == nil || binding == nil || binding.RoleRef.Name != role.Name {
			t.Fatalf("%s: a ClusterRole and its binding wanted", file)
		}
		if len(binding.Subjects) != 1 || binding.Subjects[0].Name != ds.Spec.Template.Spec.ServiceAccountName || binding.Subjects[0].Namespace != ds.Namespace {
			t.Errorf("%s binds %+v, not the DaemonSet's ServiceAccount", file, binding.Subjects)
		}
		for _, r := range role.Rules {
			for _, v := range r.Verbs {
				if !slices.Contains(want, v) {
					t.Errorf("%s: verb %q beyond %v", file, v, want)
				}
			}
			for _, res := range r.Resources {
				if res != "nodes" && res != "nodes/status" {
					t.Errorf("%s: resource %q beyond nodes and nodes/status", file, res)
				}
			}
		}
	}
}

// TestDeployNodeFlagsTurnedOn: the manifest's commented -external-upstream
// and -node-condition lines, uncommented, give a manifest that passes
// every check and a configuration with both on, for this node's name.
func TestDeployNodeFlagsTurnedOn(t *testing.T) {
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, edit := range [][2]string{
		{"# - -external-upstream=kube-dns", "- -external-upstream=kube-dns"},
		{"# - -node-condition=", "- -node-condition="},
	} {
		if strings.Count(text, edit[0]) != 1 {
			t.Fatalf("the manifest does not have exactly one %q", edit[0])
		}
		text = strings.Replace(text, edit[0], edit[1], 1)
	}
	objs, err := decodeObjects([]byte(substitute(text, iptablesMode)))
	if err != nil {
		t.Fatal(err)
	}
	rc := nodeResolvConf(t)
	for _, err := range checkDeployment(objs, iptablesMode, dockerfileEntrypoint(t), rc) {
		t.Error(err)
	}
	c := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", c)
	cfg, err := config.Parse(append(containerArgs(c, env), "-resolv-conf="+rc), func(k string) string { return env[k] }, io.Discard)
	if err != nil || !cfg.Node.ExternalToKubeDNS || cfg.Node.Condition == "" || cfg.Autopath.NodeName != "node-1" || cfg.Node.StatusAs != config.StatusAsNode {
		t.Errorf("config with the node flags: %+v %v", cfg, err)
	}
}
