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

// Stats are the spans of every exporter of the process, for
// nodelocaldns_trace_spans_total (docs/metrics.md).
type Stats struct {
	// Sent: spans the collector accepted (2xx).
	Sent atomic.Uint64
	// DroppedBacklog: spans dropped because the backlog was full (the
	// collector slower than the queries traced, or gone).
	DroppedBacklog atomic.Uint64
	// DroppedSend: spans of a batch the collector refused or could not be
	// reached with.
	DroppedSend atomic.Uint64
}

// Counters are the process's span counts.
var Counters Stats

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
	// stats is where its spans are counted: Counters, or a test's own.
	stats *Stats
}

// encoder writes a batch of spans in the collector's format.
type encoder interface {
	encode(buf *bytes.Buffer, spans []Span)
	path() string
	header(h http.Header, n int)
}

var (
	exportersMu sync.Mutex
	exporters   = map[string]*Exporter{}
)

// MaxExporters bounds the endpoints traced at once in one process: each
// is a goroutine and a backlog that live as long as the process (a
// reload that keeps the endpoint keeps its exporter and its backlog).
const MaxExporters = 16

// ExporterFor returns the exporter of cfg's endpoint and options,
// started on first use and kept for the life of the process, so a
// reload does not lose waiting spans. cfg must be normalized.
func ExporterFor(cfg Config, log *slog.Logger) (*Exporter, error) {
	key := fmt.Sprintf("%s|%s|%d|%d|%s|%s", cfg.Type, cfg.Endpoint, cfg.Backlog, cfg.Batch, cfg.BatchInterval, cfg.Service)
	exportersMu.Lock()
	defer exportersMu.Unlock()
	if e := exporters[key]; e != nil {
		return e, nil
	}
	if len(exporters) >= MaxExporters {
		return nil, fmt.Errorf("trace: more than %d distinct endpoints traced in one process", MaxExporters)
	}
	e := newExporter(cfg, log)
	exporters[key] = e
	go e.run(nil)
	return e, nil
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
		stats:  &Counters,
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

// waiting counts the spans in every exporter's backlog (MaxWaiting).
var waiting atomic.Int64

func (e *Exporter) enqueue(s Span) {
	if waiting.Add(1) > MaxWaiting {
		waiting.Add(-1)
		e.stats.DroppedBacklog.Add(1)
		return
	}
	select {
	case e.q <- s:
	default:
		waiting.Add(-1)
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
			waiting.Add(-1)
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
