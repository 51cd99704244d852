package podwatch

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trim keeps what autopath reads: the view computed from a trimmed pod is
// the view computed from the whole one.
func TestTrimKeepsTheView(t *testing.T) {
	node := NodeResolvConf{Search: []string{"corp.example"}, Options: []string{"ndots:2", "timeout:1"}}
	long := strings.Repeat("a", 254)
	for _, dc := range []*corev1.PodDNSConfig{
		nil,
		{},
		{Searches: []string{"extra.example", "shop.svc.cluster.local"}},
		{Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("2")}, {Name: "timeout", Value: strp("1")}, {Name: "ndots", Value: strp("3")}}},
		{Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("x")}}},
		{Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: strp("99999999999999999999")}}},
		{Options: []corev1.PodDNSConfigOption{{Name: "no-tld-query"}, {Name: "rotate"}}},
		{Options: []corev1.PodDNSConfigOption{{Name: "no_tld_query"}}},
		{Options: []corev1.PodDNSConfigOption{{Name: "no-tld-query", Value: strp("1")}}},
		{Searches: []string{long, "b.example", long, "c.example"}},
	} {
		for _, policy := range []corev1.DNSPolicy{corev1.DNSClusterFirst, corev1.DNSDefault, corev1.DNSNone} {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u", Labels: map[string]string{"a": "b"}},
				Spec:       corev1.PodSpec{NodeName: "node1", DNSPolicy: policy, DNSConfig: dc},
				Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}}},
			}
			tr, err := trim(p)
			if err != nil {
				t.Fatal(err)
			}
			want, wantIPs, wantOK := podFor(p, node, "cluster.local")
			got, gotIPs, gotOK := podFor(tr.(*corev1.Pod), node, "cluster.local")
			if !reflect.DeepEqual(want, got) || !reflect.DeepEqual(wantIPs, gotIPs) || wantOK != gotOK {
				t.Errorf("%s %+v: trimmed %+v, whole %+v", policy, dc, got, want)
			}
		}
	}
}

// A pod carrying megabytes the API does not bound (dnsConfig options, and
// everything else trim drops) is kept in a few KiB.
func TestTrimBoundsAHostilePod(t *testing.T) {
	var opts []corev1.PodDNSConfigOption
	for range 20000 {
		opts = append(opts, corev1.PodDNSConfigOption{Name: strings.Repeat("o", 60), Value: strp(strings.Repeat("v", 10))})
	}
	opts = append(opts, corev1.PodDNSConfigOption{Name: "ndots", Value: strp(strings.Repeat("1", 1<<20))})
	var searches []string
	for i := range 100 {
		searches = append(searches, strings.Repeat("s", 250)+string(rune('a'+i%26)))
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web",
			Annotations: map[string]string{"big": strings.Repeat("x", 200000)}},
		Spec: corev1.PodSpec{NodeName: "node1", DNSConfig: &corev1.PodDNSConfig{Searches: searches, Options: opts},
			Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}}}},
		Status: corev1.PodStatus{PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}, {IP: "10.0.0.6"}}},
	}
	tr, _ := trim(p)
	dc := tr.(*corev1.Pod).Spec.DNSConfig
	size := 0
	for _, s := range dc.Searches {
		size += len(s)
	}
	for _, o := range dc.Options {
		size += len(o.Name)
		if o.Value != nil {
			size += len(*o.Value)
		}
	}
	if len(dc.Searches) > maxSearches || len(dc.Options) > 2 || size > maxSearches*(maxSearchDomainLen+1)+64 {
		t.Errorf("kept %d searches, %d options, %d bytes", len(dc.Searches), len(dc.Options), size)
	}
	if len(tr.(*corev1.Pod).Status.PodIPs) > maxPodIPs || tr.(*corev1.Pod).Annotations != nil {
		t.Errorf("kept %+v", tr)
	}
	if v := dc.Options[0].Value; v == nil || *v != "invalid" {
		t.Errorf("a megabyte ndots value kept as %.20q", *v)
	}
}
