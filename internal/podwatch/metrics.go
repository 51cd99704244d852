package podwatch

import "github.com/prometheus/client_golang/prometheus"

// Collectors are the watch's metrics, for the daemon's registry: its
// standing (kubewatch.Standing: synced, errors, losses) and the pods known.
func (w *Watch) Collectors() []prometheus.Collector { return w.collectors }
