package podwatch

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is one pod's resolver configuration, as autopath needs it.
type Pod struct {
	Namespace string
	Name      string
	UID       types.UID
	// Search is the pod's search list in its order, lower case, without
	// trailing dots.
	Search []string
	// Ndots is the pod's ndots (1 when its resolv.conf does not set it).
	Ndots int
	// NoTLDQuery is glibc's no-tld-query option: a single-label name is
	// never asked as it is.
	NoTLDQuery bool
	// Ineligible says why autopath must not answer for this pod; "" when
	// it may.
	Ineligible string
}

// Reasons a pod is not eligible for autopath.
const (
	reasonNotClusterSearch = "search list does not start with the cluster search domains"
	reasonRootSearch       = `search list contains "."`
	reasonNdots            = "ndots option is not a number"
	reasonMuslLine         = "search line too long for musl (256 bytes)"
	reasonSharedIP         = "address claimed by more than one pod"
)

// podFor computes the Pod of an API pod; ok is false when the pod has no
// address of its own (host network, no IP yet, finished).
func podFor(p *corev1.Pod, node NodeResolvConf, clusterDomain string) (pod *Pod, ips []netip.Addr, ok bool) {
	if p.Spec.HostNetwork {
		return nil, nil, false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		// The kubelet has released the sandbox and its addresses.
		return nil, nil, false
	}
	ips = podIPs(p)
	if len(ips) == 0 {
		return nil, nil, false
	}
	search, options := PodResolvConf(p, node, clusterDomain)
	pod = &Pod{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
	for _, s := range search {
		pod.Search = append(pod.Search, strings.ToLower(s))
	}
	for _, o := range options {
		if o == "no-tld-query" || o == "no_tld_query" {
			pod.NoTLDQuery = true
		}
	}
	n, nOK := ndots(options)
	pod.Ndots = n
	cd := strings.ToLower(clusterDomain)
	want := []string{strings.ToLower(p.Namespace) + ".svc." + cd, "svc." + cd, cd}
	switch {
	case !nOK:
		pod.Ineligible = reasonNdots
	case len(pod.Search) < len(want) || !equal(pod.Search[:len(want)], want):
		pod.Ineligible = reasonNotClusterSearch
	case contains(pod.Search, ".") || contains(pod.Search, ""):
		pod.Ineligible = reasonRootSearch
	case len("search "+strings.Join(search, " ")+"\n") >= muslMaxLine:
		pod.Ineligible = reasonMuslLine
	}
	return pod, ips, true
}

func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return
		}
		a = a.Unmap()
		for _, x := range out {
			if x == a {
				return
			}
		}
		out = append(out, a)
	}
	add(p.Status.PodIP)
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// view is an immutable snapshot: pod IP -> Pod. An address claimed by two
// pods (a reused IP whose old pod's deletion has not been seen yet) maps to
// a Pod marked ineligible.
type view struct {
	byIP map[netip.Addr]*Pod
	pods int
}

type podEntry struct {
	pod *Pod
	ips []netip.Addr
}

func buildView(entries map[string]podEntry) *view {
	v := &view{byIP: make(map[netip.Addr]*Pod, len(entries)), pods: len(entries)}
	for _, e := range entries {
		for _, ip := range e.ips {
			if old, dup := v.byIP[ip]; dup {
				v.byIP[ip] = &Pod{
					Namespace: old.Namespace, Name: old.Name + "," + e.pod.Name,
					Ineligible: reasonSharedIP,
				}
				continue
			}
			v.byIP[ip] = e.pod
		}
	}
	return v
}
