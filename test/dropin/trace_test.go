package dropin

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// The Corefile's trace, checked against the stock node-cache (CoreDNS
// 1.13.2's plugin/trace): a real HTTP collector in each daemon's network
// namespace decodes and validates what arrives (Zipkin v2 JSON on :9411,
// the Datadog trace agent's msgpack v0.4 on :8126) and the traces of the
// same questions are compared: span names and their nesting, kinds, tags,
// service name, local endpoint, and which queries were sampled.

// zSpan is a Zipkin v2 span; unknown fields are an error.
type zSpan struct {
	TraceID       string `json:"traceId"`
	ID            string `json:"id"`
	ParentID      string `json:"parentId"`
	Name          string `json:"name"`
	Kind          string `json:"kind"`
	Timestamp     int64  `json:"timestamp"`
	Duration      int64  `json:"duration"`
	Shared        bool   `json:"shared"`
	Debug         bool   `json:"debug"`
	LocalEndpoint *struct {
		ServiceName string `json:"serviceName"`
		IPv4        string `json:"ipv4"`
		IPv6        string `json:"ipv6"`
		Port        int    `json:"port"`
	} `json:"localEndpoint"`
	RemoteEndpoint json.RawMessage   `json:"remoteEndpoint"`
	Annotations    json.RawMessage   `json:"annotations"`
	Tags           map[string]string `json:"tags"`
}

// traceCollector is the collector of one namespace: each request decoded,
// checked, and its spans or traces kept; what is wrong is in errs.
type traceCollector struct {
	mu    sync.Mutex
	begin time.Time
	spans []zSpan
	dd    [][]map[string]any // Datadog traces
	other []string           // other requests (Datadog's /info, telemetry)
	errs  []string
}

var (
	zipkinID = regexp.MustCompile(`^[0-9a-f]{16}$`)
	zipkinTr = regexp.MustCompile(`^([0-9a-f]{16}){1,2}$`)
)

func (c *traceCollector) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func (c *traceCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.fail("%s: %v", r.URL.Path, err)
	}
	switch {
	case r.URL.Path == "/api/v2/spans":
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			c.fail("zipkin: %s %s", r.Method, r.Header.Get("Content-Type"))
		}
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		var spans []zSpan
		if err := dec.Decode(&spans); err != nil {
			c.fail("zipkin: %v", err)
		}
		lo, hi := c.begin.Add(-time.Minute).UnixMicro(), time.Now().Add(time.Minute).UnixMicro()
		for _, s := range spans {
			if !zipkinID.MatchString(s.ID) || !zipkinTr.MatchString(s.TraceID) || (s.ParentID != "" && !zipkinID.MatchString(s.ParentID)) {
				c.fail("zipkin: ids of %+v", s)
			}
			if s.Name == "" || s.Timestamp < lo || s.Timestamp > hi || s.Duration < 1 || s.Duration > 60e6 || s.LocalEndpoint == nil || s.LocalEndpoint.ServiceName == "" {
				c.fail("zipkin: span %+v", s)
			}
		}
		c.spans = append(c.spans, spans...)
	case r.URL.Path == "/v0.4/traces":
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/msgpack" {
			c.fail("datadog: %s %s", r.Method, r.Header.Get("Content-Type"))
		}
		v, rest, err := msgpackDecode(body)
		if err != nil || len(rest) > 0 {
			c.fail("datadog: msgpack: %v (%d bytes left)", err, len(rest))
			break
		}
		traces, ok := v.([]any)
		if !ok {
			c.fail("datadog: payload %T", v)
			break
		}
		if n := r.Header.Get("X-Datadog-Trace-Count"); n != fmt.Sprint(len(traces)) {
			c.fail("datadog: X-Datadog-Trace-Count %s for %d traces", n, len(traces))
		}
		for _, t := range traces {
			var spans []map[string]any
			for _, s := range t.([]any) {
				spans = append(spans, s.(map[string]any))
			}
			if len(spans) > 0 {
				c.dd = append(c.dd, spans)
			}
		}
	default:
		c.other = append(c.other, r.Method+" "+r.URL.Path)
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// collectorIn serves a traceCollector on port in namespace ns.
func collectorIn(t *testing.T, ns string, ports ...int) *traceCollector {
	t.Helper()
	c := &traceCollector{begin: time.Now()}
	for _, p := range ports {
		var l net.Listener
		if err := inNetns(ns, func() (err error) { l, err = net.Listen("tcp", fmt.Sprintf(":%d", p)); return }); err != nil {
			t.Fatal(err)
		}
		s := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = s.Serve(l) }()
		t.Cleanup(func() { _ = s.Close() })
	}
	return c
}

// zipkinTraces are the traces collected, one line per trace: the root's
// name, kind, service, local endpoint and tags, then the child spans
// from the root down (each span has at most one child), each with its
// kind and tags but peer.address (kept apart in peers). skip drops a
// trace by its root's name.
func (c *traceCollector) zipkinTraces(t *testing.T, skip func(name string) bool) (traces []string, peers int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	byParent := map[string][]zSpan{}
	for _, s := range c.spans {
		if s.ParentID != "" {
			byParent[s.TraceID+"/"+s.ParentID] = append(byParent[s.TraceID+"/"+s.ParentID], s)
		}
	}
	for _, root := range c.spans {
		if root.ParentID != "" {
			continue
		}
		if skip(root.Tags["coredns.io/name"]) {
			continue
		}
		ep := root.LocalEndpoint
		line := fmt.Sprintf("%s kind=%s service=%s ep=%s%s:%d %s", root.Name, root.Kind, ep.ServiceName, ep.IPv4, ep.IPv6, ep.Port, tagString(root.Tags))
		cur := root
		for {
			kids := byParent[cur.TraceID+"/"+cur.ID]
			if len(kids) == 0 {
				break
			}
			if len(kids) > 1 {
				t.Errorf("span %s %s has %d children", cur.Name, cur.ID, len(kids))
			}
			k := kids[0]
			if k.LocalEndpoint.ServiceName != ep.ServiceName || k.Timestamp < root.Timestamp || k.Timestamp+k.Duration > root.Timestamp+root.Duration+1 {
				t.Errorf("child %+v outside its root %+v", k, root)
			}
			tags := maps.Clone(k.Tags)
			if _, ok := tags["peer.address"]; ok {
				peers++
				delete(tags, "peer.address")
			}
			line += " > " + k.Name
			if k.Kind != "" || len(tags) > 0 {
				line += fmt.Sprintf("(kind=%s %s)", k.Kind, tagString(tags))
			}
			cur = k
		}
		traces = append(traces, line)
	}
	sort.Strings(traces)
	return traces, peers
}

func tagString(m map[string]string) string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return "{" + strings.Join(kv, " ") + "}"
}

// loopSelfQuery is the name of the loop plugin's own query (two random
// numbers under the zone), which the stock sends itself at start.
var loopSelfQuery = regexp.MustCompile(`^[0-9]+\.[0-9]+\.`)

type traceQuestion struct {
	name  string
	qtype uint16
	v     variant
}

// askTraced asks each question of qs in order, in ns on the local address.
func askTraced(t *testing.T, ns string, qs []traceQuestion) {
	t.Helper()
	for _, q := range qs {
		if _, err := exchange(ns, q.name, q.qtype, q.v); err != nil {
			t.Fatalf("%s %s %s: %v", q.name, dns.TypeToString[q.qtype], q.v.name, err)
		}
	}
}

// waitFor polls cond until it holds or 15 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// traceCorefile is the reference manifest's Corefile with trace in the
// cluster domain's block (every query, the defaults: localhost:9411) and
// in the root block (every third query, a service name of its own, every
// option zipkin takes, and log and loadbalance for their spans); the root
// block without loop, whose own query at start would count toward the
// sampling of the stock only.
func traceCorefile(t *testing.T, rootTrace string) string {
	t.Helper()
	c := referenceCorefile(t, false)
	c = strings.Replace(c, "    health 169.254.20.10:8080\n", "    health 169.254.20.10:8080\n    trace\n", 1)
	i := strings.LastIndex(c, ".:53 {")
	root := strings.Replace(c[i:], "    loop\n", "    log . {\n        class denial\n    }\n    loadbalance\n", 1)
	root = strings.Replace(root, "    prometheus :9253\n", "    prometheus :9253\n"+rootTrace, 1)
	return c[:i] + root
}

var traceQuestions = []traceQuestion{
	{"www.example.org.", dns.TypeA, variants[0]},
	{"www.example.org.", dns.TypeA, variants[1]}, // a hit
	{"www.example.org.", dns.TypeAAAA, variants[5]},
	{"nx.example.org.", dns.TypeA, variants[2]},
	{"nx.example.org.", dns.TypeA, variants[5]}, // a hit
	{"example.org.", dns.TypeMX, variants[3]},
	{"chain.example.org.", dns.TypeA, variants[4]},
	{"_sip._udp.example.org.", dns.TypeSRV, variants[0]},
	{"big40.example.org.", dns.TypeA, variants[5]},
	{"example.org.", dns.TypeMX, variants[0]}, // a hit
	{"www.example.org.", dns.TypeA, variants[5]},
	{"Mixed.Example.ORG.", dns.TypeTXT, variants[0]},
	{"alias.default.svc.cluster.local.", dns.TypeA, variants[0]},
	{"nx.default.svc.cluster.local.", dns.TypeA, variants[5]},
	{"alias.default.svc.cluster.local.", dns.TypeA, variants[1]}, // a hit
	{"txt.default.svc.cluster.local.", dns.TypeTXT, variants[5]},
	{"10.0.96.10.in-addr.arpa.", dns.TypePTR, variants[0]}, // a block without trace
}

// TestTraceZipkinParityWithStockNodeCache: the same Corefile and questions
// through the stock node-cache and ours, each posting to a Zipkin
// collector in its namespace: the same traces (span names and nesting,
// kind, tags, service, local endpoint) of the same sampled queries. The
// known difference, asserted: forward's "connect" span carries the
// upstream's address (peer.address) in the stock's only
// (docs/migration.md).
func TestTraceZipkinParityWithStockNodeCache(t *testing.T) {
	t.Parallel() // its own namespaces (or loopback port); runs beside the other trace tests
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock, ours := stockBinary(t), buildNodelocaldns(t)
	corefile := traceCorefile(t, "    trace 127.0.0.1:9411 {\n        every 3\n        service Node-Cache\n        client_server\n        zipkin_max_backlog_size 500\n        zipkin_max_batch_size 4\n        zipkin_max_batch_interval 200ms\n    }\n")
	// cluster.local: every query; the root block: every third.
	var dot, cluster int
	for _, q := range traceQuestions {
		switch {
		case strings.HasSuffix(q.name, ".cluster.local."):
			cluster++
		case !strings.HasSuffix(q.name, ".arpa."):
			dot++
		}
	}
	want := cluster + dot/3
	got := map[string][]string{}
	peers := map[string]int{}
	for _, run := range []struct{ who, bin string }{{"stock", stock}, {"ours", ours}} {
		ns, _ := oracleNamespace(t)
		c := collectorIn(t, ns, 9411)
		startReferenceCorefile(t, ns, run.bin, corefile, "-setupiptables=false")
		askTraced(t, ns, traceQuestions)
		skip := func(name string) bool {
			return name == "web.default.svc.cluster.local." || loopSelfQuery.MatchString(name) // the start's probes
		}
		waitFor(t, run.who+"'s traces", func() bool { tr, _ := c.zipkinTraces(t, skip); return len(tr) >= want })
		time.Sleep(500 * time.Millisecond) // nothing more comes
		got[run.who], peers[run.who] = c.zipkinTraces(t, skip)
		c.mu.Lock()
		if len(c.errs) > 0 {
			t.Errorf("%s's collector: %s", run.who, strings.Join(c.errs, "\n"))
		}
		c.mu.Unlock()
	}
	if !slices.Equal(got["stock"], got["ours"]) {
		t.Errorf("traces differ:\nstock:\n%s\nours:\n%s", strings.Join(got["stock"], "\n"), strings.Join(got["ours"], "\n"))
	}
	if len(got["ours"]) != want {
		t.Errorf("%d traces, want %d", len(got["ours"]), want)
	}
	if peers["stock"] == 0 || peers["ours"] != 0 {
		t.Errorf("connect spans with peer.address: stock %d, ours %d (docs/migration.md says the stock's only)", peers["stock"], peers["ours"])
	}
	t.Logf("%d traces alike:\n%s", len(got["ours"]), strings.Join(got["ours"], "\n"))
}

// TestTraceDatadogParityWithStockNodeCache: the same through a Datadog
// trace agent (msgpack v0.4 on :8126): one span per sampled query, named
// servedns, its service and resource, the coredns.io@ tags, dns=true and
// the sampling priority the agent keeps it by.
func TestTraceDatadogParityWithStockNodeCache(t *testing.T) {
	t.Parallel() // its own namespaces (or loopback port); runs beside the other trace tests
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock, ours := stockBinary(t), buildNodelocaldns(t)
	corefile := traceCorefile(t, "    trace datadog 127.0.0.1:8126 {\n        every 2\n        service DD-Node-Cache\n        datadog_analytics_rate 0.5\n    }\n")
	corefile = strings.Replace(corefile, "    trace\n", "", 1) // the root block only
	var dot int
	for _, q := range traceQuestions {
		if !strings.HasSuffix(q.name, ".cluster.local.") && !strings.HasSuffix(q.name, ".arpa.") {
			dot++
		}
	}
	got := map[string][]string{}
	for _, run := range []struct{ who, bin string }{{"stock", stock}, {"ours", ours}} {
		ns, _ := oracleNamespace(t)
		c := collectorIn(t, ns, 8126)
		startReferenceCorefile(t, ns, run.bin, corefile, "-setupiptables=false")
		askTraced(t, ns, traceQuestions)
		shapes := func() []string {
			c.mu.Lock()
			defer c.mu.Unlock()
			var out []string
			for _, tr := range c.dd {
				out = append(out, ddShape(t, run.who, tr))
			}
			sort.Strings(out)
			return out
		}
		waitFor(t, run.who+"'s traces", func() bool { return len(shapes()) >= dot/2 })
		time.Sleep(2100 * time.Millisecond) // a flush period: nothing more comes
		got[run.who] = shapes()
		c.mu.Lock()
		if len(c.errs) > 0 {
			t.Errorf("%s's collector: %s", run.who, strings.Join(c.errs, "\n"))
		}
		t.Logf("%s also asked: %q", run.who, c.other)
		c.mu.Unlock()
	}
	if !slices.Equal(got["stock"], got["ours"]) || len(got["ours"]) != dot/2 {
		t.Errorf("traces differ (want %d):\nstock:\n%s\nours:\n%s", dot/2, strings.Join(got["stock"], "\n"), strings.Join(got["ours"], "\n"))
	}
}

// ddShape is what is compared of a Datadog trace; the ids, times and
// tracer-specific fields are checked, not compared.
func ddShape(t *testing.T, who string, tr []map[string]any) string {
	t.Helper()
	if len(tr) != 1 {
		t.Errorf("%s: a trace of %d spans", who, len(tr))
	}
	s := tr[0]
	meta, _ := s["meta"].(map[string]any)
	metrics, _ := s["metrics"].(map[string]any)
	id, tid, pid := s["span_id"], s["trace_id"], s["parent_id"]
	start, _ := s["start"].(int64)
	dur, _ := s["duration"].(int64)
	if id == nil || id != tid || pid != uint64(0) && pid != int64(0) || start < time.Now().Add(-time.Hour).UnixNano() || dur <= 0 || s["error"] != int64(0) {
		t.Errorf("%s: span %v", who, s)
	}
	if metrics["_sampling_priority_v1"] != float64(1) {
		t.Errorf("%s: metrics %v", who, metrics)
	}
	var tags []string
	for k, v := range meta {
		if strings.HasPrefix(k, "coredns.io@") || k == "dns" || k == "language" {
			tags = append(tags, fmt.Sprintf("%s=%v", k, v))
		}
	}
	sort.Strings(tags)
	return fmt.Sprintf("%v service=%v resource=%v type=%q %s", s["name"], s["service"], s["resource"], s["type"], strings.Join(tags, " "))
}

// msgpackDecode decodes one msgpack value (the kinds a trace payload
// uses: maps, arrays, strings, binary, integers, floats, booleans, nil).
func msgpackDecode(b []byte) (any, []byte, error) {
	if len(b) == 0 {
		return nil, nil, errors.New("short")
	}
	c, b := b[0], b[1:]
	need := func(n int) ([]byte, []byte, error) {
		if len(b) < n {
			return nil, nil, errors.New("short")
		}
		return b[:n], b[n:], nil
	}
	length := func(size int) (int, []byte, error) {
		v, rest, err := need(size)
		if err != nil {
			return 0, nil, err
		}
		switch size {
		case 1:
			return int(v[0]), rest, nil
		case 2:
			return int(binary.BigEndian.Uint16(v)), rest, nil
		}
		return int(binary.BigEndian.Uint32(v)), rest, nil
	}
	str := func(n int, rest []byte) (any, []byte, error) {
		if len(rest) < n {
			return nil, nil, errors.New("short string")
		}
		return string(rest[:n]), rest[n:], nil
	}
	seq := func(n int, rest []byte, isMap bool) (any, []byte, error) {
		if n > len(rest) {
			return nil, nil, errors.New("length past the payload")
		}
		if isMap {
			m := map[string]any{}
			for range n {
				k, r, err := msgpackDecode(rest)
				if err != nil {
					return nil, nil, err
				}
				ks, ok := k.(string)
				if !ok {
					return nil, nil, fmt.Errorf("map key %T", k)
				}
				v, r, err := msgpackDecode(r)
				if err != nil {
					return nil, nil, err
				}
				m[ks], rest = v, r
			}
			return m, rest, nil
		}
		a := make([]any, 0, n)
		for range n {
			v, r, err := msgpackDecode(rest)
			if err != nil {
				return nil, nil, err
			}
			a, rest = append(a, v), r
		}
		return a, rest, nil
	}
	switch {
	case c <= 0x7f:
		return int64(c), b, nil
	case c >= 0xe0:
		return int64(int8(c)), b, nil
	case c&0xf0 == 0x80:
		return seq(int(c&0x0f), b, true)
	case c&0xf0 == 0x90:
		return seq(int(c&0x0f), b, false)
	case c&0xe0 == 0xa0:
		return str(int(c&0x1f), b)
	}
	switch c {
	case 0xc0:
		return nil, b, nil
	case 0xc2, 0xc3:
		return c == 0xc3, b, nil
	case 0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb:
		size := map[byte]int{0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}[c]
		n, rest, err := length(size)
		if err != nil {
			return nil, nil, err
		}
		return str(n, rest)
	case 0xca:
		v, rest, err := need(4)
		if err != nil {
			return nil, nil, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(v))), rest, nil
	case 0xcb:
		v, rest, err := need(8)
		if err != nil {
			return nil, nil, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(v)), rest, nil
	case 0xcc, 0xcd, 0xce, 0xcf:
		size := map[byte]int{0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}[c]
		v, rest, err := need(size)
		if err != nil {
			return nil, nil, err
		}
		var u uint64
		for _, x := range v {
			u = u<<8 | uint64(x)
		}
		if u <= math.MaxInt64 {
			return int64(u), rest, nil
		}
		return u, rest, nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		size := map[byte]int{0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8}[c]
		v, rest, err := need(size)
		if err != nil {
			return nil, nil, err
		}
		var u uint64
		for _, x := range v {
			u = u<<8 | uint64(x)
		}
		shift := 64 - 8*size
		return int64(u<<shift) >> shift, rest, nil
	case 0xdc, 0xde:
		n, rest, err := length(2)
		if err != nil {
			return nil, nil, err
		}
		return seq(n, rest, c == 0xde)
	case 0xdd, 0xdf:
		n, rest, err := length(4)
		if err != nil {
			return nil, nil, err
		}
		return seq(n, rest, c == 0xdf)
	}
	return nil, nil, fmt.Errorf("msgpack type 0x%02x not used by trace payloads", c)
}

// TestTraceDeadOrSlowCollectorLosesNoAnswer: ours tracing every query to a
// collector that is gone (nothing listens) or stalls (reads each POST and
// never answers): 3,000 queries from 6 clients, hits and misses, are all
// answered; the spans that could not go are counted in
// nodelocaldns_trace_spans_total and the failure is logged once.
func TestTraceDeadOrSlowCollectorLosesNoAnswer(t *testing.T) {
	t.Parallel() // its own namespaces (or loopback port); runs beside the other trace tests
	if testing.Short() {
		t.Skip("builds our binary and runs a daemon")
	}
	ours := buildNodelocaldns(t)
	for _, mode := range []string{"dead", "slow"} {
		t.Run(mode, func(t *testing.T) {
			ns, in := oracleNamespace(t)
			if mode == "slow" {
				hold := make(chan struct{})
				var l net.Listener
				if err := inNetns(ns, func() (err error) { l, err = net.Listen("tcp", ":9411"); return }); err != nil {
					t.Fatal(err)
				}
				s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					<-hold
				})}
				go func() { _ = s.Serve(l) }()
				t.Cleanup(func() { close(hold); _ = s.Close() })
			}
			corefile := traceCorefile(t, "    trace 127.0.0.1:9411 {\n        zipkin_max_backlog_size 50\n        zipkin_max_batch_size 10\n        zipkin_max_batch_interval 50ms\n    }\n")
			logs := startReferenceCorefile(t, ns, ours, corefile, "-setupiptables=false")
			const clients, each = 6, 500
			var wg sync.WaitGroup
			answered := make([]int, clients)
			begin := time.Now()
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var conn net.Conn
					if err := inNetns(ns, func() (err error) { conn, err = net.Dial("udp", net.JoinHostPort(oracleLocal, "53")); return }); err != nil {
						t.Error(err)
						return
					}
					defer conn.Close()
					co := &dns.Conn{Conn: conn}
					for i := range each {
						m := new(dns.Msg)
						name := "www.example.org." // a hit after the first
						if i%2 == 0 {
							name = fmt.Sprintf("u%d-%d.example.org.", c, i) // a miss
						}
						m.SetQuestion(name, dns.TypeA)
						_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
						if err := co.WriteMsg(m); err != nil {
							t.Error(err)
							return
						}
						r, err := co.ReadMsg()
						if err != nil {
							t.Errorf("client %d query %d (%s): %v", c, i, name, err)
							return
						}
						if r.Id == m.Id {
							answered[c]++
						}
					}
				}()
			}
			wg.Wait()
			took := time.Since(begin)
			total := 0
			for _, n := range answered {
				total += n
			}
			if total != clients*each {
				t.Fatalf("%d of %d queries answered", total, clients*each)
			}
			series := func() map[string]float64 {
				out := map[string]float64{}
				body := mustRun(t, in("curl", "-sf", "http://"+oracleLocal+":9253/metrics"))
				for _, l := range strings.Split(body, "\n") {
					if strings.HasPrefix(l, "nodelocaldns_trace_spans_total{") {
						var v float64
						f := strings.Fields(l)
						_, _ = fmt.Sscan(f[len(f)-1], &v)
						out[f[0]] = v
					}
				}
				return out
			}
			want := `nodelocaldns_trace_spans_total{result="dropped_send"}`
			if mode == "slow" {
				want = `nodelocaldns_trace_spans_total{result="dropped_backlog"}`
			}
			waitFor(t, want, func() bool { return series()[want] > 0 })
			got := series()
			if got[`nodelocaldns_trace_spans_total{result="sent"}`] != 0 {
				t.Errorf("spans counted sent: %v", got)
			}
			if mode == "dead" {
				// One line per endpoint (the two blocks' traces).
				for _, ep := range []string{"http://localhost:9411/api/v2/spans", "http://127.0.0.1:9411/api/v2/spans"} {
					line := "spans not sent, dropping them until the collector accepts them again\" component=trace endpoint=" + ep + " "
					waitFor(t, "the failure logged", func() bool { return strings.Contains(logs.String(), line) })
					time.Sleep(1500 * time.Millisecond) // the next batches fail too
					if n := strings.Count(logs.String(), line); n != 1 {
						t.Errorf("%d log lines of the failure of %s, want 1:\n%s", n, ep, logs)
					}
				}
			}
			t.Logf("%s collector: %d queries answered in %v; %v", mode, total, took, got)
		})
	}
}

// TestTraceReload: a Corefile edit that adds trace to a block, changes
// its service and sampling, or removes it applies on reload, with the
// block table a reload swaps whole (as CoreDNS's reload makes a new
// plugin instance, the sampling count starts again).
func TestTraceReload(t *testing.T) {
	t.Parallel() // its own namespaces (or loopback port); runs beside the other trace tests
	if testing.Short() {
		t.Skip("builds our binary")
	}
	bin := buildNodelocaldns(t)
	up := upstream(t, "93.184.216.34")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &traceCollector{begin: time.Now()}
	hs := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	dir := t.TempDir()
	conf := dir + "/Corefile"
	port := testhost.FreePort(t, "127.0.0.1")
	write := func(extra string) {
		text := fmt.Sprintf(".:%d {\n    bind 127.0.0.1\n    reload 2s 1s\n%s    cache 30\n    forward . %s\n}\n", port, extra, up)
		if err := os.WriteFile(conf+".tmp", []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(conf+".tmp", conf); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	logs := &testhost.SyncBuffer{}
	start(t, []string{bin, "-localip", "127.0.0.1", "-conf", conf, "-basecorefile", dir + "/none", "-kubednscm=",
		"-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")), "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")), "-kube-dns", up}, logs)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitDNS(t, addr)
	askName := func(name string) {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		if _, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, addr); err != nil {
			t.Fatal(err)
		}
	}
	// services maps each traced name to its trace's service.
	services := func() map[string]string {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := map[string]string{}
		for _, s := range c.spans {
			if s.ParentID == "" {
				out[s.Tags["coredns.io/name"]] = s.LocalEndpoint.ServiceName
			}
		}
		return out
	}
	// settle asks fresh names until one is traced with service want.
	settle := func(step, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; ; i++ {
			name := fmt.Sprintf("probe-%s-%d.example.com.", step, i)
			askName(name)
			askName(name) // a second query: settles with every 2 too
			time.Sleep(300 * time.Millisecond)
			if services()[name] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no trace of service %q within 20s: %v", step, want, services())
			}
		}
	}
	ep := fmt.Sprintf("http://%s/api/v2/spans", l.Addr())
	askName("before.example.com.")
	write(fmt.Sprintf("    trace %s {\n        service one\n        zipkin_max_batch_interval 50ms\n    }\n", ep))
	settle("add", "one")
	write(fmt.Sprintf("    trace %s {\n        service two\n        every 2\n        zipkin_max_batch_interval 50ms\n    }\n", ep))
	settle("change", "two")
	for i := range 10 {
		askName(fmt.Sprintf("count-%d.example.com.", i))
	}
	// Removed, with log added in the same edit: once the block logs, it
	// no longer traces.
	write("    log\n")
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; !strings.Contains(logs.String(), fmt.Sprintf("probe-remove-%d.example.com.", i-1)); i++ {
		if time.Now().After(deadline) {
			t.Fatal("the edit removing trace did not apply within 20s")
		}
		askName(fmt.Sprintf("probe-remove-%d.example.com.", i))
		time.Sleep(300 * time.Millisecond)
	}
	for i := range 10 {
		askName(fmt.Sprintf("after-%d.example.com.", i))
	}
	time.Sleep(500 * time.Millisecond)
	got := services()
	counted := 0
	for n, svc := range got {
		switch {
		case strings.HasPrefix(n, "count-"):
			counted++
			if svc != "two" {
				t.Errorf("%s traced as %s", n, svc)
			}
		case strings.HasPrefix(n, "after-"), n == "before.example.com.":
			t.Errorf("%s traced without trace in the Corefile", n)
		}
	}
	if counted != 5 {
		t.Errorf("every 2: %d of 10 traced", counted)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		t.Errorf("collector: %s", strings.Join(c.errs, "\n"))
	}
}
