package endpoints

import "github.com/prometheus/client_golang/prometheus"

type watchMetrics struct {
	losses prometheus.Counter
	errors prometheus.Counter
	all    []prometheus.Collector
}

// EndpointStates are the values of nodelocaldns_kubedns_endpoints' state label.
var EndpointStates = []string{"in_use", "not_ready", "over_max"}

func newWatchMetrics(w *Watch) *watchMetrics {
	m := &watchMetrics{
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nodelocaldns", Subsystem: "kubedns", Name: "endpoint_watch_losses_total",
			Help: "Times the kube-dns endpoint watch went from synced to lost (the last known endpoints stay in use).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nodelocaldns", Subsystem: "kubedns", Name: "endpoint_watch_errors_total",
			Help: "Failed list or watch calls for kube-dns' EndpointSlices.",
		}),
	}
	synced := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "nodelocaldns", Subsystem: "kubedns", Name: "endpoint_watch_synced",
		Help: "1 when the kube-dns endpoint watch follows the API server, 0 while starting, lost or forbidden.",
	}, func() float64 {
		if w.State() == Synced {
			return 1
		}
		return 0
	})
	counts := map[string]func(View) int{
		"in_use":    func(v View) int { return len(v.InUse) },
		"not_ready": func(v View) int { return v.NotReady },
		"over_max":  func(v View) int { return v.OverMax },
	}
	m.all = []prometheus.Collector{m.losses, m.errors, synced}
	for _, st := range EndpointStates {
		f := counts[st]
		m.all = append(m.all, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "nodelocaldns", Subsystem: "kubedns", Name: "endpoints",
			Help:        "kube-dns endpoints by state: in_use (asked directly), not_ready (not ready or terminating), over_max (ready, beyond the endpoints one node follows).",
			ConstLabels: prometheus.Labels{"state": st},
		}, func() float64 { return float64(f(w.View())) }))
	}
	return m
}

// Collectors are the watch's metrics, for the daemon's registry.
func (w *Watch) Collectors() []prometheus.Collector { return w.metrics.all }
