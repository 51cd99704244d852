package endpoints

import "github.com/prometheus/client_golang/prometheus"

// EndpointStates are the values of nodelocaldns_kubedns_endpoints' state label.
var EndpointStates = []string{"in_use", "not_ready", "over_max", "rejected"}

// endpointGauges are nodelocaldns_kubedns_endpoints{state}; the watch's
// own standing (synced, errors, losses) is kubewatch.Standing's.
func endpointGauges(w *Watch) []prometheus.Collector {
	counts := map[string]func(View) int{
		"in_use":    func(v View) int { return len(v.InUse) },
		"not_ready": func(v View) int { return v.NotReady },
		"over_max":  func(v View) int { return v.OverMax },
		"rejected":  func(v View) int { return len(v.Rejected) },
	}
	var out []prometheus.Collector
	for _, st := range EndpointStates {
		f := counts[st]
		out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "nodelocaldns", Subsystem: "kubedns", Name: "endpoints",
			Help:        "kube-dns endpoints by state: in_use (asked directly), not_ready (not ready or terminating), over_max (ready, beyond the endpoints one node follows), rejected (never asked: one of our own listen sockets, loopback, link-local, unspecified or multicast).",
			ConstLabels: prometheus.Labels{"state": st},
		}, func() float64 { return float64(f(w.View())) }))
	}
	return out
}

// Collectors are the watch's metrics, for the daemon's registry.
func (w *Watch) Collectors() []prometheus.Collector { return w.collectors }
