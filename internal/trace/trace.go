// Package trace is the Corefile's `trace` directive: one trace per
// sampled query, sent to a Zipkin collector (v2 JSON POSTed to
// /api/v2/spans) or a Datadog trace agent (msgpack v0.4 POSTed to
// /v0.4/traces), as the stock node-cache's CoreDNS 1.13 plugin/trace sends
// them: the root span "servedns" (kind SERVER for Zipkin) tagged with the
// question's name, type, the answer's rcode, the transport and the
// client's address, and, for Zipkin only, one child span per CoreDNS
// handler plugin of the block the query went through (CoreDNS's
// plugin.NextOrFailure spans) and "connect" under forward for a miss.
// The encoders are our own.
//
// A Tracer is one block's `trace` (its sampling count, service name and
// span shape); it hands finished spans to the Exporter of its endpoint,
// which owns a bounded backlog, batches, and one goroutine that posts.
// Record never blocks and never allocates unless the query is sampled: a
// full backlog or a collector that fails drops spans, counted (Stats) and
// logged once per change of state. Nothing here is reached by a query of a
// block without `trace`.
package trace

import (
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Endpoint types, as the Corefile writes them.
const (
	Zipkin  = "zipkin"
	Datadog = "datadog"
)

// Defaults of CoreDNS 1.13's plugin/trace and of the reporters it uses
// (zipkin-go's HTTP reporter; dd-trace-go's flush every 2 s).
const (
	DefaultType           = Zipkin
	DefaultZipkinEndpoint = "localhost:9411" // supportedProviders["zipkin"]
	DefaultDatadogAgent   = "localhost:8126" // supportedProviders["datadog"]
	DefaultService        = "coredns"
	DefaultEvery          = 1
	// zipkin-go reporter/http: 1,000 spans waiting at most, 100 per POST,
	// a POST at least every second.
	DefaultBacklog       = 1000
	DefaultBatch         = 100
	DefaultBatchInterval = time.Second
	// DatadogFlushInterval is dd-trace-go's flush period (2 s).
	DatadogFlushInterval = 2 * time.Second
	// MaxBacklog bounds zipkin_max_backlog_size (ten times CoreDNS's
	// default): an exporter's backlog is a channel of that many spans
	// (~100 bytes each, allocated when the exporter starts: ≤ 1 MiB).
	MaxBacklog = 10000
	// MaxWaiting bounds the spans waiting in every backlog of one owner
	// together (Stats.Waiting) (each ~100 bytes and its name, ≤ 255: ≤ 7 MiB); past it a
	// new span is dropped, counted as DroppedBacklog. With MaxExporters
	// backlogs of MaxBacklog, the channels add ≤ 16 MiB (docs/design.md,
	// "The bounds add up").
	MaxWaiting = 20000
	// PostTimeout bounds one POST: a collector that accepts the connection
	// and then stalls holds the sender no longer than this, its spans wait
	// in the backlog (or are dropped when it is full).
	PostTimeout = 5 * time.Second
)

// Config is one `trace` directive, parsed (internal/corefile).
type Config struct {
	// Type is Zipkin or Datadog.
	Type string
	// Endpoint is the URL spans are posted to for Zipkin
	// (http://HOST:PORT/api/v2/spans unless written as a URL), the agent's
	// HOST:PORT for Datadog.
	Endpoint string
	// Every: one query in Every is traced (the Every-th, 2·Every-th, ...);
	// 0: none.
	Every uint64
	// Service is the service name reported.
	Service string
	// ClientServer is client_server (Zipkin's shared spans): it only
	// changes a server span that joins a client's trace context, which
	// DNS over UDP and TCP never carry, so it changes nothing sent.
	ClientServer bool
	// AnalyticsRate is datadog_analytics_rate: dd-trace-go 2.4 applies it
	// to its integrations' spans, not to the spans plugin/trace starts,
	// so it changes nothing sent either.
	AnalyticsRate float64
	// Backlog, Batch and BatchInterval are zipkin_max_backlog_size,
	// zipkin_max_batch_size and zipkin_max_batch_interval (0: default).
	Backlog       int
	Batch         int
	BatchInterval time.Duration
}

// Normalize fills in the defaults and turns a Zipkin endpoint into its URL,
// as CoreDNS's normalizeEndpoint does: without "http" in it,
// http://ENDPOINT/api/v2/spans.
func (c *Config) Normalize() {
	if c.Type == "" {
		c.Type = DefaultType
	}
	if c.Endpoint == "" {
		c.Endpoint = DefaultZipkinEndpoint
		if c.Type == Datadog {
			c.Endpoint = DefaultDatadogAgent
		}
	}
	if c.Type == Zipkin && !strings.Contains(c.Endpoint, "http") {
		c.Endpoint = "http://" + c.Endpoint + "/api/v2/spans"
	}
	if c.Service == "" {
		c.Service = DefaultService
	}
	if c.Backlog <= 0 {
		c.Backlog = DefaultBacklog
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	if c.BatchInterval <= 0 {
		c.BatchInterval = DefaultBatchInterval
	}
}

// Span is one sampled query, as the server saw it. The exporter turns it
// into the span tree the stock sends.
type Span struct {
	Start    time.Time
	Duration time.Duration
	// Name is the question's name as asked (presentation form, with the
	// final dot); QType its type.
	Name   string
	QType  uint16
	Rcode  int
	TCP    bool
	Remote netip.Addr
	// Miss: the answer came from the block's fetch side (its forward),
	// not from the cache or the server itself.
	Miss bool
	t    *Tracer
}

// Tracer is one block's trace: the sampling count and what every span of
// the block carries. Safe for concurrent use.
type Tracer struct {
	count atomic.Uint64
	every uint64
	// hit and miss are the names of the child spans of a hit and of a
	// miss, outermost first.
	hit, miss []string
	// local is the block's first listen address and port (CoreDNS's
	// serviceEndpoint: its first bind address), zero when it has none.
	local   netip.AddrPort
	service string
	// endpoint is the Zipkin localEndpoint field of its spans, made once.
	endpoint string
	exp      *Exporter
}

// NewTracer returns the trace of a block: chain is the block's CoreDNS
// handler plugins after trace in plugin.cfg order (e.g. prometheus,
// errors, log, cache, loop, forward); a hit's spans stop at cache, a
// miss's go through all and end in forward's "connect". local is the
// block's first bind address and its port. exp sends its spans.
func NewTracer(cfg Config, chain []string, local netip.AddrPort, exp *Exporter) *Tracer {
	t := &Tracer{every: cfg.Every, local: local, service: cfg.Service, endpoint: zipkinEndpoint(cfg.Service, local), exp: exp}
	if i := indexOf(chain, "cache"); i >= 0 {
		t.hit = chain[:i+1]
	} else {
		t.hit = chain
	}
	t.miss = chain
	if indexOf(chain, "forward") >= 0 {
		t.miss = append(append([]string(nil), chain...), "connect")
	}
	return t
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// Same reports whether t and o trace alike (nil: no trace): the same
// sampling, spans, service, local endpoint and exporter; their counts
// apart.
func (t *Tracer) Same(o *Tracer) bool {
	if t == nil || o == nil {
		return t == o
	}
	return t.every == o.every && slices.Equal(t.hit, o.hit) && slices.Equal(t.miss, o.miss) &&
		t.local == o.local && t.service == o.service && t.exp == o.exp
}

// Sample counts a query of the block and reports whether it is traced:
// the Every-th, 2·Every-th, ... (CoreDNS's queryNr%every == 0).
func (t *Tracer) Sample() bool {
	if t.every == 0 {
		return false
	}
	return t.count.Add(1)%t.every == 0
}

// Record hands a sampled query's span to the exporter; it never blocks.
func (t *Tracer) Record(s Span) {
	s.t = t
	t.exp.enqueue(s)
}

// handlerOrder is CoreDNS 1.13's plugin.cfg order (the stock node-cache's)
// of the plugins after trace that are handlers, of those nodelocaldns
// reads: each gets a child span (plugin.NextOrFailure). ready, health and
// pprof are not handlers; rewrite comes after cache there (1.15 moved it
// before).
var handlerOrder = []string{
	"prometheus", "errors", "log", "dnstap", "dns64", "loadbalance", "cache", "rewrite",
	"template", "hosts", "loop", "forward", "whoami",
}

// Chain is the child spans of a block whose directives are named by has,
// outermost first (NewTracer's chain).
func Chain(has func(name string) bool) []string {
	var out []string
	for _, n := range handlerOrder {
		if has(n) {
			out = append(out, n)
		}
	}
	return out
}
