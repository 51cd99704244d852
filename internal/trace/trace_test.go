package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// zipkinSpan is a Zipkin v2 span as a collector reads it.
type zipkinSpan struct {
	TraceID       string `json:"traceId"`
	ID            string `json:"id"`
	ParentID      string `json:"parentId"`
	Name          string `json:"name"`
	Kind          string `json:"kind"`
	Timestamp     int64  `json:"timestamp"`
	Duration      int64  `json:"duration"`
	LocalEndpoint struct {
		ServiceName string `json:"serviceName"`
		IPv4        string `json:"ipv4"`
		IPv6        string `json:"ipv6"`
		Port        int    `json:"port"`
	} `json:"localEndpoint"`
	Tags map[string]string `json:"tags"`
}

// collector is a Zipkin HTTP collector: it decodes each POST strictly
// (unknown fields are an error) and keeps the spans.
type collector struct {
	mu    sync.Mutex
	spans []zipkinSpan
	errs  []string
	got   chan struct{}
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/api/v2/spans" || r.Header.Get("Content-Type") != "application/json" {
		c.errs = append(c.errs, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	var spans []zipkinSpan
	if err := dec.Decode(&spans); err != nil {
		c.errs = append(c.errs, err.Error())
	}
	c.spans = append(c.spans, spans...)
	w.WriteHeader(http.StatusAccepted)
	select {
	case c.got <- struct{}{}:
	default:
	}
}

var hexID = regexp.MustCompile(`^[0-9a-f]{16}$`)

func TestZipkinSpanTree(t *testing.T) {
	c := &collector{got: make(chan struct{}, 1)}
	srv := httptest.NewServer(c)
	defer srv.Close()
	cfg := Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Every: 2, Service: "node-cache", BatchInterval: 10 * time.Millisecond}
	cfg.Normalize()
	if cfg.Endpoint != srv.URL+"/api/v2/spans" {
		t.Fatalf("endpoint %s", cfg.Endpoint)
	}
	e := newExporter(cfg, nil)
	stop := make(chan struct{})
	defer close(stop)
	go e.run(stop)
	tr := NewTracer(cfg, Chain(func(n string) bool { return n != "log" && n != "whoami" && n != "template" }), netip.MustParseAddrPort("169.254.20.10:53"), e)
	start := time.Now()
	traced := 0
	for i, miss := range []bool{false, false, true, true, false} {
		if tr.Sample() {
			traced++
			tr.Record(Span{Start: start, Duration: 1500 * time.Microsecond, Name: "www.example.org.", QType: dns.TypeAAAA, Rcode: dns.RcodeNameError, TCP: i%2 == 1, Remote: netip.MustParseAddr("10.0.0.7"), Miss: miss})
		}
	}
	if traced != 2 {
		t.Fatalf("every 2 of 5 traced %d", traced)
	}
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		n := len(c.spans)
		c.mu.Unlock()
		if n >= 7+12 {
			break
		}
		select {
		case <-c.got:
		case <-deadline:
			t.Fatalf("collector has %d spans", n)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		t.Fatal(c.errs)
	}
	byID := map[string]zipkinSpan{}
	for _, s := range c.spans {
		if !hexID.MatchString(s.ID) || !hexID.MatchString(s.TraceID) {
			t.Errorf("ids %q %q", s.ID, s.TraceID)
		}
		if s.Timestamp != start.UnixMicro() || s.Duration != 1500 || s.LocalEndpoint.ServiceName != "node-cache" || s.LocalEndpoint.IPv4 != "169.254.20.10" || s.LocalEndpoint.Port != 53 {
			t.Errorf("span %+v", s)
		}
		byID[s.ID] = s
	}
	var chains []string
	for _, s := range c.spans {
		if s.ParentID != "" {
			continue
		}
		if s.Name != "servedns" || s.Kind != "SERVER" || s.ID != s.TraceID {
			t.Errorf("root %+v", s)
		}
		want := map[string]string{"coredns.io/name": "www.example.org.", "coredns.io/type": "AAAA", "coredns.io/rcode": "NXDOMAIN", "coredns.io/remote": "10.0.0.7", "coredns.io/proto": "tcp"}
		for k, v := range want {
			if s.Tags[k] != v {
				t.Errorf("root tag %s=%q, want %q", k, s.Tags[k], v)
			}
		}
		// Walk down: each span has one child.
		var names []string
		cur := s.ID
		for {
			var next string
			for _, x := range c.spans {
				if x.ParentID == cur {
					if next != "" {
						t.Errorf("%s has two children", cur)
					}
					next = x.ID
					names = append(names, x.Name)
					if x.Kind != "" || x.Tags != nil || x.TraceID != s.TraceID {
						t.Errorf("child %+v", x)
					}
				}
			}
			if next == "" {
				break
			}
			cur = next
		}
		chains = append(chains, strings.Join(names, ">"))
	}
	want := []string{"prometheus>errors>dnstap>dns64>loadbalance>cache", "prometheus>errors>dnstap>dns64>loadbalance>cache>rewrite>hosts>loop>forward>connect"}
	if strings.Join(chains, " ") != strings.Join(want, " ") {
		t.Errorf("chains %q, want %q", chains, want)
	}
}

// A collector that accepts the connection and never answers, or no
// collector at all: Record never blocks, the spans beyond the backlog are
// dropped and counted, and so are those of the failed POSTs.
func TestSlowOrDeadCollectorNeverBlocks(t *testing.T) {
	hold := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-hold
	}))
	defer slow.Close()
	defer close(hold)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	for _, ep := range []string{slow.URL, "http://" + dead} {
		t.Run(ep, func(t *testing.T) {
			cfg := Config{Endpoint: ep, Every: 1, Backlog: 10, Batch: 5, BatchInterval: 10 * time.Millisecond}
			cfg.Normalize()
			e := newExporter(cfg, nil)
			var st Stats
			e.stats = &st
			stop := make(chan struct{})
			defer close(stop)
			go e.run(stop)
			tr := NewTracer(cfg, []string{"cache", "forward"}, netip.AddrPort{}, e)
			var b0, s0 uint64
			begin := time.Now()
			for range 10000 {
				if tr.Sample() {
					tr.Record(Span{Start: time.Now(), Name: "a.", QType: 1})
				}
			}
			if d := time.Since(begin); d > time.Second {
				t.Errorf("10,000 Records took %v", d)
			}
			if ep == slow.URL {
				// One batch taken by the stalled POST, the backlog full.
				if n := st.DroppedBacklog.Load() - b0; n < 10000-10-5-5 {
					t.Errorf("dropped_backlog +%d of 10,000", n)
				}
				return
			}
			// Gone: every span is accounted for as dropped, one way or
			// the other.
			deadline := time.Now().Add(5 * time.Second)
			for st.DroppedBacklog.Load()-b0+st.DroppedSend.Load()-s0 < 10000 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if b, s := st.DroppedBacklog.Load()-b0, st.DroppedSend.Load()-s0; b+s != 10000 || s == 0 {
				t.Errorf("collector gone: dropped_backlog +%d, dropped_send +%d of 10,000", b, s)
			}
		})
	}
}

// BenchmarkSample is what a query of a traced block pays when it is not
// sampled; BenchmarkRecord what a sampled one adds (its span queued; the
// name rendered is the server's).
func BenchmarkSample(b *testing.B) {
	tr := NewTracer(Config{Every: 1 << 62}, nil, netip.AddrPort{}, nil)
	b.ReportAllocs()
	for b.Loop() {
		tr.Sample()
	}
}

func BenchmarkRecord(b *testing.B) {
	cfg := Config{Every: 1}
	cfg.Normalize()
	e := &Exporter{cfg: cfg, q: make(chan Span, 1<<20)}
	tr := NewTracer(cfg, []string{"cache"}, netip.AddrPort{}, e)
	s := Span{Start: time.Now(), Name: "www.example.org.", QType: 1}
	b.ReportAllocs()
	for b.Loop() {
		tr.Record(s)
		select {
		case <-e.q:
		default:
		}
	}
}

// syncWriter is an io.Writer safe for the exporter's goroutine and the test.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// A collector that refuses spans (HTTP 500) and then takes them again:
// one log line when the spans start being dropped, one when they are sent
// again, whatever the number of batches; the refused ones are counted.
func TestCollectorStateLoggedOncePerChange(t *testing.T) {
	var refuse sync.Mutex
	failing := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		refuse.Lock()
		defer refuse.Unlock()
		if failing {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	var out syncWriter
	cfg := Config{Endpoint: srv.URL + "/api/v2/spans", Every: 1, Batch: 1, BatchInterval: 10 * time.Millisecond}
	cfg.Normalize()
	e := newExporter(cfg, slog.New(slog.NewTextHandler(&out, nil)))
	var st Stats
	e.stats = &st
	stop := make(chan struct{})
	defer close(stop)
	go e.run(stop)
	tr := NewTracer(cfg, nil, netip.AddrPort{}, e)
	var s0, sent0 uint64
	send := func(n int) {
		for range n {
			if tr.Sample() {
				tr.Record(Span{Start: time.Now(), Name: "a.", QType: 1})
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	send(20)
	deadline := time.Now().Add(5 * time.Second)
	for st.DroppedSend.Load()-s0 < 20 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	refuse.Lock()
	failing = false
	refuse.Unlock()
	send(20)
	for st.Sent.Load()-sent0 < 20 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if d, s := st.DroppedSend.Load()-s0, st.Sent.Load()-sent0; d != 20 || s != 20 {
		t.Errorf("dropped_send +%d, sent +%d; want 20 and 20", d, s)
	}
	logs := out.String()
	if strings.Count(logs, "spans not sent") != 1 || strings.Count(logs, "collector accepts spans again") != 1 || !strings.Contains(logs, "500 Internal Server Error") {
		t.Errorf("log lines:\n%s", logs)
	}
}

// A collector that answers with a redirect refuses the spans: they are
// not sent where it points (issue 41), and are counted as dropped.
func TestCollectorRedirectNotFollowed(t *testing.T) {
	var reached atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer elsewhere.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	for _, typ := range []string{Zipkin, Datadog} {
		cfg := Config{Type: typ, Endpoint: srv.URL + "/api/v2/spans", Every: 1, Batch: 1, BatchInterval: 10 * time.Millisecond}
		if typ == Datadog {
			cfg.Endpoint = strings.TrimPrefix(srv.URL, "http://")
		}
		cfg.Normalize()
		e := newExporter(cfg, nil)
		var st Stats
		e.stats = &st
		stop := make(chan struct{})
		go e.run(stop)
		tr := NewTracer(cfg, nil, netip.AddrPort{}, e)
		for range 5 {
			if tr.Sample() {
				tr.Record(Span{Start: time.Now(), Name: "a.", QType: 1})
			}
		}
		for deadline := time.Now().Add(5 * time.Second); st.DroppedSend.Load() < 5 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		close(stop)
		if d, s := st.DroppedSend.Load(), st.Sent.Load(); d != 5 || s != 0 {
			t.Errorf("%s: dropped_send %d, sent %d; want 5 and 0", typ, d, s)
		}
	}
	if reached.Load() != 0 {
		t.Errorf("the redirect's target got %d posts", reached.Load())
	}
}

// The spans waiting in all the backlogs of one owner are bounded
// together (MaxWaiting, Stats.Waiting): two exporters whose collectors never take a span
// hold MaxWaiting between them, the rest dropped and counted.
func TestWaitingSpansBoundedAcrossExporters(t *testing.T) {
	var st Stats
	var es []*Exporter
	for i := range 3 {
		cfg := Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/api/v2/spans", 1+i), Every: 1, Backlog: MaxBacklog}
		e := newExporter(cfg, nil)
		e.stats = &st
		es = append(es, e)
	}
	free := MaxWaiting - st.Waiting.Load()
	for _, e := range es {
		for range MaxBacklog {
			e.enqueue(Span{Name: "x.example."})
		}
	}
	held := 0
	for _, e := range es {
		held += len(e.q)
	}
	if int64(held) != free || st.DroppedBacklog.Load() != uint64(3*MaxBacklog-held) {
		t.Errorf("held %d of %d offered (free %d), dropped %d", held, 3*MaxBacklog, free, st.DroppedBacklog.Load())
	}
	for _, e := range es { // give the room back
		for len(e.q) > 0 {
			<-e.q
			st.Waiting.Add(-1)
		}
	}
}
