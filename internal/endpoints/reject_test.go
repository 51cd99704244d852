package endpoints

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// TestWatchRejectsLoopsAndNoPodAddresses (issue 41): through a real kube-apiserver, a slice of
// kube-dns-upstream that lists one of our own listen sockets (here the kube-dns ClusterIP,
// which the cache binds in iptables mode) or a multicast address, ready, gets neither asked:
// they are counted (View.Rejected, the rejected gauge) and logged, and the real pod is asked.
// The API server itself refuses loopback, link-local and unspecified addresses in a slice;
// compute drops those too (TestComputeRejects), for a server or an etcd that lies.
func TestWatchRejectsLoopsAndNoPodAddresses(t *testing.T) {
	s := apiserver.Start(t)
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount", "Role", "RoleBinding")
	token := s.ServiceAccountToken("kube-system", "nodelocaldns")
	for _, ip := range []string{"127.0.0.1", "169.254.20.10", "0.0.0.0"} {
		if err := s.Do(http.MethodPost, slicesPath, slice("refused-"+strings.ReplaceAll(ip, ".", "-"), "kube-dns-upstream", "IPv4", 53,
			ep{ip: ip, ready: true}), nil); err == nil {
			t.Errorf("the API server took %s in a slice: compute's check is then the only one", ip)
		}
	}
	ours := netip.MustParseAddrPort("10.96.0.10:53")
	putSlice(t, s, slice("up-a", "kube-dns-upstream", "IPv4", 53,
		ep{ip: "10.244.0.2", ready: true}, ep{ip: "10.96.0.10", ready: true}, ep{ip: "239.1.2.3", ready: true}))

	var ch changes
	logs := &lockedBuffer{}
	w, err := New(Config{Rest: s.Config(token), Namespace: "kube-system", Service: "kube-dns-upstream",
		ServicePort: 53, Node: "node1", Own: func(ap netip.AddrPort) bool { return ap == ours },
		OnChange: ch.add, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, 30*time.Second, "the first list", func() bool { return slices.Equal(ch.last(), aps("10.244.0.2:53")) })
	want := []Rejected{{netip.MustParseAddrPort("10.96.0.10:53"), RejectOurs}, {netip.MustParseAddrPort("239.1.2.3:53"), RejectMulticast}}
	if v := w.View(); !slices.Equal(v.Rejected, want) {
		t.Errorf("rejected %v, want %v", v.Rejected, want)
	}
	if l := logs.String(); strings.Count(l, "never asking these") != 1 || !strings.Contains(l, "10.96.0.10:53 (ours)") {
		t.Errorf("log:\n%s", l)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(w.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "nodelocaldns_kubedns_endpoints" && l.GetName() == "state" && l.GetValue() == "rejected" {
					got = m.GetGauge().GetValue()
				}
			}
		}
	}
	if got != 2 {
		t.Errorf(`nodelocaldns_kubedns_endpoints{state="rejected"} %v, want 2`, got)
	}
}

// TestComputeRejects: whatever a slice says, an endpoint that is ours, loopback, link-local,
// unspecified or multicast is never in use, in either family, and each is counted once.
func TestComputeRejects(t *testing.T) {
	for _, fam := range []struct {
		v6   bool
		typ  discoveryv1.AddressType
		good string
		bad  map[string]string
	}{
		{false, discoveryv1.AddressTypeIPv4, "10.244.0.2", map[string]string{"10.96.0.10": RejectOurs, "127.0.0.1": RejectLoopback,
			"127.1.2.3": RejectLoopback, "169.254.20.10": RejectLinkLocal, "0.0.0.0": RejectUnspecified, "224.0.0.251": RejectMulticast, "239.9.9.9": RejectMulticast}},
		{true, discoveryv1.AddressTypeIPv6, "fd00::2", map[string]string{"fd00::a": RejectOurs, "::1": RejectLoopback,
			"fe80::1": RejectLinkLocal, "::": RejectUnspecified, "ff02::fb": RejectMulticast}},
	} {
		tcp, name, port := corev1.ProtocolTCP, "dns-tcp", int32(53)
		s := &discoveryv1.EndpointSlice{AddressType: fam.typ,
			Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &tcp, Port: &port}}}
		ready := true
		for _, ip := range append([]string{fam.good}, keys(fam.bad)...) {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
		}
		own := func(ap netip.AddrPort) bool {
			return ap.Addr().String() == "10.96.0.10" || ap.Addr().String() == "fd00::a"
		}
		cfg := Config{IPv6: fam.v6, Max: DefaultMax, ServicePort: 53, Own: own}
		v := compute(map[string]*discoveryv1.EndpointSlice{"a": s}, &cfg)
		if len(v.InUse) != 1 || v.InUse[0].Addr().String() != fam.good {
			t.Errorf("in use %v, want %s alone", v.InUse, fam.good)
		}
		if len(v.Rejected) != len(fam.bad) {
			t.Errorf("rejected %v, want %d", v.Rejected, len(fam.bad))
		}
		for _, r := range v.Rejected {
			if fam.bad[r.Addr.Addr().String()] != r.Why {
				t.Errorf("%s rejected as %s, want %s", r.Addr, r.Why, fam.bad[r.Addr.Addr().String()])
			}
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
