package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

func TestServeMetricsAndProbes(t *testing.T) {
	m := New(func() server.Counters {
		var c server.Counters
		c.RequestsUDP = 7
		c.Responses[3] = 2
		return c
	}, cache.New(cache.Config{}))
	m.Failure("kube-dns", "10.96.0.10:53", "timeout")
	m.Backend("nft")
	m.Backend("legacy") // the last choice is the only one reported
	var wedged atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, HTTPConfig{
		Addr: "127.0.0.1:0",
		Health: func(context.Context) error {
			if wedged.Load() {
				return errors.New("listener wedged")
			}
			return nil
		},
		Ready: func(context.Context) error { return errors.New("starting") },
	})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	for _, want := range []string{
		`nodelocaldns_requests_total{proto="udp"} 7`,
		`nodelocaldns_responses_total{rcode="NXDOMAIN"} 2`,
		`nodelocaldns_setup_errors_total{type="interface_add"} 0`,
		`nodelocaldns_setup_errors_total{type="configmap"} 0`,
		`nodelocaldns_upstream_failures_total{group="kube-dns",kind="timeout",upstream="10.96.0.10:53"} 1`,
		`nodelocaldns_iptables_backend{backend="legacy"} 1`,
		`nodelocaldns_cache_entries{type="success"} 0`,
		`nodelocaldns_build_info{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `backend="nft"`) {
		t.Error("stale backend label")
	}
	if code, _ := get("/health"); code != 200 {
		t.Fatalf("/health %d", code)
	}
	wedged.Store(true)
	if code, body := get("/health"); code != 500 || !strings.Contains(body, "wedged") {
		t.Fatalf("/health %d %q", code, body)
	}
	if code, _ := get("/ready"); code != 503 {
		t.Fatalf("/ready %d", code)
	}
}

// TestHTTPListenerErrorIsLoggedAndCounted: when the listening socket breaks
// under a serving listener, one line is logged and
// nodelocaldns_http_errors_total counts it (it starts at 0).
func TestHTTPListenerErrorIsLoggedAndCounted(t *testing.T) {
	m := New(nil, nil)
	if got := httpErrors(t, m, "health"); got != 0 {
		t.Fatalf("http errors %v before any", got)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs testhost.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.serveOn(ctx, ln, http.NotFoundHandler(), HTTPConfig{HealthOnly: true, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	ln.Close() // the socket breaks under the server
	deadline := time.Now().Add(10 * time.Second)
	for httpErrors(t, m, "health") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the serving error was not counted")
		}
		time.Sleep(time.Millisecond)
	}
	for logs.String() == "" {
		if time.Now().After(deadline) {
			t.Fatal("the serving error was not logged")
		}
		time.Sleep(time.Millisecond)
	}
	if l := logs.String(); strings.Count(l, "\n") != 1 || !strings.Contains(l, "listener=health") || !strings.Contains(l, "level=ERROR") {
		t.Errorf("log %q: want one error line naming the listener", l)
	}
	if got := httpErrors(t, m, "metrics"); got != 0 {
		t.Errorf("metrics listener counted %v errors", got)
	}
}

// httpErrors reads nodelocaldns_http_errors_total{listener} as a scrape would.
func httpErrors(t *testing.T, m *Metrics, listener string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "nodelocaldns_http_errors_total" {
			continue
		}
		for _, c := range mf.GetMetric() {
			if l := c.GetLabel(); len(l) == 1 && l[0].GetValue() == listener {
				return c.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no nodelocaldns_http_errors_total{listener=%q}", listener)
	return 0
}
