package daemon

import (
	"net/netip"
	"os"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/endpoints"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/metrics"
)

// kubeEndpoints hands the ready kube-dns endpoints (internal/endpoints) to the kube-dns group
// (forward.Group.SetEndpoints), and to its successor when a Corefile change replaces the group
// with one for the same address; a group for another address keeps its ClusterIP only.
type kubeEndpoints struct {
	at     netip.AddrPort // the ClusterIP of the Service followed
	mu     sync.Mutex
	group  *forward.Group
	eps    []netip.AddrPort
	notify func() // the fallback's chains follow the endpoints (fallback.go)
}

func (k *kubeEndpoints) set(eps []netip.AddrPort) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.eps = eps
	if k.group != nil {
		_ = k.group.SetEndpoints(eps) // a closed group (replaced meanwhile) takes none
	}
	if k.notify != nil {
		k.notify()
	}
}

// setGroup is called when the kube-dns group is replaced (running's
// kube-dns group hook).
func (k *kubeEndpoints) setGroup(g *forward.Group, addr netip.AddrPort) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.group = nil
	if addr == k.at {
		k.group = g
		_ = g.SetEndpoints(k.eps)
	}
}

// startKubeEndpoints follows kube-dns' EndpointSlices when the API server can be reached
// (in-cluster credentials, or Options.KubeConfig) and kube-dns' address is a known Service's
// ClusterIP; otherwise, and whenever the API is lost before a first list, the kube-dns group
// asks the ClusterIP as before. One log line says which.
func (d *Daemon) startKubeEndpoints() {
	if d.cfg.LocalMode || d.run.KubeGroup() == nil {
		return
	}
	if d.cfg.KubeDNSService == "" {
		d.log.Info("kube-dns: asking the ClusterIP only: its address is not -upstreamsvc's Service's ($NAME_SERVICE_HOST)", "kube_dns", kubeDNSString(d.cfg))
		return
	}
	rc, ns := d.opt.KubeConfig, d.opt.KubeNamespace
	if rc == nil {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			d.log.Info("kube-dns: asking the ClusterIP only: no API server credentials (service account token) to follow its endpoints", "err", err)
			return
		}
	}
	if ns == "" {
		b, err := os.ReadFile(config.ServiceAccountDir + "/namespace")
		if err != nil || strings.TrimSpace(string(b)) == "" {
			d.log.Info("kube-dns: asking the ClusterIP only: the pod's namespace is unknown", "err", err)
			return
		}
		ns = strings.TrimSpace(string(b))
	}
	k := &kubeEndpoints{at: d.cfg.KubeDNS, group: d.run.KubeGroup(), notify: d.fallback.changed}
	w, err := endpoints.New(endpoints.Config{
		Rest: rc, Namespace: ns, Service: d.cfg.KubeDNSService,
		IPv6: d.cfg.KubeDNS.Addr().Is6(), ServicePort: d.cfg.KubeDNS.Port(),
		Node: d.cfg.Autopath.NodeName, Own: d.ownEndpoint, OnChange: k.set, Logger: d.log,
	})
	if err != nil {
		d.log.Error("kube-dns: asking the ClusterIP only", "err", err)
		return
	}
	klog.SetSlogLogger(d.log.With("component", "client-go"))
	d.Metrics.Registry.MustRegister(w.Collectors()...)
	d.kubeEP, d.KubeEndpoints = k, w
	d.run.SetKubeGroupHook(k.setGroup)
	d.stopKubeEP = d.background(w.Run)
	d.log.Info("kube-dns: following the endpoints of its Service; its pods are asked directly once listed, the ClusterIP meanwhile and as fallback",
		"service", ns+"/"+d.cfg.KubeDNSService)
}

// ownEndpoint reports whether a kube-dns endpoint is ours: one of our
// listen sockets (a loop back into us), or, on any port, one of the
// addresses we listen on by name (the link-local address, the ClusterIP in
// iptables mode: no kube-dns pod has them). Another address of the host on
// another port than the wildcard's may be a hostNetwork kube-dns pod's.
func (d *Daemon) ownEndpoint(ap netip.AddrPort) bool {
	if d.cfg.Ours(ap) {
		return true
	}
	for _, s := range d.cfg.Sockets() {
		if !s.Addr().IsUnspecified() && s.Addr().Unmap() == ap.Addr().Unmap() {
			return true
		}
	}
	return false
}

var _ forward.Remover = (*metrics.Metrics)(nil)
