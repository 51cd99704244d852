package podwatch

import "github.com/prometheus/client_golang/prometheus"

type watchMetrics struct {
	losses prometheus.Counter
	errors prometheus.Counter
	all    []prometheus.Collector
}

func newWatchMetrics(w *Watch) *watchMetrics {
	m := &watchMetrics{
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nodelocaldns", Subsystem: "autopath", Name: "pod_watch_losses_total",
			Help: "Times the pod watch went from synced to lost (autopath off until it recovers).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nodelocaldns", Subsystem: "autopath", Name: "pod_watch_errors_total",
			Help: "Failed list or watch calls to the API server.",
		}),
	}
	pods := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "nodelocaldns", Subsystem: "autopath", Name: "pods",
		Help: "Pods of this node with an address of their own known to the pod watch.",
	}, func() float64 { return float64(w.Pods()) })
	synced := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "nodelocaldns", Subsystem: "autopath", Name: "pod_watch_synced",
		Help: "1 when the pod watch follows the API server (autopath on), 0 while starting or lost.",
	}, func() float64 {
		if w.State() == Synced {
			return 1
		}
		return 0
	})
	m.all = []prometheus.Collector{m.losses, m.errors, pods, synced}
	return m
}

// Collectors are the watch's metrics, for the daemon's registry.
func (w *Watch) Collectors() []prometheus.Collector { return w.metrics.all }
