package trace

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the spans of the exporters one owner runs (the daemon's
// running configuration, across its reloads: answer.Env.Stats), for
// nodelocaldns_trace_spans_total (docs/metrics.md), and the bound on the
// spans waiting in all of them (MaxWaiting). Not a package variable: two
// daemons in one process (tests) count apart.
type Stats struct {
	// Sent: spans the collector accepted (2xx).
	Sent atomic.Uint64
	// DroppedBacklog: spans dropped because the backlog was full (the
	// collector slower than the queries traced, or gone).
	DroppedBacklog atomic.Uint64
	// DroppedSend: spans of a batch the collector refused or could not be
	// reached with.
	DroppedSend atomic.Uint64
	// Waiting counts the spans in the exporters' backlogs (MaxWaiting).
	Waiting atomic.Int64
}

// Exporter sends the spans of the tracers of one endpoint: a backlog of
// at most Backlog spans, sent Batch at a time, at least every
// BatchInterval while any wait, by one goroutine. Enqueueing never
// blocks: a full backlog drops the new span (counted).
type Exporter struct {
	cfg    Config
	q      chan Span
	log    *slog.Logger
	client *http.Client
	// failing is whether the last POST failed: a change is logged once.
	failing bool
	buf     bytes.Buffer
	enc     encoder
	// stats is where its spans are counted, its owner's.
	stats *Stats
	// stop ends the goroutine StartExporter started, done says it ended.
	stop, done chan struct{}
	closeOnce  sync.Once
}

// encoder writes a batch of spans in the collector's format.
type encoder interface {
	encode(buf *bytes.Buffer, spans []Span)
	path() string
	header(h http.Header, n int)
}

// MaxExporters bounds the endpoints traced by one Corefile: each is a
// goroutine and a backlog, kept while a reloaded Corefile traces to it
// again (so a reload does not lose waiting spans) and stopped when none
// does (config refuses a Corefile with more).
const MaxExporters = 16

// ExporterKey identifies an exporter: cfg's endpoint and the options that
// shape what it sends (cfg normalized). Tracers of blocks with the same
// key share one exporter.
func ExporterKey(cfg Config) string {
	return fmt.Sprintf("trace|%s|%s|%d|%d|%s|%s", cfg.Type, cfg.Endpoint, cfg.Backlog, cfg.Batch, cfg.BatchInterval, cfg.Service)
}

// StartExporter starts the exporter of cfg's endpoint (cfg normalized),
// counting in stats (nil: its own): its goroutine runs until Close.
// Whoever starts it owns it (internal/running keeps it across the reloads
// that keep its key).
func StartExporter(cfg Config, log *slog.Logger, stats *Stats) *Exporter {
	e := newExporter(cfg, log)
	if stats != nil {
		e.stats = stats
	}
	e.stop, e.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.done)
		e.run(e.stop)
	}()
	return e
}

// Close stops the exporter: the spans still waiting are dropped (counted
// as dropped from the backlog). It waits for its goroutine.
func (e *Exporter) Close() error {
	e.closeOnce.Do(func() { close(e.stop) })
	<-e.done
	for {
		select {
		case <-e.q:
			e.stats.Waiting.Add(-1)
			e.stats.DroppedBacklog.Add(1)
		default:
			return nil
		}
	}
}

func newExporter(cfg Config, log *slog.Logger) *Exporter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Exporter{
		cfg:    cfg,
		q:      make(chan Span, cfg.Backlog),
		log:    log.With("endpoint", cfg.Endpoint, "type", cfg.Type),
		client: &http.Client{Timeout: PostTimeout, CheckRedirect: noRedirects},
		stats:  &Stats{},
	}
	switch cfg.Type {
	case Datadog:
		e.enc = newDatadog(cfg)
	default:
		e.enc = zipkinEncoder{}
	}
	return e
}

// noRedirects keeps a collector's redirect from sending the spans (and
// what a Datadog agent's headers carry) anywhere else: the 3xx is the
// answer, a refusal like any other non-2xx (issue 41).
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func (e *Exporter) enqueue(s Span) {
	if e.stats.Waiting.Add(1) > MaxWaiting {
		e.stats.Waiting.Add(-1)
		e.stats.DroppedBacklog.Add(1)
		return
	}
	select {
	case e.q <- s:
	default:
		e.stats.Waiting.Add(-1)
		e.stats.DroppedBacklog.Add(1)
	}
}

// run collects batches and posts them until stop is closed (nil: for
// ever).
func (e *Exporter) run(stop <-chan struct{}) {
	interval, most := e.cfg.BatchInterval, e.cfg.Batch
	if e.cfg.Type == Datadog {
		interval, most = DatadogFlushInterval, DatadogMaxBatch
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	batch := make([]Span, 0, most)
	for {
		select {
		case s := <-e.q:
			e.stats.Waiting.Add(-1)
			batch = append(batch, s)
			if len(batch) < most {
				continue
			}
		case <-tick.C:
			if len(batch) == 0 {
				continue
			}
		case <-stop:
			return
		}
		e.post(batch)
		clear(batch)
		batch = batch[:0]
	}
}

// post sends one batch; on failure the batch is dropped and counted.
func (e *Exporter) post(batch []Span) {
	e.buf.Reset()
	e.enc.encode(&e.buf, batch)
	ctx, cancel := context.WithTimeout(context.Background(), PostTimeout)
	defer cancel()
	url := e.cfg.Endpoint
	if e.cfg.Type == Datadog {
		url = "http://" + e.cfg.Endpoint + e.enc.path()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(e.buf.Bytes()))
	if err == nil {
		e.enc.header(req.Header, len(batch))
		var resp *http.Response
		if resp, err = e.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				err = fmt.Errorf("collector answered %s", resp.Status)
			}
		}
	}
	if err != nil {
		e.stats.DroppedSend.Add(uint64(len(batch)))
		if !e.failing {
			e.failing = true
			e.log.Warn("trace: spans not sent, dropping them until the collector accepts them again", "err", err)
		}
		return
	}
	e.stats.Sent.Add(uint64(len(batch)))
	if e.failing {
		e.failing = false
		e.log.Info("trace: collector accepts spans again")
	}
}
