package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ciliumLRP is Cilium's CiliumLocalRedirectPolicy (cilium.io/v2), the
// fields of its CRD (pkg/k8s/apis/cilium.io/v2, CiliumLocalRedirectPolicySpec)
// with Cilium's JSON names, so that strict decoding catches a misspelt one.
type ciliumLRP struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		RedirectFrontend struct {
			AddressMatcher *struct {
				IP      string    `json:"ip"`
				ToPorts []lrpPort `json:"toPorts"`
			} `json:"addressMatcher,omitempty"`
			ServiceMatcher *struct {
				ServiceName string    `json:"serviceName"`
				Namespace   string    `json:"namespace"`
				ToPorts     []lrpPort `json:"toPorts,omitempty"`
			} `json:"serviceMatcher,omitempty"`
		} `json:"redirectFrontend"`
		RedirectBackend struct {
			LocalEndpointSelector metav1.LabelSelector `json:"localEndpointSelector"`
			ToPorts               []lrpPort            `json:"toPorts"`
		} `json:"redirectBackend"`
		SkipRedirectFromBackend bool   `json:"skipRedirectFromBackend,omitempty"`
		Description             string `json:"description,omitempty"`
	} `json:"spec"`
}

type lrpPort struct {
	Port     string `json:"port"`
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"`
}

// TestLRPManifest checks deploy/lrp: the DaemonSet runs in the pod network
// with the stock's arguments for this mode (no link, no rules, no
// teardown), the Corefile binds 0.0.0.0, and the redirect selects the cache
// pods in their own namespace by the port names their containers declare,
// from the kube-dns Service.
func TestLRPManifest(t *testing.T) {
	var objs []any
	for _, f := range []string{"nodelocaldns-lrp.yaml", "cilium-lrp.yaml"} {
		data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "lrp", f))
		if err != nil {
			t.Fatal(err)
		}
		o, err := decodeObjects(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		objs = append(objs, o...)
	}
	var ds *appsv1.DaemonSet
	var lrp *ciliumLRP
	var cm *corev1.ConfigMap
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *ciliumLRP:
			lrp = o
		case *corev1.ConfigMap:
			cm = o
		}
	}
	if ds == nil || lrp == nil || cm == nil {
		t.Fatalf("want a DaemonSet, a ConfigMap and a CiliumLocalRedirectPolicy, got %d objects", len(objs))
	}
	pod := ds.Spec.Template.Spec
	if pod.HostNetwork {
		t.Error("hostNetwork: the LRP mode runs in the pod's own network namespace")
	}
	c := pod.Containers[0]
	for _, a := range []string{"-setupinterface=false", "-setupiptables=false", "-skipteardown=true"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args %v lack %s", c.Args, a)
		}
	}
	if caps := c.SecurityContext.Capabilities.Add; len(caps) != 1 || caps[0] != "NET_BIND_SERVICE" {
		t.Errorf("capabilities %v: NET_BIND_SERVICE only (no link, no rules)", caps)
	}
	if !strings.Contains(cm.Data["Corefile"], "bind 0.0.0.0") || strings.Contains(cm.Data["Corefile"], "169.254.") {
		t.Error("the Corefile must bind 0.0.0.0 (the pod's addresses) and name no link-local address")
	}
	// The redirect: the kube-dns Service, to pods of this DaemonSet in the
	// policy's own namespace, by port names the container declares.
	if m := lrp.Spec.RedirectFrontend.ServiceMatcher; m == nil || m.ServiceName != "kube-dns" || m.Namespace != "kube-system" {
		t.Errorf("redirectFrontend: want serviceMatcher kube-dns/kube-system, got %+v", lrp.Spec.RedirectFrontend)
	}
	if lrp.Namespace != ds.Namespace {
		t.Errorf("the policy is in %s, the pods in %s: Cilium selects backends in the policy's namespace", lrp.Namespace, ds.Namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(&lrp.Spec.RedirectBackend.LocalEndpointSelector)
	if err != nil || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("localEndpointSelector %v does not select the pods (%v): %v", sel, ds.Spec.Template.Labels, err)
	}
	for _, p := range lrp.Spec.RedirectBackend.ToPorts {
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
			return cp.Name == p.Name && string(cp.Protocol) == p.Protocol && p.Port == "53" && cp.ContainerPort == 53
		}) {
			t.Errorf("redirectBackend port %+v is not a containerPort of the cache", p)
		}
	}
	if len(lrp.Spec.RedirectBackend.ToPorts) != 2 {
		t.Errorf("redirectBackend ports %+v: want dns (UDP) and dns-tcp (TCP)", lrp.Spec.RedirectBackend.ToPorts)
	}
	// A rollout starts the new pod before the old one stops.
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("updateStrategy %+v: want maxSurge 1, maxUnavailable 0", ds.Spec.UpdateStrategy)
	}
}
