package autopath

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	lookups  prometheus.Counter
	answered prometheus.Counter
	saved    prometheus.Counter
	resolved prometheus.Counter
	declined *prometheus.CounterVec
	all      []prometheus.Collector
}

func newMetrics(a *Autopath) *metrics {
	const ns, sub = "nodelocaldns", "autopath"
	m := &metrics{
		lookups: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lookups_total",
			Help: "Lookups (pod, name) autopath decided to answer; its A and AAAA queries share the decision.",
		}),
		answered: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "answers_total",
			Help: "Queries answered by autopath (a CNAME to the candidate found).",
		}),
		saved: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "client_queries_saved_total",
			Help: "Search-path queries clients did not have to send because autopath answered.",
		}),
		resolved: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "candidates_resolved_total",
			Help: "Candidate names resolved (in the client's order, stopping where its walk would) to decide a lookup.",
		}),
		declined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "declined_total",
			Help: "Candidate queries answered as usual instead, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range Reasons {
		m.declined.WithLabelValues(r)
	}
	memo := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "memo_entries",
		Help: "Decisions kept so that the A and AAAA queries of a lookup agree.",
	}, func() float64 {
		a.mu.Lock()
		defer a.mu.Unlock()
		return float64(len(a.memo))
	})
	memoBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "memo_bytes",
		Help: "Bytes the decisions kept are counted for (bounded by the memo's budget).",
	}, func() float64 {
		a.mu.Lock()
		defer a.mu.Unlock()
		return float64(a.bytes)
	})
	m.all = []prometheus.Collector{m.lookups, m.answered, m.saved, m.resolved, m.declined, memo, memoBytes}
	return m
}

// Collectors are autopath's metrics, for the daemon's registry.
func (a *Autopath) Collectors() []prometheus.Collector { return a.metrics.all }
