package metrics

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
)

// CoreDNS's metric names, label names, label meanings, buckets and help
// texts (CoreDNS 1.15: plugin/metrics/vars, plugin/cache, plugin/pkg/proxy,
// plugin/forward, plugin/health, plugin/reload, plugin/hosts,
// plugin/template, plugin/dns64; node-cache's coredns_nodecache_*), served
// beside ours so the dashboards and alerts written for node-local-dns work
// unchanged. The per-query series are summed at scrape time from the
// server's plain counters (server.CDSnapshot); the rest are updated by
// rare events. docs/metrics.md says what each series counts here.

const cdNS = "coredns"

// CDBlock is one Corefile server block as CoreDNS's metrics see it.
type CDBlock struct {
	Zones []string // lower-case FQDNs
	// Plugins: the block's directives in CoreDNS's execution order; the
	// handlers among them are coredns_plugin_enabled.
	Plugins []string
	// Prometheus: the block has a prometheus directive, so its queries
	// are counted (CoreDNS counts only those).
	Prometheus bool
}

// CoreDNSConfig wires the coredns_* series. Nil functions leave their
// series out (-check-config, tests).
type CoreDNSConfig struct {
	Blocks []CDBlock
	// Servers returns CoreDNS's server labels ("dns://169.254.20.10:53"),
	// one per listen address; Snapshot the per-query counters.
	Servers  func() []string
	Snapshot func() []server.CDBlock
	// Cache is the daemon's one cache. Without CacheBlocks (or when it
	// returns nil) its entries, prefetches and evictions are reported
	// once, under the first server and CacheZones. With them (a Corefile),
	// per block as CoreDNS has one cache per block: CacheBlocks()[t-1] is
	// the block of the entries of cache.Policy.Tag t (the Corefile applied
	// now).
	Cache       *cache.Cache
	CacheZones  string
	CacheBlocks func() []CacheBlock
}

// CacheBlock is one Corefile block's cache as CoreDNS labels its series.
type CacheBlock struct {
	// Server is the index, in Servers(), of the first listen address the
	// block serves: its series are shown there once (CoreDNS labels each
	// update with the server of the query that caused it; one series per
	// block keeps sums over server exact). -1: the block is seen from no
	// address.
	Server int
	// Zones is CoreDNS's zones label: the block's zones joined by ",".
	Zones string
	// Cache: the block has a cache directive (else no series, as CoreDNS
	// without the cache plugin).
	Cache bool
}

// nonHandlers are the directives CoreDNS runs at setup only: they are no
// coredns_plugin_enabled series (as a CoreDNS 1.15 scrape shows).
var nonHandlers = []string{"bind", "reload", "health", "ready", "pprof", "debug", "root", "tls"}

// PluginLabel is the plugin label CoreDNS gives the answers of a block:
// the handler that follows prometheus in its chain ("errors" in the stock
// node-local-dns Corefile); "" when none does.
func PluginLabel(plugins []string) string {
	i := slices.Index(plugins, "prometheus")
	if i < 0 {
		return ""
	}
	for _, p := range plugins[i+1:] {
		if !slices.Contains(nonHandlers, p) {
			return p
		}
	}
	return ""
}

// cdMetrics are the event-driven coredns_* collectors.
type cdMetrics struct {
	proxyDuration  *prometheus.HistogramVec
	proxyHCFail    *prometheus.CounterVec
	connHits       *prometheus.CounterVec
	connMisses     *prometheus.CounterVec
	hcBroken       prometheus.Counter
	maxConcurrent  prometheus.Counter
	healthDuration prometheus.Histogram
	healthFailures prometheus.Counter
	panics         prometheus.CounterFunc
	reloadFailed   prometheus.Counter
	setupErrors    *prometheus.CounterVec

	mu      sync.Mutex
	healthy map[string]map[string]bool // group -> upstream -> up
	hasConn map[string]bool            // upstreams with a TCP connection opened
}

// cdTimeBuckets: CoreDNS's plugin.TimeBuckets; cdSlimTimeBuckets:
// plugin.SlimTimeBuckets (the health plugin's).
var (
	cdTimeBuckets     = server.CDTimeBuckets[:]
	cdSlimTimeBuckets = prometheus.ExponentialBuckets(0.00025, 10, 5)
)

func newCDMetrics(r *prometheus.Registry, version, revision string) *cdMetrics {
	c := &cdMetrics{healthy: map[string]map[string]bool{}, hasConn: map[string]bool{}}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: cdNS, Name: "build_info",
		Help: "A metric with a constant '1' value labeled by version, revision, and goversion from which CoreDNS was built.",
	}, []string{"version", "revision", "goversion"})
	buildInfo.WithLabelValues(version, revision, goVersion()).Set(1)
	c.proxyDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: cdNS, Subsystem: "proxy", Name: "request_duration_seconds",
		Buckets: cdTimeBuckets, Help: "Histogram of the time each request took.",
	}, []string{"proxy_name", "to", "rcode"})
	c.proxyHCFail = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "proxy", Name: "healthcheck_failures_total",
		Help: "Counter of the number of failed healthchecks.",
	}, []string{"proxy_name", "to"})
	c.connHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "proxy", Name: "conn_cache_hits_total",
		Help: "Counter of connection cache hits per upstream and protocol.",
	}, []string{"proxy_name", "to", "proto"})
	c.connMisses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "proxy", Name: "conn_cache_misses_total",
		Help: "Counter of connection cache misses per upstream and protocol.",
	}, []string{"proxy_name", "to", "proto"})
	c.hcBroken = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "forward", Name: "healthcheck_broken_total",
		Help: "Counter of the number of complete failures of the healthchecks.",
	})
	c.maxConcurrent = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "forward", Name: "max_concurrent_rejects_total",
		Help: "Counter of the number of queries rejected because the concurrent queries were at maximum.",
	})
	c.healthDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: cdNS, Subsystem: "health", Name: "request_duration_seconds",
		Buckets: cdSlimTimeBuckets, Help: "Histogram of the time (in seconds) each request took.",
	})
	c.healthFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "health", Name: "request_failures_total",
		Help: "The number of times the health check failed.",
	})
	// CoreDNS counts the panics its server recovers: ours are
	// internal/panics' (nodelocaldns_panics_recovered_total by place).
	c.panics = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: cdNS, Name: "panics_total", Help: "A metrics that counts the number of panics.",
	}, func() float64 {
		var n uint64
		for _, c := range panics.Counts() {
			n += c
		}
		return float64(n)
	})
	c.reloadFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "reload", Name: "failed_total",
		Help: "Counter of the number of failed reload attempts.",
	})
	c.setupErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: cdNS, Subsystem: "nodecache", Name: "setup_errors_total",
		Help: "The number of errors during periodic network setup for node-cache",
	}, []string{"errortype"})
	for _, k := range netsetup.SetupErrorKinds {
		c.setupErrors.WithLabelValues(k)
	}
	r.MustRegister(buildInfo, c.proxyDuration, c.proxyHCFail, c.connHits, c.connMisses, c.hcBroken,
		c.maxConcurrent, c.healthDuration, c.healthFailures, c.panics, c.reloadFailed, c.setupErrors)
	return c
}

// proxyName is CoreDNS's proxy_name: every upstream group is a forward.
const proxyName = "forward"

func (c *cdMetrics) exchange(upstream string, rcode int, d time.Duration) {
	c.proxyDuration.WithLabelValues(proxyName, upstream, cdRcode(rcode)).Observe(d.Seconds())
	c.mu.Lock()
	tcp := c.hasConn[upstream]
	c.mu.Unlock()
	if tcp {
		// An answer over the group's open TCP connection: the connection
		// was reused (a miss is counted when one opens, conns).
		c.connHits.WithLabelValues(proxyName, upstream, "tcp").Inc()
	}
}

func (c *cdMetrics) failure(kind string) {
	if kind == "overloaded" {
		c.maxConcurrent.Inc()
	}
}

func (c *cdMetrics) health(group, upstream string, up bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.healthy[group]
	if g == nil {
		g = map[string]bool{}
		c.healthy[group] = g
	}
	was, known := g[upstream]
	g[upstream] = up
	if up || (known && !was) {
		return
	}
	c.proxyHCFail.WithLabelValues(proxyName, upstream).Inc()
	for _, h := range g {
		if h {
			return
		}
	}
	c.hcBroken.Inc() // the last healthy upstream of the group went down
}

// removed forgets an upstream that left its group (Metrics.Removed).
func (c *cdMetrics) removed(group, upstream string) {
	l := prometheus.Labels{"to": upstream}
	c.proxyDuration.DeletePartialMatch(l)
	c.proxyHCFail.DeletePartialMatch(l)
	c.connHits.DeletePartialMatch(l)
	c.connMisses.DeletePartialMatch(l)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.healthy[group], upstream)
	delete(c.hasConn, upstream)
}

func (c *cdMetrics) conns(upstream string, delta int) {
	if delta <= 0 {
		return
	}
	c.mu.Lock()
	c.hasConn[upstream] = true
	c.mu.Unlock()
	c.connMisses.WithLabelValues(proxyName, upstream, "tcp").Inc()
}

// socketUse counts a query over an open socket (hit) or one that opened a
// socket (miss): CoreDNS's proxy Transport.Dial, which counts one or the
// other for every query it sends, UDP included.
func (c *cdMetrics) socketUse(upstream, proto string, reused bool) {
	if reused {
		c.connHits.WithLabelValues(proxyName, upstream, proto).Inc()
		return
	}
	c.connMisses.WithLabelValues(proxyName, upstream, proto).Inc()
}

// timedHealth is CoreDNS's health plugin's accounting of its /health
// checks: their duration, and the ones that failed.
func (c *cdMetrics) timedHealth(p Probe) Probe {
	if p == nil {
		return nil
	}
	return func(ctx context.Context) error {
		t := time.Now()
		err := p(ctx)
		c.healthDuration.Observe(time.Since(t).Seconds())
		if err != nil {
			c.healthFailures.Inc()
		}
		return err
	}
}

// cdRcode is CoreDNS's rcode label (miekg/dns RcodeToString, "RCODE<n>"
// for the unnamed).
func cdRcode(rc int) string {
	names := [...]string{"NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED",
		"YXDOMAIN", "YXRRSET", "NXRRSET", "NOTAUTH", "NOTZONE", "DSOTYPENI", "RCODE12", "RCODE13",
		"RCODE14", "RCODE15", "BADSIG", "BADKEY", "BADTIME", "BADMODE", "BADNAME", "BADALG", "BADTRUNC", "BADCOOKIE"}
	if rc >= 0 && rc < len(names) {
		return names[rc]
	}
	return "RCODE" + strconv.Itoa(rc)
}

// ReloadFailed counts a Corefile change that was rejected
// (coredns_reload_failed_total).
func (m *Metrics) ReloadFailed() { m.cd.reloadFailed.Inc() }

// cdCollector reads the per-query counters and the cache at scrape time.
type cdCollector struct {
	cfg CoreDNSConfig
	dir *Directives
}

var (
	cdLabels          = []string{"server", "zone", "view"}
	descCDRequests    = prometheus.NewDesc(cdNS+"_dns_requests_total", "Counter of DNS requests made per zone, protocol and family.", []string{"server", "zone", "view", "proto", "family", "type"}, nil)
	descCDDuration    = prometheus.NewDesc(cdNS+"_dns_request_duration_seconds", "Histogram of the time (in seconds) each request took per zone.", cdLabels, nil)
	descCDReqSize     = prometheus.NewDesc(cdNS+"_dns_request_size_bytes", "Size of the EDNS0 UDP buffer in bytes (64K for TCP) per zone and protocol.", []string{"server", "zone", "view", "proto"}, nil)
	descCDRespSize    = prometheus.NewDesc(cdNS+"_dns_response_size_bytes", "Size of the returned response in bytes.", []string{"server", "zone", "view", "proto"}, nil)
	descCDDo          = prometheus.NewDesc(cdNS+"_dns_do_requests_total", "Counter of DNS requests with DO bit set per zone.", cdLabels, nil)
	descCDResponses   = prometheus.NewDesc(cdNS+"_dns_responses_total", "Counter of response status codes.", []string{"server", "zone", "view", "rcode", "plugin"}, nil)
	descCDPlugin      = prometheus.NewDesc(cdNS+"_plugin_enabled", "A metric that indicates whether a plugin is enabled on per server and zone basis.", []string{"server", "zone", "view", "name"}, nil)
	cdCacheLabels     = []string{"server", "zones", "view"}
	cdCacheTypeLabels = []string{"server", "type", "zones", "view"}
	descCDEntries     = prometheus.NewDesc(cdNS+"_cache_entries", "The number of elements in the cache.", cdCacheTypeLabels, nil)
	descCDRequestsC   = prometheus.NewDesc(cdNS+"_cache_requests_total", "The count of cache requests.", cdCacheLabels, nil)
	descCDHits        = prometheus.NewDesc(cdNS+"_cache_hits_total", "The count of cache hits.", cdCacheTypeLabels, nil)
	descCDMisses      = prometheus.NewDesc(cdNS+"_cache_misses_total", "The count of cache misses. Deprecated, derive misses from cache hits/requests counters.", cdCacheLabels, nil)
	descCDPrefetch    = prometheus.NewDesc(cdNS+"_cache_prefetch_total", "The number of times the cache has prefetched a cached item.", cdCacheLabels, nil)
	descCDStale       = prometheus.NewDesc(cdNS+"_cache_served_stale_total", "The number of requests served from stale cache entries.", cdCacheLabels, nil)
	descCDEvictions   = prometheus.NewDesc(cdNS+"_cache_evictions_total", "The count of cache evictions.", cdCacheTypeLabels, nil)
)

func (c *cdCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCDRequests, descCDDuration, descCDReqSize, descCDRespSize, descCDDo,
		descCDResponses, descCDPlugin, descCDEntries, descCDRequestsC, descCDHits, descCDMisses, descCDPrefetch,
		descCDStale, descCDEvictions} {
		ch <- d
	}
	c.dir.describe(ch)
}

func (c *cdCollector) Collect(ch chan<- prometheus.Metric) {
	var servers []string
	if c.cfg.Servers != nil {
		servers = c.cfg.Servers()
	}
	c.collectPlugins(ch, servers)
	if c.cfg.Snapshot != nil {
		for _, b := range c.cfg.Snapshot() {
			collectBlock(ch, &b)
		}
	}
	c.collectCache(ch, servers)
	c.dir.collect(ch, servers)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

// collectPlugins is coredns_plugin_enabled of every block with prometheus,
// on every server.
func (c *cdCollector) collectPlugins(ch chan<- prometheus.Metric, servers []string) {
	for _, srv := range servers {
		for _, b := range c.cfg.Blocks {
			if !b.Prometheus {
				continue // CoreDNS's prometheus plugin lists its own block's plugins only
			}
			for _, z := range b.Zones {
				for _, p := range b.Plugins {
					if !slices.Contains(nonHandlers, p) {
						ch <- prometheus.MustNewConstMetric(descCDPlugin, prometheus.GaugeValue, 1, srv, z, "", p)
					}
				}
			}
		}
	}
}

// collectBlock is the coredns_dns_* and coredns_cache_* series of one
// (server, zone) block's cells.
func collectBlock(ch chan<- prometheus.Metric, b *server.CDBlock) {
	var n uint64
	for p, proto := range [2]string{"udp", "tcp"} {
		for f, fam := range [2]string{"1", "2"} {
			for t, typ := range server.CDTypes {
				if v := b.Requests[p][f][t]; v > 0 {
					counter(ch, descCDRequests, v, b.Server, b.Zone, "", proto, fam, typ)
					n += v
				}
			}
		}
		if cnt := sumU(b.ReqSize[p][:]); cnt > 0 {
			ch <- prometheus.MustNewConstHistogram(descCDReqSize, cnt, float64(b.ReqSizeSum[p]), cumulative(b.ReqSize[p][:], server.CDSizeBuckets[:]), b.Server, b.Zone, "", proto)
		}
		if cnt := sumU(b.RespSize[p][:]); cnt > 0 {
			ch <- prometheus.MustNewConstHistogram(descCDRespSize, cnt, float64(b.RespSizeSum[p]), cumulative(b.RespSize[p][:], server.CDSizeBuckets[:]), b.Server, b.Zone, "", proto)
		}
	}
	if cnt := sumU(b.Duration[:]); cnt > 0 {
		ch <- prometheus.MustNewConstHistogram(descCDDuration, cnt, float64(b.DurationSum)/1e9, cumulative(b.Duration[:], server.CDTimeBuckets[:]), b.Server, b.Zone, "")
	}
	if b.DO > 0 {
		counter(ch, descCDDo, b.DO, b.Server, b.Zone, "")
	}
	for rc, v := range b.Responses {
		if v[0] > 0 {
			counter(ch, descCDResponses, v[0], b.Server, b.Zone, "", cdRcode(rc), b.Plugin)
		}
		if v[1] > 0 {
			counter(ch, descCDResponses, v[1], b.Server, b.Zone, "", cdRcode(rc), "")
		}
	}
	if b.Zone == server.CDDropped || n == 0 {
		return
	}
	if req := b.HitsSuccess + b.HitsDenial + b.CacheMisses; req > 0 {
		counter(ch, descCDRequestsC, req, b.Server, b.Zone, "")
		counter(ch, descCDMisses, b.CacheMisses, b.Server, b.Zone, "")
		if b.HitsSuccess > 0 {
			counter(ch, descCDHits, b.HitsSuccess, b.Server, "success", b.Zone, "")
		}
		if b.HitsDenial > 0 {
			counter(ch, descCDHits, b.HitsDenial, b.Server, "denial", b.Zone, "")
		}
	}
	if b.ServedStale > 0 {
		counter(ch, descCDStale, b.ServedStale, b.Server, b.Zone, "")
	}
}

// collectCache is coredns_cache_entries, _prefetch_total and
// _evictions_total: per Corefile block with a cache (by its tag), or one
// series for the one cache.
func (c *cdCollector) collectCache(ch chan<- prometheus.Metric, servers []string) {
	var blocks []CacheBlock
	if c.cfg.CacheBlocks != nil {
		blocks = c.cfg.CacheBlocks()
	}
	if c.cfg.Cache == nil {
		return
	}
	if blocks == nil {
		if len(servers) == 0 {
			return
		}
		st := c.cfg.Cache.Stats()
		srv, z := servers[0], c.cfg.CacheZones
		// CoreDNS keeps SERVFAIL in its denial cache.
		denial := st.Entries[cache.Denial] + st.Entries[cache.ServFail]
		ch <- prometheus.MustNewConstMetric(descCDEntries, prometheus.GaugeValue, float64(st.Entries[cache.Success]), srv, "success", z, "")
		ch <- prometheus.MustNewConstMetric(descCDEntries, prometheus.GaugeValue, float64(denial), srv, "denial", z, "")
		counter(ch, descCDPrefetch, st.Prefetches, srv, z, "")
		// One budget for both kinds: every eviction shows as "success".
		counter(ch, descCDEvictions, st.Evictions, srv, "success", z, "")
		return
	}
	tags := c.cfg.Cache.TagStats()
	for i, b := range blocks {
		if !b.Cache || b.Server < 0 || b.Server >= len(servers) {
			continue
		}
		var ts cache.TagStats
		if i+1 < len(tags) {
			ts = tags[i+1]
		}
		srv := servers[b.Server]
		// CoreDNS keeps SERVFAIL in its denial cache.
		ch <- prometheus.MustNewConstMetric(descCDEntries, prometheus.GaugeValue, float64(ts.Entries[cache.Success]), srv, "success", b.Zones, "")
		ch <- prometheus.MustNewConstMetric(descCDEntries, prometheus.GaugeValue, float64(ts.Entries[cache.Denial]+ts.Entries[cache.ServFail]), srv, "denial", b.Zones, "")
		// Counters from their first event, as CoreDNS's.
		if ts.Prefetches > 0 {
			counter(ch, descCDPrefetch, ts.Prefetches, srv, b.Zones, "")
		}
		if v := ts.Evictions[cache.Success]; v > 0 {
			counter(ch, descCDEvictions, v, srv, "success", b.Zones, "")
		}
		if v := ts.Evictions[cache.Denial] + ts.Evictions[cache.ServFail]; v > 0 {
			counter(ch, descCDEvictions, v, srv, "denial", b.Zones, "")
		}
	}
}

// cumulative turns per-bucket counts (the last one +Inf) into the
// cumulative map a const histogram takes.
func cumulative(counts []uint64, bounds []float64) map[float64]uint64 {
	m := make(map[float64]uint64, len(bounds))
	var acc uint64
	for i, le := range bounds {
		acc += counts[i]
		m[le] = acc
	}
	return m
}

func sumU(v []uint64) (n uint64) {
	for _, x := range v {
		n += x
	}
	return
}

// CacheZonesLabel is the zones label of the cache series: the zone of the
// block whose cache the daemon's one cache stands for ("." when present).
func CacheZonesLabel(blocks []CDBlock) string {
	for _, b := range blocks {
		if slices.Contains(b.Zones, ".") {
			return "."
		}
	}
	if len(blocks) > 0 {
		return strings.Join(blocks[0].Zones, ",")
	}
	return "."
}
