package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// snapshotMetrics are the cache snapshot's (internal/snapshot, written by
// the daemon to the state directory, loaded after a crash).
type snapshotMetrics struct {
	loaded *prometheus.CounterVec
	writes *prometheus.CounterVec
	bytes  prometheus.Gauge
	size   prometheus.Gauge
	cpu    prometheus.Counter
}

// SnapshotLoadResults are the results of an entry read from the snapshot.
var SnapshotLoadResults = []string{"kept", "expired", "policy_changed", "not_kept", "invalid"}

func newSnapshotMetrics(r *prometheus.Registry) *snapshotMetrics {
	s := &snapshotMetrics{
		loaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "cache_snapshot_loaded_entries_total",
			Help: "Cache entries read at start from the snapshot a previous instance wrote (a start with no twin: after a crash), by result: kept, expired (past TTL and stale window), policy_changed (their block's policy is not this configuration's), not_kept (by the cache: capacity), invalid (not a well-formed answer).",
		}, []string{"result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "cache_snapshot_writes_total",
			Help: "Cache snapshots written to the state directory, by result: written, failed.",
		}, []string{"result"}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "cache_snapshot_bytes", Help: "Size of the last cache snapshot written (bytes).",
		}),
		size: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "cache_snapshot_entries", Help: "Entries in the last cache snapshot written.",
		}),
		cpu: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "cache_snapshot_write_cpu_seconds_total", Help: "CPU time (the writing thread's) spent writing cache snapshots.",
		}),
	}
	for _, res := range SnapshotLoadResults {
		s.loaded.WithLabelValues(res)
	}
	s.writes.WithLabelValues("written")
	s.writes.WithLabelValues("failed")
	r.MustRegister(s.loaded, s.writes, s.bytes, s.size, s.cpu)
	return s
}

// SnapshotLoaded counts the entries read from the cache snapshot at start,
// by result (SnapshotLoadResults).
func (m *Metrics) SnapshotLoaded(counts map[string]int) {
	for res, n := range counts {
		m.snapshot.loaded.WithLabelValues(res).Add(float64(n))
	}
}

// SnapshotWritten records a snapshot write: its size and entries, and the
// CPU it took; failed when it was not written.
func (m *Metrics) SnapshotWritten(entries int, bytes int64, cpu time.Duration, failed bool) {
	m.snapshot.cpu.Add(cpu.Seconds())
	if failed {
		m.snapshot.writes.WithLabelValues("failed").Inc()
		return
	}
	m.snapshot.writes.WithLabelValues("written").Inc()
	m.snapshot.bytes.Set(float64(bytes))
	m.snapshot.size.Set(float64(entries))
}
