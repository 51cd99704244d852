package podwatch

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseNodeResolvConf(t *testing.T) {
	nc, err := parseNodeResolvConf(strings.NewReader(`# node
nameserver 10.0.0.2
search old.example
options timeout:2 ndots:2
search corp.example. . lab.example
options ndots:3 rotate
`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"corp.example", "lab.example"}; !reflect.DeepEqual(nc.Search, want) {
		t.Errorf("search %q, want %q (last line wins, dots and \".\" dropped)", nc.Search, want)
	}
	if want := []string{"timeout:2", "ndots:3", "rotate"}; !reflect.DeepEqual(nc.Options, want) {
		t.Errorf("options %q, want %q", nc.Options, want)
	}
}

func strp(s string) *string { return &s }

func TestPodResolvConf(t *testing.T) {
	node := NodeResolvConf{Search: []string{"corp.example", "svc.cluster.local"}, Options: []string{"ndots:2", "timeout:1"}}
	pod := func(policy corev1.DNSPolicy, hostNet bool, dc *corev1.PodDNSConfig) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p"},
			Spec:       corev1.PodSpec{DNSPolicy: policy, HostNetwork: hostNet, DNSConfig: dc},
		}
	}
	for _, tc := range []struct {
		name         string
		pod          *corev1.Pod
		search, opts []string
	}{
		{"ClusterFirst", pod(corev1.DNSClusterFirst, false, nil),
			// svc.cluster.local from the node is a duplicate: dropped.
			[]string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"}, []string{"ndots:5"}},
		{"ClusterFirst on the host network is Default", pod(corev1.DNSClusterFirst, true, nil),
			[]string{"corp.example", "svc.cluster.local"}, []string{"ndots:2", "timeout:1"}},
		{"ClusterFirstWithHostNet", pod(corev1.DNSClusterFirstWithHostNet, true, nil),
			[]string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"}, []string{"ndots:5"}},
		{"Default", pod(corev1.DNSDefault, false, nil),
			[]string{"corp.example", "svc.cluster.local"}, []string{"ndots:2", "timeout:1"}},
		{"None", pod(corev1.DNSNone, false, &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1"}, Searches: []string{"a.example"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("1")}},
		}), []string{"a.example"}, []string{"ndots:1"}},
		{"dnsConfig appends searches and overrides options", pod(corev1.DNSClusterFirst, false, &corev1.PodDNSConfig{
			Searches: []string{"cluster.local", "extra.example"},
			Options:  []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("2")}, {Name: "edns0"}},
		}), []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "extra.example"},
			[]string{"ndots:2", "edns0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, o := PodResolvConf(tc.pod, node, "cluster.local")
			if !reflect.DeepEqual(s, tc.search) {
				t.Errorf("search %q, want %q", s, tc.search)
			}
			if !reflect.DeepEqual(o, tc.opts) {
				t.Errorf("options %q, want %q", o, tc.opts)
			}
		})
	}
}

func TestFitSearchLimits(t *testing.T) {
	var many []string
	for i := 0; i < 40; i++ {
		many = append(many, "d"+strings.Repeat("x", i%3)+".example")
	}
	if got := fitSearchLimits(append([]string(nil), many...)); len(got) != maxSearchPaths {
		t.Errorf("%d domains kept of 40, want %d", len(got), maxSearchPaths)
	}
	long := strings.Repeat("a", 254)
	if got := fitSearchLimits([]string{"a.example", long, "b.example"}); !reflect.DeepEqual(got, []string{"a.example", "b.example"}) {
		t.Errorf("a 254-character domain was kept: %q", got)
	}
	// 10 domains of 250 characters: 2509 characters joined; the kubelet
	// cuts from the end until at most 2048 remain (8 domains, 2007).
	var big []string
	for i := 0; i < 10; i++ {
		big = append(big, strings.Repeat(string(rune('a'+i)), 250))
	}
	if got := fitSearchLimits(big); len(got) != 8 {
		t.Errorf("%d long domains kept, want 8", len(got))
	}
}

func TestPodFor(t *testing.T) {
	base := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "Shop", Name: "p"},
			Spec:       corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirst},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.5", PodIPs: []corev1.PodIP{{IP: "10.1.0.5"}, {IP: "fd00::5"}}},
		}
	}
	node := NodeResolvConf{Search: []string{"corp.example"}}
	p, ips, ok := podFor(base(), node, "cluster.local")
	if !ok || p.Ineligible != "" || p.Ndots != 5 || len(ips) != 2 {
		t.Fatalf("ClusterFirst pod: %+v %v %v", p, ips, ok)
	}
	if want := []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"}; !reflect.DeepEqual(p.Search, want) {
		t.Errorf("search %q, want %q (lower case)", p.Search, want)
	}

	hn := base()
	hn.Spec.HostNetwork = true
	if _, _, ok := podFor(hn, node, "cluster.local"); ok {
		t.Error("host-network pod in the view")
	}
	done := base()
	done.Status.Phase = corev1.PodSucceeded
	if _, _, ok := podFor(done, node, "cluster.local"); ok {
		t.Error("finished pod in the view")
	}
	noIP := base()
	noIP.Status = corev1.PodStatus{Phase: corev1.PodPending}
	if _, _, ok := podFor(noIP, node, "cluster.local"); ok {
		t.Error("pod without IP in the view")
	}
	def := base()
	def.Spec.DNSPolicy = corev1.DNSDefault
	if p, _, _ := podFor(def, node, "cluster.local"); p.Ineligible != reasonNotClusterSearch {
		t.Errorf("Default pod: ineligible %q", p.Ineligible)
	}
	badNdots := base()
	badNdots.Spec.DNSConfig = &corev1.PodDNSConfig{Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("x")}}}
	if p, _, _ := podFor(badNdots, node, "cluster.local"); p.Ineligible != reasonNdots {
		t.Errorf("ndots:x: ineligible %q", p.Ineligible)
	}
	bigNdots := base()
	bigNdots.Spec.DNSConfig = &corev1.PodDNSConfig{Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("40")}, {Name: "no-tld-query"}}}
	if p, _, _ := podFor(bigNdots, node, "cluster.local"); p.Ndots != 15 || !p.NoTLDQuery {
		t.Errorf("ndots:40 no-tld-query: %+v", p)
	}
	root := base()
	root.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"."}}
	if p, _, _ := podFor(root, node, "cluster.local"); p.Ineligible != reasonRootSearch {
		t.Errorf("search .: ineligible %q", p.Ineligible)
	}
	long := base()
	long.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{strings.Repeat("a", 60) + ".example", strings.Repeat("b", 60) + ".example", strings.Repeat("c", 60) + ".example"}}
	if p, _, _ := podFor(long, node, "cluster.local"); p.Ineligible != reasonMuslLine {
		t.Errorf("long search line: ineligible %q", p.Ineligible)
	}
}

func TestBuildViewSharedIP(t *testing.T) {
	node := NodeResolvConf{}
	a := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "old"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.9"}}
	b := a.DeepCopy()
	b.Namespace, b.Name = "b", "new"
	pa, ia, _ := podFor(a, node, "cluster.local")
	pb, ib, _ := podFor(b, node, "cluster.local")
	v := buildView(map[string]podEntry{"a/old": {pa, ia}, "b/new": {pb, ib}})
	if p := v.byIP[ia[0]]; p == nil || p.Ineligible != reasonSharedIP {
		t.Errorf("an address two pods claim: %+v", p)
	}
	v = buildView(map[string]podEntry{"b/new": {pb, ib}})
	if p := v.byIP[ia[0]]; p == nil || p.Namespace != "b" || p.Ineligible != "" {
		t.Errorf("after the old pod left: %+v", p)
	}
}
