package trace

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// mpDecode reads one msgpack value of the kinds a trace agent accepts
// (fixarray/array32, fixmap/map32, fixstr/str8/16/32, int64, uint64,
// float64) from b, strictly: any other byte is an error. Maps decode to
// map[string]any (keys must be strings, each once).
func mpDecode(b []byte) (v any, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, io.ErrUnexpectedEOF
	}
	c, b := b[0], b[1:]
	need := func(n int) ([]byte, error) {
		if len(b) < n {
			return nil, io.ErrUnexpectedEOF
		}
		return b[:n], nil
	}
	length := func(size int) (int, error) {
		p, err := need(size)
		if err != nil {
			return 0, err
		}
		b = b[size:]
		switch size {
		case 1:
			return int(p[0]), nil
		case 2:
			return int(binary.BigEndian.Uint16(p)), nil
		}
		return int(binary.BigEndian.Uint32(p)), nil
	}
	var n int
	switch {
	case c&0xf0 == 0x90 || c == 0xdd:
		if n = int(c & 0x0f); c == 0xdd {
			if n, err = length(4); err != nil {
				return nil, nil, err
			}
		}
		out := make([]any, n)
		for i := range out {
			if out[i], b, err = mpDecode(b); err != nil {
				return nil, nil, err
			}
		}
		return out, b, nil
	case c&0xf0 == 0x80 || c == 0xdf:
		if n = int(c & 0x0f); c == 0xdf {
			if n, err = length(4); err != nil {
				return nil, nil, err
			}
		}
		out := make(map[string]any, n)
		for range n {
			var k, e any
			if k, b, err = mpDecode(b); err != nil {
				return nil, nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, nil, fmt.Errorf("map key %v is not a string", k)
			}
			if _, dup := out[ks]; dup {
				return nil, nil, fmt.Errorf("map key %q twice", ks)
			}
			if e, b, err = mpDecode(b); err != nil {
				return nil, nil, err
			}
			out[ks] = e
		}
		return out, b, nil
	case c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb:
		n = int(c & 0x1f)
		switch c {
		case 0xd9:
			n, err = length(1)
		case 0xda:
			n, err = length(2)
		case 0xdb:
			n, err = length(4)
		}
		if err != nil {
			return nil, nil, err
		}
		p, err := need(n)
		if err != nil {
			return nil, nil, err
		}
		return string(p), b[n:], nil
	case c == 0xd3 || c == 0xcf || c == 0xcb:
		p, err := need(8)
		if err != nil {
			return nil, nil, err
		}
		u := binary.BigEndian.Uint64(p)
		switch c {
		case 0xd3:
			return int64(u), b[8:], nil
		case 0xcf:
			return u, b[8:], nil
		}
		return math.Float64frombits(u), b[8:], nil
	}
	return nil, nil, fmt.Errorf("msgpack byte %#x is not one the payload uses", c)
}

// Each msgpack writer round-trips at the edges of its short and long
// forms (a name of 255 bytes and a batch of 1,000 traces are both real).
func TestMsgpackForms(t *testing.T) {
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536} {
		var b bytes.Buffer
		s := strings.Repeat("x", n)
		mpStr(&b, s)
		if v, rest, err := mpDecode(b.Bytes()); err != nil || v != s || len(rest) != 0 {
			t.Errorf("str of %d: %d bytes left, %v", n, len(rest), err)
		}
	}
	for _, n := range []int{0, 15, 16, 1000} {
		var a, m bytes.Buffer
		mpArray(&a, n)
		mpMap(&m, n)
		for i := range n {
			mpInt(&a, int64(i))
			mpStr(&m, strconv.Itoa(i))
			mpUint(&m, uint64(i))
		}
		if v, rest, err := mpDecode(a.Bytes()); err != nil || len(v.([]any)) != n || len(rest) != 0 {
			t.Errorf("array of %d: %v", n, err)
		}
		if v, rest, err := mpDecode(m.Bytes()); err != nil || len(v.(map[string]any)) != n || len(rest) != 0 {
			t.Errorf("map of %d: %v", n, err)
		}
	}
	var b bytes.Buffer
	mpInt(&b, -5)
	mpUint(&b, math.MaxUint64)
	mpFloat(&b, 0.25)
	for _, want := range []any{int64(-5), uint64(math.MaxUint64), 0.25} {
		v, rest, err := mpDecode(b.Bytes())
		if err != nil || v != want {
			t.Errorf("%v: %v, want %v", v, err, want)
		}
		b = *bytes.NewBuffer(rest)
	}
}

// agent is a Datadog trace agent's /v0.4/traces endpoint: it decodes each
// POST strictly and keeps its headers and traces.
type agent struct {
	mu     sync.Mutex
	header http.Header
	path   string
	traces []any
	errs   []string
}

func (a *agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	a.header, a.path = r.Header.Clone(), r.Method+" "+r.URL.Path
	v, rest, err := mpDecode(body)
	if err != nil || len(rest) != 0 {
		a.errs = append(a.errs, fmt.Sprintf("payload: %v, %d bytes after it", err, len(rest)))
	}
	if traces, ok := v.([]any); ok {
		a.traces = append(a.traces, traces...)
	}
	w.WriteHeader(http.StatusOK)
}

// The payload the exporter posts to a Datadog agent: the v0.4 path and
// headers dd-trace-go sends, one trace per query of one span "servedns"
// whose 13 fields, tags and sampling metrics are those plugin/trace's
// spans carry (the agent drops a trace without _sampling_priority_v1).
func TestDatadogPayload(t *testing.T) {
	a := &agent{}
	srv := httptest.NewServer(a)
	defer srv.Close()
	cfg := Config{Type: Datadog, Endpoint: strings.TrimPrefix(srv.URL, "http://"), Service: "node-cache"}
	cfg.Normalize()
	e := newExporter(cfg, nil)
	start := time.Unix(1700000000, 123456789)
	spans := []Span{
		{Start: start, Duration: 1500 * time.Microsecond, Name: "www.example.org.", QType: dns.TypeAAAA, Rcode: dns.RcodeNameError, TCP: true, Remote: netip.MustParseAddr("10.0.0.7")},
		{Start: start.Add(time.Second), Duration: 0, Name: strings.Repeat("a", 63) + ".example.", QType: dns.TypeA, Rcode: dns.RcodeSuccess, Remote: netip.MustParseAddr("fd00::1"), Miss: true},
	}
	e.post(spans)
	if e.stats.Sent.Load() != 2 || e.stats.DroppedSend.Load() != 0 {
		t.Fatalf("sent %d, dropped %d", e.stats.Sent.Load(), e.stats.DroppedSend.Load())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.errs) > 0 {
		t.Fatal(a.errs)
	}
	if a.path != "POST /v0.4/traces" {
		t.Errorf("posted to %s", a.path)
	}
	for k, want := range map[string]string{"Content-Type": "application/msgpack", "X-Datadog-Trace-Count": "2", "Datadog-Meta-Lang": "go", "Datadog-Client-Computed-Top-Level": "yes"} {
		if got := a.header.Get(k); got != want {
			t.Errorf("header %s: %q, want %q", k, got, want)
		}
	}
	if len(a.traces) != len(spans) {
		t.Fatalf("%d traces, want %d", len(a.traces), len(spans))
	}
	runtimeID := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for i, tr := range a.traces {
		s := spans[i]
		one, ok := tr.([]any)
		if !ok || len(one) != 1 {
			t.Fatalf("trace %d: %#v, want one span", i, tr)
		}
		span, ok := one[0].(map[string]any)
		if !ok || len(span) != 13 {
			t.Fatalf("trace %d: span %#v, want a map of 13 fields", i, one[0])
		}
		for k, want := range map[string]any{
			"name": "servedns", "service": "node-cache", "resource": "servedns", "type": "",
			"start": s.Start.UnixNano(), "duration": max(s.Duration.Nanoseconds(), 1),
			"parent_id": uint64(0), "error": int64(0),
		} {
			if span[k] != want {
				t.Errorf("trace %d: %s = %#v, want %#v", i, k, span[k], want)
			}
		}
		if id, _ := span["span_id"].(uint64); id == 0 || span["trace_id"] != id {
			t.Errorf("trace %d: span_id %v trace_id %v: one nonzero id for both", i, span["span_id"], span["trace_id"])
		}
		meta, _ := span["meta"].(map[string]any)
		proto := map[bool]string{false: "udp", true: "tcp"}[s.TCP]
		for k, want := range map[string]string{
			"coredns.io@name": s.Name, "coredns.io@type": dns.Type(s.QType).String(), "coredns.io@proto": proto,
			"coredns.io@remote": s.Remote.String(), "coredns.io@rcode": dns.RcodeToString[s.Rcode],
			"dns": "true", "language": "go", "_dd.p.dm": "-1",
			"_dd.p.tid": fmt.Sprintf("%08x00000000", s.Start.Unix()),
		} {
			if meta[k] != want {
				t.Errorf("trace %d: meta %s = %#v, want %q", i, k, meta[k], want)
			}
		}
		if id, _ := meta["runtime-id"].(string); !runtimeID.MatchString(id) || len(meta) != 10 {
			t.Errorf("trace %d: meta %v: runtime-id a UUID v4, 10 tags", i, meta)
		}
		if ms, _ := span["meta_struct"].(map[string]any); ms == nil || len(ms) != 0 {
			t.Errorf("trace %d: meta_struct %#v", i, span["meta_struct"])
		}
		metrics, _ := span["metrics"].(map[string]any)
		for k, want := range map[string]float64{"_sampling_priority_v1": 1, "_dd.agent_psr": 1, "_dd.top_level": 1, "process_id": float64(os.Getpid())} {
			if metrics[k] != want {
				t.Errorf("trace %d: metric %s = %#v, want %v", i, k, metrics[k], want)
			}
		}
	}
}
