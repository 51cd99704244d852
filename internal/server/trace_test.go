package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/trace"
)

// spanSink is a Zipkin collector: the spans posted, decoded.
type spanSink struct {
	mu    sync.Mutex
	spans []struct {
		ID, ParentID, Name string
		Tags               map[string]string
	}
}

func (k *spanSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var spans []struct {
		ID, ParentID, Name string
		Tags               map[string]string
	}
	if err := json.NewDecoder(r.Body).Decode(&spans); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	k.mu.Lock()
	k.spans = append(k.spans, spans...)
	k.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

// roots are the traces posted: the root's name, proto and rcode tags and
// its number of descendants.
func (k *spanSink) roots() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, s := range k.spans {
		if s.ParentID == "" {
			n := 0
			for cur := s.ID; ; n++ {
				i := slices.IndexFunc(k.spans, func(x struct {
					ID, ParentID, Name string
					Tags               map[string]string
				}) bool {
					return x.ParentID == cur
				})
				if i < 0 {
					break
				}
				cur = k.spans[i].ID
			}
			out = append(out, strings.Join([]string{s.Tags["coredns.io/name"], s.Tags["coredns.io/proto"], s.Tags["coredns.io/rcode"]}, " ")+" "+string(rune('0'+n)))
		}
	}
	slices.Sort(out)
	return out
}

// tracing makes every block of the server traced to a sink, each
// every-th query; a block with hits stopping at cache, misses through
// forward.
func tracing(t testing.TB, every uint64) (func(*resolve.Config), *trace.Tracer, *spanSink) {
	t.Helper()
	k := &spanSink{}
	var h http.Handler = k
	if _, bench := t.(*testing.B); bench {
		// The collector's own decoding is not the server's cost.
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusAccepted)
		})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg := trace.Config{Endpoint: srv.URL + "/api/v2/spans", Every: every, BatchInterval: 10 * time.Millisecond}
	cfg.Normalize()
	exp := trace.StartExporter(cfg, nil, nil)
	t.Cleanup(func() { _ = exp.Close() })
	tr := trace.NewTracer(cfg, []string{"cache", "forward"}, netip.MustParseAddrPort("127.0.0.1:53"), exp)
	return newChained([]string{"trace"}, tr).rmut, tr, k
}

// TestTraceHitsAndMisses: a traced block's queries over UDP and TCP, hits
// and misses, each give one trace, the hits' ending at cache, the misses'
// through forward and connect; the health name is not traced.
func TestTraceHitsAndMisses(t *testing.T) {
	mut, _, k := tracing(t, 1)
	s, _ := startServer(t, nil, mut)
	for _, q := range []struct{ network, name string }{
		{"udp", "a.example."}, {"udp", "a.example."}, {"tcp", "B.example."}, {"tcp", "b.example."},
		{"udp", "health-check.nodelocaldns.invalid."}, {"tcp", "health-check.nodelocaldns.invalid."},
	} {
		addr := s.Addr().String()
		if q.network == "tcp" {
			addr = s.TCPAddr().String()
		}
		m := new(dns.Msg)
		m.SetQuestion(q.name, dns.TypeA)
		c := &dns.Client{Net: q.network, Timeout: 3 * time.Second}
		if _, _, err := c.Exchange(m, addr); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"a.example. udp NOERROR 1", "a.example. udp NOERROR 3", "b.example. tcp NOERROR 1", "b.example. tcp NOERROR 3"}
	deadline := time.Now().Add(5 * time.Second)
	for len(k.roots()) < len(want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if got := k.roots(); !slices.Equal(got, want) {
		t.Fatalf("traces %q, want %q", got, want)
	}
}

// BenchmarkUDPHitTraced is BenchmarkUDPHit with a traced block: every
// 1,000th query sampled (the count alone for the others), and every query
// sampled (a span each, posted to a collector on loopback that discards
// them: the exporter's own work, its allocations too, runs beside the
// server's and is counted with it). Compare with
// BenchmarkUDPHit in the same run.
func BenchmarkUDPHitTraced(b *testing.B) {
	for _, every := range []uint64{1000, 1} {
		b.Run("every="+map[uint64]string{1000: "1000", 1: "1"}[every], func(b *testing.B) {
			mut, _, _ := tracing(b, every)
			benchmarkUDPHit(b, nil, mut)
		})
	}
}
