package endpoints

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/prometheus/client_golang/prometheus"
)

// State is the watch's standing with the API server (kubewatch's):
// Starting, Synced, Lost (the last known endpoints stay in use) or
// Forbidden (no RBAC for endpointslices: the watch stopped and the
// ClusterIP is used).
type State = kubewatch.State

// Defaults.
const (
	// DefaultMax is how many endpoints one node follows: each gets -tcp-pool-size connections
	// (at most ~90 KiB each with their buffers and goroutines: 16 x 2 x 90 KiB < 3 MiB), and
	// with rendezvous hashing the nodes together still spread over every pod of a kube-dns
	// scaled far beyond 16 (docs/design.md, "kube-dns endpoints").
	DefaultMax = 16
	// DefaultResync re-delivers every slice now and then (10 min: a safety net; changes
	// arrive by the watch within milliseconds).
	DefaultResync = 10 * time.Minute
	// maxSliceEndpoints: the API allows 1000 endpoints in a slice; more are not kept.
	maxSliceEndpoints = 1000
	// maxSlicePorts: the API allows 100 ports in a slice.
	maxSlicePorts = 100
	// maxStored bounds the endpoints kept over all the Service's slices (~200 bytes each once
	// trimmed: 1 MiB); a kube-dns of more pods is not one any cluster runs. Those beyond are
	// counted as over_max.
	maxStored = 5000
	// dnsTCPPort is the port name kube-dns' Service (and the manifests' kube-dns-upstream)
	// gives its TCP port.
	dnsTCPPort = "dns-tcp"
)

// Config says which Service to follow.
type Config struct {
	// Rest reaches the API server: rest.InClusterConfig() in a pod.
	Rest *rest.Config
	// Namespace and Service name the Service (slices labelled kubernetes.io/service-name).
	Namespace, Service string
	// Family: endpoints of this address family only (the ClusterIP's), so a dual-stack
	// Service gives the addresses the cache would reach through its ClusterIP.
	IPv6 bool
	// ServicePort is the ClusterIP's port: it picks the slice port when none is named
	// "dns-tcp" and the slice has several TCP ports.
	ServicePort uint16
	// Node picks this node's subset when more than Max endpoints are ready.
	Node string
	// Own reports whether an address and port is one of our own listen
	// sockets: an endpoint there would loop back into us (nil: none is).
	Own func(netip.AddrPort) bool
	// Max endpoints in use (DefaultMax when 0).
	Max int
	// OnChange gets the endpoints in use each time they change (from the watch's goroutine),
	// first once the first list is in.
	OnChange func([]netip.AddrPort)
	Resync   time.Duration
	Logger   *slog.Logger
}

// Watch follows the Service's slices. Its accessors are safe for concurrent use.
type Watch struct {
	cfg      Config
	log      *slog.Logger
	lw       cache.ListerWatcher
	standing *kubewatch.Standing
	cancel   atomic.Pointer[context.CancelFunc]

	mu      sync.Mutex
	slices  map[string]*discoveryv1.EndpointSlice // by name, trimmed
	dropped map[string]int                        // endpoints of a slice beyond maxStored
	view    View
	sent    bool // OnChange called at least once

	collectors []prometheus.Collector
}

// View is what the slices say now.
type View struct {
	// InUse are the endpoints asked, sorted.
	InUse []netip.AddrPort
	// UDP are the same pods on their UDP DNS port (the slice's port named
	// "dns", else its only UDP port, else the Service's): where the
	// fallback's DNAT sends pods' UDP queries while no cache serves.
	UDP []netip.AddrPort
	// NotReady counts endpoints not ready or terminating; OverMax ready ones beyond Max, and
	// any beyond the 5000 kept; NoPort slices without a usable TCP port.
	NotReady, OverMax, NoPort int
	// Rejected are the endpoints never asked, whatever their readiness, sorted: ours (one of
	// our listen sockets: a loop), loopback, link-local, unspecified or multicast (no kube-dns
	// pod has such an address; the API server refuses most of them, a lying one or a write
	// to etcd would not).
	Rejected []Rejected
}

// Rejected is an endpoint never asked, and why.
type Rejected struct {
	Addr netip.AddrPort
	Why  string // RejectOurs, RejectLoopback, RejectLinkLocal, RejectUnspecified, RejectMulticast
}

func (r Rejected) String() string { return r.Addr.String() + " (" + r.Why + ")" }

// Why an endpoint is rejected.
const (
	RejectOurs        = "ours"
	RejectLoopback    = "loopback"
	RejectLinkLocal   = "link_local"
	RejectUnspecified = "unspecified"
	RejectMulticast   = "multicast"
)

// rejection says why ap is no endpoint to ask ("" when it is one).
func rejection(ap netip.AddrPort, own func(netip.AddrPort) bool) string {
	a := ap.Addr()
	switch {
	case a.IsUnspecified():
		return RejectUnspecified
	case a.IsLoopback():
		return RejectLoopback
	case a.IsLinkLocalUnicast():
		return RejectLinkLocal
	case a.IsMulticast():
		return RejectMulticast
	case own != nil && own(ap):
		return RejectOurs
	}
	return ""
}

// New prepares a watch; Run starts it.
func New(cfg Config) (*Watch, error) {
	if cfg.Rest == nil {
		return nil, errors.New("endpoints: no API server config")
	}
	if cfg.Namespace == "" || cfg.Service == "" {
		return nil, errors.New("endpoints: no Service named")
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultMax
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rc, err := kubewatch.RESTClient(cfg.Rest, "/apis", discoveryv1.SchemeGroupVersion, discoveryv1.AddToScheme, "nodelocaldns-endpoints")
	if err != nil {
		return nil, fmt.Errorf("endpoints: %w", err)
	}
	w := &Watch{cfg: cfg, slices: map[string]*discoveryv1.EndpointSlice{}, dropped: map[string]int{},
		log: cfg.Logger.With("component", "kube-dns-endpoints", "service", cfg.Namespace+"/"+cfg.Service)}
	w.standing = kubewatch.NewStanding("kubedns", "endpoint_watch", kubewatch.StandingHelp{
		Losses: "Times the kube-dns endpoint watch went from synced to lost (the last known endpoints stay in use).",
		Errors: "Failed list or watch calls for kube-dns' EndpointSlices.",
		Synced: "1 when the kube-dns endpoint watch follows the API server, 0 while starting, lost or forbidden.",
	})
	w.standing.StopOnForbidden = true
	w.standing.Changed = w.changed
	w.collectors = append(w.standing.Collectors(), endpointGauges(w)...)
	sel := discoveryv1.LabelServiceName + "=" + cfg.Service
	inner := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			out := &discoveryv1.EndpointSliceList{}
			err := rc.Get().Namespace(cfg.Namespace).Resource("endpointslices").
				VersionedParams(&o, metav1.ParameterCodec).Do(ctx).Into(out)
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			o.Watch = true
			return rc.Get().Namespace(cfg.Namespace).Resource("endpointslices").
				VersionedParams(&o, metav1.ParameterCodec).Watch(ctx)
		},
	}
	w.lw = &kubewatch.Noting{LW: inner, Note: w.note}
	return w, nil
}

// Run watches until ctx ends, or until the API server forbids the watch.
func (w *Watch) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.cancel.Store(&cancel)
	kubewatch.Run(ctx, kubewatch.Informer{LW: w.lw, Type: &discoveryv1.EndpointSlice{}, Resync: w.cfg.Resync, Transform: trim,
		Update: w.update, Remove: w.remove, Synced: func() {
			w.standing.FirstSync()
			w.publish(true)
		}})
}

// State is the watch's current state.
func (w *Watch) State() State { return w.standing.State() }

// View is what the slices say now.
func (w *Watch) View() View {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := w.view
	v.InUse = slices.Clone(v.InUse)
	v.UDP = slices.Clone(v.UDP)
	v.Rejected = slices.Clone(v.Rejected)
	return v
}

// changed logs a change of state, one line each.
func (w *Watch) changed(old, now State, err error) {
	switch now {
	case kubewatch.Forbidden:
		w.log.Warn("kube-dns endpoints: the API server forbids listing endpointslices (RBAC: deploy/daemonset.yaml's Role); asking the ClusterIP until restarted", "err", err)
	case kubewatch.Lost:
		w.log.Warn("kube-dns endpoint watch lost: keeping the last known endpoints, the ClusterIP as fallback", "err", err)
	case kubewatch.Synced:
		v := w.View()
		if old == kubewatch.Starting {
			w.log.Info("kube-dns endpoint watch synced", "in_use", fmt.Sprint(v.InUse), "not_ready", v.NotReady, "over_max", v.OverMax)
		} else {
			w.log.Info("kube-dns endpoint watch recovered", "in_use", fmt.Sprint(v.InUse))
		}
	}
}

func (w *Watch) update(obj any) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	w.mu.Lock()
	others := 0
	for name, o := range w.slices {
		if name != s.Name {
			others += len(o.Endpoints)
		}
	}
	delete(w.dropped, s.Name)
	if room := max(maxStored-others, 0); len(s.Endpoints) > room {
		w.dropped[s.Name] = len(s.Endpoints) - room
		s.Endpoints = s.Endpoints[:room:room]
	}
	w.slices[s.Name] = s
	w.mu.Unlock()
	w.publish(false)
}

func (w *Watch) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	w.mu.Lock()
	delete(w.slices, s.Name)
	delete(w.dropped, s.Name)
	w.mu.Unlock()
	w.publish(false)
}

// publish recomputes the view and hands the endpoints in use to OnChange when they changed
// (and once the first list is in: always).
func (w *Watch) publish(synced bool) {
	w.mu.Lock()
	v := compute(w.slices, &w.cfg)
	for _, n := range w.dropped {
		v.OverMax += n
	}
	changed := !slices.Equal(v.InUse, w.view.InUse) || !slices.Equal(v.UDP, w.view.UDP)
	if v.NoPort > w.view.NoPort {
		w.log.Warn("kube-dns endpoints: a slice has no TCP port named dns-tcp (nor one TCP port, nor the Service's port): its endpoints are not used", "slices", v.NoPort)
	}
	if !slices.Equal(v.Rejected, w.view.Rejected) && len(v.Rejected) > 0 {
		w.log.Warn("kube-dns endpoints: never asking these (ours: a loop back into us; loopback, link-local, unspecified or multicast: no pod's)", "rejected", fmt.Sprint(v.Rejected))
	}
	w.view = v
	call := (changed || synced && !w.sent) && w.standing.EverSynced()
	if call {
		w.sent = true
	}
	w.mu.Unlock()
	if call && w.cfg.OnChange != nil {
		w.cfg.OnChange(slices.Clone(v.InUse))
	}
	if changed && w.standing.EverSynced() && !synced {
		w.log.Info("kube-dns endpoints changed", "in_use", fmt.Sprint(v.InUse), "not_ready", v.NotReady, "over_max", v.OverMax)
	}
}

// compute is the view of the slices for cfg.
func compute(ss map[string]*discoveryv1.EndpointSlice, cfg *Config) View {
	var v View
	ready := map[netip.AddrPort]bool{}
	notReady := map[netip.AddrPort]bool{}
	udp := map[netip.Addr]uint16{}
	rejected := map[netip.AddrPort]string{}
	for _, s := range ss {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 ||
			(s.AddressType == discoveryv1.AddressTypeIPv6) != cfg.IPv6 {
			continue
		}
		port, ok := slicePort(s.Ports, cfg.ServicePort)
		if !ok {
			v.NoPort++
			continue
		}
		udpPort, hasUDP := sliceUDPPort(s.Ports, cfg.ServicePort)
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || ip.Is6() != cfg.IPv6 || ip.Is4In6() {
					continue
				}
				ap := netip.AddrPortFrom(ip, port)
				if why := rejection(ap, cfg.Own); why != "" {
					rejected[ap] = why
					continue
				}
				if isReady(e.Conditions) {
					ready[ap] = true
					if hasUDP {
						udp[ip] = udpPort
					}
				} else {
					notReady[ap] = true
				}
			}
		}
	}
	for ap := range notReady {
		if !ready[ap] { // in two slices while it moves: ready in one is ready
			v.NotReady++
		}
	}
	for ap, why := range rejected {
		v.Rejected = append(v.Rejected, Rejected{ap, why})
	}
	slices.SortFunc(v.Rejected, func(a, b Rejected) int { return a.Addr.Compare(b.Addr) })
	all := make([]netip.AddrPort, 0, len(ready))
	for ap := range ready {
		all = append(all, ap)
	}
	if len(all) > cfg.Max {
		// Rendezvous hashing: each node keeps the Max endpoints that score highest for
		// it; an endpoint added or removed moves only its own place.
		score := func(ap netip.AddrPort) uint64 {
			h := fnv.New64a()
			h.Write([]byte(cfg.Node))
			h.Write([]byte{0})
			b, _ := ap.MarshalBinary()
			h.Write(b)
			return h.Sum64()
		}
		slices.SortFunc(all, func(a, b netip.AddrPort) int { return cmp.Compare(score(b), score(a)) })
		v.OverMax = len(all) - cfg.Max
		all = all[:cfg.Max]
	}
	slices.SortFunc(all, func(a, b netip.AddrPort) int { return a.Compare(b) })
	v.InUse = all
	for _, ap := range all {
		if p, ok := udp[ap.Addr()]; ok {
			v.UDP = append(v.UDP, netip.AddrPortFrom(ap.Addr(), p))
		}
	}
	return v
}

// sliceUDPPort is the UDP port of a slice's DNS: the one named dns, else
// the only UDP port, else the UDP port with the Service's number.
func sliceUDPPort(ports []discoveryv1.EndpointPort, servicePort uint16) (uint16, bool) {
	var udp []discoveryv1.EndpointPort
	for _, p := range ports {
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 || p.Protocol == nil || *p.Protocol != "UDP" {
			continue
		}
		if p.Name != nil && *p.Name == "dns" {
			return uint16(*p.Port), true
		}
		udp = append(udp, p)
	}
	if len(udp) == 1 {
		return uint16(*udp[0].Port), true
	}
	for _, p := range udp {
		if uint16(*p.Port) == servicePort {
			return servicePort, true
		}
	}
	return 0, false
}

// isReady: ready (nil is unknown, which the API says to read as ready) and not terminating.
func isReady(c discoveryv1.EndpointConditions) bool {
	return (c.Ready == nil || *c.Ready) && (c.Terminating == nil || !*c.Terminating)
}

// slicePort is the TCP port to ask: the one named dns-tcp, else the only TCP port, else the
// TCP port with the Service's number.
func slicePort(ports []discoveryv1.EndpointPort, servicePort uint16) (uint16, bool) {
	var tcp []discoveryv1.EndpointPort
	for _, p := range ports {
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 || p.Protocol != nil && *p.Protocol != "TCP" {
			continue
		}
		if p.Name != nil && *p.Name == dnsTCPPort {
			return uint16(*p.Port), true
		}
		tcp = append(tcp, p)
	}
	if len(tcp) == 1 {
		return uint16(*tcp[0].Port), true
	}
	for _, p := range tcp {
		if uint16(*p.Port) == servicePort {
			return servicePort, true
		}
	}
	return 0, false
}

// trim keeps what compute reads: the address type, the ports and, per endpoint, its addresses
// and conditions, within the API's bounds (1000 endpoints, 100 ports), so a slice costs a few
// hundred bytes per endpoint whatever else it carries (hostnames, zones, hints, node names).
func trim(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, UID: s.UID,
			ResourceVersion: s.ResourceVersion},
		AddressType: s.AddressType,
	}
	ports := s.Ports
	if len(ports) > maxSlicePorts {
		ports = ports[:maxSlicePorts]
	}
	out.Ports = slices.Clone(ports)
	eps := s.Endpoints
	if len(eps) > maxSliceEndpoints {
		eps = eps[:maxSliceEndpoints]
	}
	out.Endpoints = make([]discoveryv1.Endpoint, 0, len(eps))
	for _, e := range eps {
		addrs := e.Addresses
		if len(addrs) > 1 { // the API allows one address per endpoint
			addrs = addrs[:1]
		}
		out.Endpoints = append(out.Endpoints, discoveryv1.Endpoint{
			Addresses: slices.Clone(addrs), Conditions: e.Conditions,
		})
	}
	return out, nil
}

// note records the outcome of a list or watch call (kubewatch.Noting's
// Note); a Forbidden list before the first sync stops the watch.
func (w *Watch) note(err error) {
	if w.standing.Note(err) {
		if c := w.cancel.Load(); c != nil {
			(*c)()
		}
	}
}
