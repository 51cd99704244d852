// Package metrics defines every Prometheus collector of the daemon in one
// place and serves them, with /health and /ready, over HTTP.
//
// Nothing here is global: New builds a registry, and the packages that
// count things either expose snapshots (server, cache) read at scrape time
// or report through small observer interfaces implemented here (forward,
// netsetup). The hot path therefore never touches a Prometheus object.
package metrics

import (
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/trace"
)

const ns = "nodelocaldns"

// Metrics is the daemon's registry and the collectors that are updated by
// events rather than read from snapshots.
type Metrics struct {
	Registry *prometheus.Registry

	setupErrors *prometheus.CounterVec
	backend     *prometheus.GaugeVec
	httpErrors  *prometheus.CounterVec // http.go
	httpRejects *prometheus.CounterVec // httpconns.go
	httpEvicted *prometheus.CounterVec
	// handover: cache entries taken from a twin at start, kept or dropped.
	handover *prometheus.CounterVec
	// controlRefused: control socket peers that are no twin.
	controlRefused prometheus.Counter
	snapshot       *snapshotMetrics // snapshot.go

	upstreamDuration *prometheus.HistogramVec
	upstreamFailures *prometheus.CounterVec
	upstreamHealthy  *prometheus.GaugeVec
	upstreamConns    *prometheus.GaugeVec
	upstreamInflight *prometheus.GaugeVec

	// CoreDNS's names (coredns.go): the event-driven ones, and the
	// directives' counters (directives.go).
	cd         *cdMetrics
	Directives *Directives
	// stats gives the answer-side handlers' counters (SetHandlerStats).
	stats atomic.Pointer[func(key string) any]
}

// SetHandlerStats makes f where the answer-side handlers' counters are
// read (internal/running's State.Stats: trace's and dnstap's, kept for the
// daemon's life); before it is set they read 0.
func (m *Metrics) SetHandlerStats(f func(key string) any) { m.stats.Store(&f) }

// handlerStats is the handlers' value for key, nil when none.
func (m *Metrics) handlerStats(key string) any {
	if m == nil {
		return nil
	}
	if f := m.stats.Load(); f != nil {
		return (*f)(key)
	}
	return nil
}

// New registers every collector. srv and c may be nil (their metrics are
// then absent), e.g. for -check-config or tests.
func New(srv func() server.Counters, c *cache.Cache) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	r := m.Registry
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	version, revision := buildVersion()
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "build_info", Help: "Build information; always 1.",
	}, []string{"version", "revision", "goversion"})
	buildInfo.WithLabelValues(version, revision, goVersion()).Set(1)
	r.MustRegister(buildInfo)
	m.cd = newCDMetrics(r, version, revision)
	m.Directives = &Directives{}
	r.MustRegister(skippedCollector{m.Directives})

	m.setupErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "setup_errors_total", Help: "Errors setting up or checking the node: interface, iptables, configmap, resolvconf.",
	}, []string{"type"})
	// Every kind starts at 0 so alerts can use rate() from the first scrape.
	for _, k := range append(netsetup.SetupErrorKinds, KindResolvConf) {
		m.setupErrors.WithLabelValues(k)
	}
	m.backend = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "iptables_backend", Help: "The iptables backend in use (1 for the chosen one).",
	}, []string{"backend"})
	r.MustRegister(m.setupErrors, m.backend)
	m.httpErrors = newHTTPErrors(r)
	m.httpRejects, m.httpEvicted = newHTTPBounds(r)
	m.handover = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "cache_handover_entries_total",
		Help: "Cache entries a twin handed over at start (a rollout's old instance), by result: kept, or dropped (their block's policy changed, expired, not kept by the cache, or not a well-formed answer).",
	}, []string{"result"})
	m.handover.WithLabelValues("kept")
	m.handover.WithLabelValues("dropped")
	r.MustRegister(m.handover)
	m.controlRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "control_refused_total",
		Help: "Connections to the control socket refused: the peer runs as another uid, or in another network namespace (docs/design.md, \"Restarts and upgrades\").",
	})
	r.MustRegister(m.controlRefused)
	m.snapshot = newSnapshotMetrics(r)

	m.upstreamDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: "upstream", Name: "request_duration_seconds",
		Help: "Time from sending a query upstream to its answer, by upstream and rcode.",
		// 250 µs to ~4 s: node-local kube-dns answers in well under a
		// millisecond, internet resolvers in tens of milliseconds.
		Buckets: prometheus.ExponentialBuckets(0.00025, 2, 15),
	}, []string{"group", "upstream", "rcode"})
	m.upstreamFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "upstream", Name: "failures_total",
		Help: "Upstream tries that failed, by kind: timeout, refused, closed, malformed, mismatch, network, overloaded.",
	}, []string{"group", "upstream", "kind"})
	m.upstreamHealthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: "upstream", Name: "healthy", Help: "1 when the upstream is considered up.",
	}, []string{"group", "upstream"})
	m.upstreamConns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: "upstream", Name: "open_connections", Help: "Open TCP connections to the upstream.",
	}, []string{"group", "upstream"})
	m.upstreamInflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: "upstream", Name: "inflight_queries", Help: "Queries awaiting an upstream answer, by group.",
	}, []string{"group"})
	r.MustRegister(m.upstreamDuration, m.upstreamFailures, m.upstreamHealthy, m.upstreamConns, m.upstreamInflight)

	// The Corefile's trace (internal/trace): its exporters' counts, their
	// owner's (SetHandlerStats), read at scrape time.
	for _, rc := range []struct {
		result string
		n      func(*trace.Stats) *atomic.Uint64
	}{
		{"sent", func(s *trace.Stats) *atomic.Uint64 { return &s.Sent }},
		{"dropped_backlog", func(s *trace.Stats) *atomic.Uint64 { return &s.DroppedBacklog }},
		{"dropped_send", func(s *trace.Stats) *atomic.Uint64 { return &s.DroppedSend }},
	} {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Name: "trace_spans_total", ConstLabels: prometheus.Labels{"result": rc.result},
			Help: "Spans of the Corefile's trace, by result: sent (the collector accepted them), dropped_backlog (the backlog was full: the collector slower than the traced queries, or gone), dropped_send (the collector refused them or could not be reached).",
		}, func() float64 {
			if st, _ := m.handlerStats("trace").(*trace.Stats); st != nil {
				return float64(rc.n(st).Load())
			}
			return 0
		}))
	}

	if srv != nil || c != nil {
		r.MustRegister(&snapshotCollector{m: m, srv: srv, cache: c})
	}
	return m
}

// KindResolvConf is the setup error of an unusable node resolv.conf (the
// last good nameservers are kept). Ours only: node-cache has no such kind,
// so coredns_nodecache_setup_errors_total does not get it.
const KindResolvConf = "resolvconf"

// ResolvConfError counts an unusable resolv.conf.
func (m *Metrics) ResolvConfError() { m.setupErrors.WithLabelValues(KindResolvConf).Inc() }

// SetupError counts a node setup error (netsetup.Observer).
func (m *Metrics) SetupError(kind string) {
	m.setupErrors.WithLabelValues(kind).Inc()
	m.cd.setupErrors.WithLabelValues(kind).Inc()
}

// CoreDNS registers the per-query and cache series under CoreDNS's names
// (coredns.go). Call it once; without it only the event-driven coredns_*
// series are served.
func (m *Metrics) CoreDNS(cfg CoreDNSConfig) {
	m.Registry.MustRegister(&cdCollector{cfg: cfg, dir: m.Directives})
}

// ControlRefused counts a connection to the control socket from a peer
// that is no twin (statedir.CheckPeer).
func (m *Metrics) ControlRefused() { m.controlRefused.Inc() }

// CacheHandover counts the entries a twin handed over.
func (m *Metrics) CacheHandover(kept, dropped int) {
	m.handover.WithLabelValues("kept").Add(float64(kept))
	m.handover.WithLabelValues("dropped").Add(float64(dropped))
}

// Backend records the chosen iptables backend (netsetup.Observer).
func (m *Metrics) Backend(name string) {
	m.backend.Reset()
	m.backend.WithLabelValues(name).Set(1)
}

// Exchange records an upstream answer (forward.Observer).
func (m *Metrics) Exchange(group, upstream string, rcode int, d time.Duration) {
	m.upstreamDuration.WithLabelValues(group, upstream, server.RcodeLabel(rcode)).Observe(d.Seconds())
	m.cd.exchange(upstream, rcode, d)
}

// Failure counts a failed upstream try (forward.Observer).
func (m *Metrics) Failure(group, upstream, kind string) {
	m.upstreamFailures.WithLabelValues(group, upstream, kind).Inc()
	m.cd.failure(kind)
}

// Health records an upstream's health (forward.Observer).
func (m *Metrics) Health(group, upstream string, healthy bool) {
	v := 0.0
	if healthy {
		v = 1
	}
	m.upstreamHealthy.WithLabelValues(group, upstream).Set(v)
	m.cd.health(group, upstream, healthy)
}

// Conns moves the open-connections gauge (forward.Observer).
func (m *Metrics) Conns(group, upstream string, delta int) {
	m.upstreamConns.WithLabelValues(group, upstream).Add(float64(delta))
	m.cd.conns(upstream, delta)
}

// SocketUse counts a query sent over an already open upstream socket (a
// connection cache hit) or one that opened a socket (a miss), as CoreDNS's
// forward does for its UDP sockets (forward.Observer).
func (m *Metrics) SocketUse(group, upstream, proto string, reused bool) {
	m.cd.socketUse(upstream, proto, reused)
}

// Removed forgets an upstream that left its group for good: a kube-dns pod no longer followed
// (forward.Remover). Its series go, so the label set stays the endpoints in use, not every pod
// address seen since the start.
func (m *Metrics) Removed(group, upstream string) {
	l := prometheus.Labels{"group": group, "upstream": upstream}
	m.upstreamDuration.DeletePartialMatch(l)
	m.upstreamFailures.DeletePartialMatch(l)
	m.upstreamHealthy.Delete(l)
	m.upstreamConns.Delete(l)
	m.cd.removed(group, upstream)
}

// Inflight moves the in-flight gauge (forward.Observer).
func (m *Metrics) Inflight(group string, delta int) {
	m.upstreamInflight.WithLabelValues(group).Add(float64(delta))
}

// snapshotCollector reads the server's and the cache's counters at scrape
// time, so the serving path only increments plain atomics.
type snapshotCollector struct {
	m     *Metrics
	srv   func() server.Counters
	cache *cache.Cache
}

var (
	descRequests  = prometheus.NewDesc(ns+"_requests_total", "DNS queries received, by transport.", []string{"proto"}, nil)
	descResponses = prometheus.NewDesc(ns+"_responses_total", "DNS answers sent, by rcode.", []string{"rcode"}, nil)
	descMalformed = prometheus.NewDesc(ns+"_malformed_queries_total", "Queries answered FORMERR, NOTIMP or BADVERS.", nil, nil)
	descDropped   = prometheus.NewDesc(ns+"_dropped_queries_total", "Messages dropped unanswered (unreadable header, or a response).", nil, nil)
	descRejected  = prometheus.NewDesc(ns+"_admission_rejects_total", "Misses not admitted (-max-inflight questions in flight, the per-question or the total waiter bound) and without a stale answer: SERVFAIL at once. Part of cache_misses_total.", nil, nil)
	descCoalesced = prometheus.NewDesc(ns+"_coalesced_queries_total", "Misses that waited for another client's identical upstream query.", nil, nil)
	descFwdErrors = prometheus.NewDesc(ns+"_forward_errors_total", "Upstream fetches that failed or returned an unusable answer.", nil, nil)
	descHealth    = prometheus.NewDesc(ns+"_health_queries_total", "Queries for the health name, answered by the server itself; neither hits nor misses.", nil, nil)
	descReflector = prometheus.NewDesc(ns+"_reflector_drops_total", "UDP queries from a reflector source port (0, 7, 13, 17, 19, 37) dropped unanswered; also in dropped_queries_total.", nil, nil)
	descTCPConns  = prometheus.NewDesc(ns+"_tcp_connections", "Open client TCP connections.", nil, nil)
	descTCPRef    = prometheus.NewDesc(ns+"_tcp_refused_total", "Client TCP connections closed at once: -max-tcp-conns open and none of them idle to close instead.", nil, nil)
	descShare     = prometheus.NewDesc(ns+"_client_share_rejects_total", "Requests refused because their client (its source address; loopback and the node's addresses are the node, by source port) held its share of a bound while only the bound's reserve was free, or held some while only the newcomers' part was, by bound: inflight (a new question: stale answer or SERVFAIL), waiting (a miss: stale answer or SERVFAIL), tcp (a new connection, none of the client's own idle to close).", []string{"bound"}, nil)
	descTCPEvict  = prometheus.NewDesc(ns+"_tcp_evicted_total", "Client TCP connections idle, or sitting on a partial query for half a second, closed to make room for a new one (the client's own longest-waiting one, else the heaviest client's, else the longest-waiting of all in its pool).", nil, nil)
	descTCPDrop   = prometheus.NewDesc(ns+"_tcp_answer_drops_total", "Answers to misses dropped, and their client TCP connections closed, because the answers waiting to be written to TCP clients (each with its request and buffers) would pass 8 MiB (server.MaxTCPAnswerBytes) or their client's share of it: a client that does not read its answers.", nil, nil)
	descTCPBig    = prometheus.NewDesc(ns+"_tcp_oversized_total", "Client TCP connections closed because a query announced more than 2048 bytes (server.MaxTCPQuery), before its bytes were read.", nil, nil)
	descHits      = prometheus.NewDesc(ns+"_cache_hits_total", "Queries answered from the cache, by entry type; type=stale counts answers served stale (RFC 8767), which are not misses. hits + misses is every query that reached the cache.", []string{"type"}, nil)
	descPrefetch  = prometheus.NewDesc(ns+"_cache_prefetches_total", "Popular entries refreshed in the background before they expired.", nil, nil)
	descTCPQueued = prometheus.NewDesc(ns+"_tcp_answers_pending_bytes", "What the answers to misses waiting to be written to TCP clients hold (each with its request and buffers), as the bound on them (8 MiB, server.MaxTCPAnswerBytes) counts it.", nil, nil)
	descPFSkip    = prometheus.NewDesc(ns+"_cache_prefetches_skipped_total", "Prefetches not started: the prefetches' share of the flight bound was held (a share, never the reserve), or the question's last prefetch did not answer within the client timeout and nothing answered it since.", nil, nil)
	descLKGServed = prometheus.NewDesc(ns+"_cache_last_known_good_served_total", "Answers served from a last good answer that prefer_positive kept over a refresh that did not answer the question (NXDOMAIN, NODATA, empty, referral), by zone of the policy.", []string{"zone"}, nil)
	descLKGKept   = prometheus.NewDesc(ns+"_cache_last_known_good_kept_total", "Refreshes that did not answer the question and did not replace the last good answer (prefer_positive), by zone of the policy.", []string{"zone"}, nil)
	descMisses    = prometheus.NewDesc(ns+"_cache_misses_total", "Queries the cache could not answer: they waited for the upstream (or were not admitted). A stale answer is not a miss; health checks are neither.", nil, nil)
	descInserts   = prometheus.NewDesc(ns+"_cache_inserts_total", "Answers stored in the cache.", nil, nil)
	descEvictions = prometheus.NewDesc(ns+"_cache_evictions_total", "Entries evicted to stay within capacity or the byte budget.", nil, nil)
	descEntries   = prometheus.NewDesc(ns+"_cache_entries", "Entries in the cache, by type.", []string{"type"}, nil)
	descBytes     = prometheus.NewDesc(ns+"_cache_bytes", "Memory accounted to cache entries.", nil, nil)
	descTapSent   = prometheus.NewDesc(ns+"_dnstap_sent_total", "dnstap messages written to the collectors of the Corefile's dnstap directives.", nil, nil)
	descTapDrop   = prometheus.NewDesc(ns+"_dnstap_dropped_total", "dnstap messages dropped: the queue full (a slow collector), no collector connected, or a write that failed.", nil, nil)
	descPanics    = prometheus.NewDesc(ns+"_panics_recovered_total", "Panics recovered while serving, by where: udp and tcp (a query answered from the cache), miss (a miss started, answered or delivered), resolve (an upstream's answer built and cached), upstream (an upstream's reader). The query got SERVFAIL (or its connection closed) and serving went on; each is logged (one line per place per 10 s): a bug to report.", []string{"where"}, nil)
)

func (s *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRequests, descResponses, descMalformed, descDropped, descRejected,
		descCoalesced, descFwdErrors, descTCPConns, descTCPRef, descHits, descMisses, descInserts, descEvictions,
		descEntries, descBytes, descPrefetch, descLKGServed, descLKGKept, descHealth, descReflector, descShare, descTCPEvict, descTCPBig, descTCPDrop, descTCPQueued, descPFSkip, descTapSent, descTapDrop, descPanics} {
		ch <- d
	}
}

func (s *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	if s.srv != nil {
		c := s.srv()
		counter(descRequests, c.RequestsUDP, "udp")
		counter(descRequests, c.RequestsTCP, "tcp")
		for i, v := range c.Responses {
			if v > 0 || i <= 5 {
				counter(descResponses, v, server.RcodeLabel(i))
			}
		}
		counter(descMalformed, c.Malformed)
		counter(descDropped, c.Dropped)
		counter(descRejected, c.Rejected)
		counter(descCoalesced, c.Coalesced)
		counter(descFwdErrors, c.UpstreamErrors)
		gauge(descTCPConns, c.TCPConns)
		counter(descTCPRef, c.TCPRefused)
		counter(descShare, c.ShareRejectsFlights, "inflight")
		counter(descShare, c.ShareRejectsWaiting, "waiting")
		counter(descShare, c.ShareRejectsTCP, "tcp")
		counter(descTCPEvict, c.TCPEvicted)
		counter(descTCPBig, c.TCPOversized)
		counter(descTCPDrop, c.TCPAnswerDrops)
		counter(descPFSkip, c.PrefetchSkipped)
		gauge(descTCPQueued, c.TCPAnswerBytes)
		counter(descHits, c.StaleServed, "stale")
		counter(descMisses, c.CacheMisses)
		counter(descHealth, c.HealthChecks)
		counter(descReflector, c.ReflectorDrops)
	}
	var sent, dropped uint64
	if t, _ := s.m.handlerStats("dnstap").(*dnstap.Totals); t != nil {
		sent, dropped = t.Sent.Load(), t.Dropped.Load()
	}
	counter(descTapSent, sent)
	counter(descTapDrop, dropped)
	for i, n := range panics.Counts() {
		counter(descPanics, n, panics.Wheres[i])
	}
	if s.cache != nil {
		st := s.cache.Stats()
		for _, k := range cache.Kinds() {
			counter(descHits, st.Hits[k], k.String())
			gauge(descEntries, st.Entries[k], k.String())
		}
		counter(descPrefetch, st.Prefetches)
		for _, z := range cache.LastKnownGoodStats() {
			counter(descLKGServed, z.Served, z.Zone)
			counter(descLKGKept, z.Kept, z.Zone)
		}
		counter(descInserts, st.Inserts)
		counter(descEvictions, st.Evictions)
		gauge(descBytes, st.Bytes)
	}
}

func buildVersion() (version, revision string) {
	version, revision = "devel", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}
