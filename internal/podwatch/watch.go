package podwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/prometheus/client_golang/prometheus"
)

// State is the watch's standing with the API server (kubewatch's):
// Starting, Synced or Lost (the view may be stale: autopath is off until
// it recovers).
type State = kubewatch.State

// DefaultResync is how often the informer re-delivers every pod to the
// handler, recomputing its view from the stored objects (10 min: a safety
// net only; changes arrive by the watch within milliseconds).
const DefaultResync = 10 * time.Minute

// Config says which pods to watch and how to read their resolv.conf.
type Config struct {
	// Rest reaches the API server: rest.InClusterConfig() in a pod, a
	// config built from a token in tests.
	Rest *rest.Config
	// NodeName selects the pods (spec.nodeName).
	NodeName string
	// ClusterDomain is the kubelet's cluster domain ("cluster.local";
	// a trailing dot is ignored).
	ClusterDomain string
	// Node is the resolv.conf the kubelet gives pods (its --resolv-conf).
	Node NodeResolvConf
	// Resync: DefaultResync when 0.
	Resync time.Duration
	Logger *slog.Logger
}

// Watch keeps the view of this node's pods. Lookup is safe for concurrent
// use and takes no lock.
type Watch struct {
	cfg      Config
	log      *slog.Logger
	lw       cache.ListerWatcher
	view     atomic.Pointer[view]
	standing *kubewatch.Standing

	mu      sync.Mutex // entries
	entries map[string]podEntry

	collectors []prometheus.Collector
}

// New prepares a watch; Run starts it.
func New(cfg Config) (*Watch, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("podwatch: no node name (set -node-name or $NODE_NAME from the downward API)")
	}
	if cfg.Rest == nil {
		return nil, errors.New("podwatch: no API server config")
	}
	cfg.ClusterDomain = strings.ToLower(strings.TrimSuffix(cfg.ClusterDomain, "."))
	if cfg.ClusterDomain == "" {
		return nil, errors.New("podwatch: no cluster domain")
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rc, err := kubewatch.RESTClient(cfg.Rest, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, "nodelocaldns-podwatch")
	if err != nil {
		return nil, fmt.Errorf("podwatch: %w", err)
	}
	w := &Watch{cfg: cfg, log: cfg.Logger.With("component", "podwatch"), entries: map[string]podEntry{}}
	w.standing = kubewatch.NewStanding("autopath", "pod_watch", kubewatch.StandingHelp{
		Losses: "Times the pod watch went from synced to lost (autopath off until it recovers).",
		Errors: "Failed list or watch calls to the API server.",
		Synced: "1 when the pod watch follows the API server (autopath on), 0 while starting or lost.",
	})
	w.standing.Changed = w.changed
	w.collectors = append(w.standing.Collectors(), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "nodelocaldns", Subsystem: "autopath", Name: "pods",
		Help: "Pods of this node with an address of their own known to the pod watch.",
	}, func() float64 { return float64(w.Pods()) }))
	w.view.Store(buildView(nil))
	sel := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName)
	w.lw = &kubewatch.Noting{LW: cache.NewListWatchFromClient(rc, "pods", metav1.NamespaceAll, sel), Note: func(err error) { w.standing.Note(err) }}
	return w, nil
}

// Run watches until ctx ends.
func (w *Watch) Run(ctx context.Context) {
	kubewatch.Run(ctx, kubewatch.Informer{LW: w.lw, Type: &corev1.Pod{}, Resync: w.cfg.Resync, Transform: trim,
		Update: w.update, Remove: w.remove, Synced: w.standing.FirstSync})
}

// Lookup returns the pod holding ip and the watch state. A pod is returned
// whatever the state; the caller decides whether to trust it.
func (w *Watch) Lookup(ip netip.Addr) (*Pod, State) {
	p := w.view.Load().byIP[ip.Unmap()]
	return p, w.State()
}

// State is the watch's current state.
func (w *Watch) State() State { return w.standing.State() }

// Pods is the number of pods with an address of their own in the view.
func (w *Watch) Pods() int { return w.view.Load().pods }

// changed logs a change of state, one line each.
func (w *Watch) changed(old, now State, err error) {
	switch {
	case now == kubewatch.Lost && apierrors.IsForbidden(err):
		w.log.Warn("pod watch forbidden: autopath off until the service account may list and watch pods (kubectl apply -f deploy/autopath/rbac.yaml)", "node", w.cfg.NodeName, "err", err)
	case now == kubewatch.Lost:
		w.log.Warn("pod watch lost: autopath off until it recovers", "node", w.cfg.NodeName, "err", err)
	case old == kubewatch.Starting:
		w.log.Info("pod watch synced", "node", w.cfg.NodeName, "pods", w.Pods())
	default:
		w.log.Info("pod watch recovered: autopath on", "node", w.cfg.NodeName, "pods", w.Pods())
	}
}

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

func (w *Watch) update(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	pod, ips, ok := podFor(p, w.cfg.Node, w.cfg.ClusterDomain)
	w.mu.Lock()
	defer w.mu.Unlock()
	if ok {
		w.entries[key(p)] = podEntry{pod: pod, ips: ips}
	} else if _, had := w.entries[key(p)]; had {
		delete(w.entries, key(p))
	} else {
		return
	}
	w.view.Store(buildView(w.entries))
}

func (w *Watch) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, had := w.entries[key(p)]; !had {
		return
	}
	delete(w.entries, key(p))
	w.view.Store(buildView(w.entries))
}

// trim keeps only the fields the view reads, so the informer's store holds
// a few hundred bytes per pod instead of the whole object. Of dnsConfig it
// keeps the searches (the API server validates them: at most 32, 2048
// characters in all) and only the options autopath reads (ndots,
// no-tld-query); the API bounds neither the number of options nor their
// values, so those are dropped or cut (trimDNSConfig). With the API's own
// bounds on names (253), namespaces (63) and pod IPs (2), a pod is held in
// at most a few KiB, whatever it carries.
func trim(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	ips := p.Status.PodIPs
	if len(ips) > maxPodIPs {
		ips = ips[:maxPodIPs]
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		},
		Spec: corev1.PodSpec{
			NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork,
			DNSPolicy: p.Spec.DNSPolicy, DNSConfig: trimDNSConfig(p.Spec.DNSConfig),
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: slices.Clone(ips)},
	}, nil
}

// Bounds of what trim keeps.
const (
	// maxPodIPs: the API allows one per family.
	maxPodIPs = 2
	// maxSearches: the API allows 32 dnsConfig searches; more are cut
	// (an object the API server would not have stored).
	maxSearches = maxSearchPaths
	// maxOptionValue: an option value longer than this is kept as
	// "invalid": for ndots no number every resolver reads the same way
	// (the pod is ineligible either way), for no-tld-query not the bare
	// option either way.
	maxOptionValue = 8
)

// trimDNSConfig keeps what PodResolvConf and podFor read of c: the
// searches, and the last ndots and the no-tld-query options (in the order
// mergeOptions gives them). The result's size is bounded whatever c holds.
func trimDNSConfig(c *corev1.PodDNSConfig) *corev1.PodDNSConfig {
	if c == nil {
		return nil
	}
	out := &corev1.PodDNSConfig{}
	searches := c.Searches
	if len(searches) > maxSearches {
		searches = searches[:maxSearches]
	}
	for _, s := range searches {
		if len(s) > maxSearchDomainLen {
			// The API rejects it; the kubelet would drop it after taking
			// its 32: keep its slot, not all its bytes.
			s = s[:maxSearchDomainLen+1]
		}
		out.Searches = append(out.Searches, strings.Clone(s))
	}
	var ndots, noTLD *corev1.PodDNSConfigOption
	for i := range c.Options {
		o := &c.Options[i]
		switch o.Name {
		case "ndots":
			ndots = o
		case "no-tld-query", "no_tld_query":
			noTLD = o
		}
	}
	for _, o := range []*corev1.PodDNSConfigOption{ndots, noTLD} {
		if o == nil {
			continue
		}
		kept := corev1.PodDNSConfigOption{Name: o.Name}
		if o.Value != nil {
			val := *o.Value
			if len(val) > maxOptionValue {
				val = "invalid"
			}
			val = strings.Clone(val)
			kept.Value = &val
		}
		out.Options = append(out.Options, kept)
	}
	return out
}
