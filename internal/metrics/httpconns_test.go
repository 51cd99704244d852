package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// keepAlive opens a connection from src, sends one GET /ready with
// keep-alive and reads the answer, leaving the connection idle.
func keepAlive(t *testing.T, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("from %s: %v", src, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c
}

func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !strings.Contains(err.Error(), "timeout")
}

func serveTest(t *testing.T, cfg HTTPConfig) (*Metrics, string) {
	t.Helper()
	m := New(nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	a, err := m.Serve(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, a.String()
}

// TestHTTPConnectionsAreBoundedPerClient: one client holding keep-alive
// connections keeps at most the bound less its reserve (each new one
// closes its own longest-idle one), and another client still gets in.
func TestHTTPConnectionsAreBoundedPerClient(t *testing.T) {
	m, addr := serveTest(t, HTTPConfig{})
	var hog []net.Conn
	for range httpMaxConns {
		hog = append(hog, keepAlive(t, addr, "127.0.0.2"))
	}
	kept := httpMaxConns - httpMaxConns/4
	if !closedWithin(hog[0], 2*time.Second) {
		t.Fatal("the hog's longest-idle connection is still open")
	}
	if closedWithin(hog[len(hog)-1], 50*time.Millisecond) {
		t.Fatal("the hog's newest connection was closed")
	}
	if n := testutil.ToFloat64(m.httpEvicted.WithLabelValues("metrics")); n != float64(httpMaxConns-kept) {
		t.Fatalf("evicted %v, want %d", n, httpMaxConns-kept)
	}
	// Another client gets its connections at once.
	for range 8 {
		keepAlive(t, addr, "127.0.0.3")
	}
}

// TestHTTPIdleConnectionsAreClosed: a keep-alive connection with no
// request is closed after the idle timeout; one that never sends a request
// after the header timeout.
func TestHTTPIdleConnectionsAreClosed(t *testing.T) {
	defer func(i, h time.Duration) { httpIdleTimeout, httpHeaderTimeout = i, h }(httpIdleTimeout, httpHeaderTimeout)
	httpIdleTimeout, httpHeaderTimeout = 300*time.Millisecond, 300*time.Millisecond
	_, addr := serveTest(t, HTTPConfig{})
	idle := keepAlive(t, addr, "127.0.0.1")
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if !closedWithin(idle, 3*time.Second) {
		t.Fatal("an idle keep-alive connection outlived the idle timeout")
	}
	if !closedWithin(silent, 3*time.Second) {
		t.Fatal("a connection that sent nothing outlived the header timeout")
	}
}

// TestProbesBusy: past httpMaxProbes checks at once, a check answers 503
// at once and is counted.
func TestProbesBusy(t *testing.T) {
	release := make(chan struct{})
	var running sync.WaitGroup
	running.Add(httpMaxProbes)
	slow := func(ctx context.Context) error {
		running.Done()
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	m, addr := serveTest(t, HTTPConfig{Health: slow, Ready: slow})
	var wg sync.WaitGroup
	for i := range httpMaxProbes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/health"
			if i%2 == 1 {
				path = "/ready"
			}
			resp, err := http.Get("http://" + addr + path)
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	running.Wait()
	resp, err := http.Get("http://" + addr + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	close(release)
	wg.Wait()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a check over the bound: %d, want 503", resp.StatusCode)
	}
	if n := testutil.ToFloat64(m.httpRejects.WithLabelValues("metrics", "probe_busy")); n != 1 {
		t.Fatalf("probe_busy %v, want 1", n)
	}
}

// TestPProfOnlyOnItsOwnListener: the metrics listener never serves
// /debug/pprof/; ServePProf does.
func TestPProfOnlyOnItsOwnListener(t *testing.T) {
	m, addr := serveTest(t, HTTPConfig{})
	resp, err := http.Get("http://" + addr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("pprof on the metrics listener: %d, want 404", resp.StatusCode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pa, err := m.ServePProf(ctx, "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get("http://" + pa.String() + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("pprof on its listener: %d", resp.StatusCode)
	}
	resp, err = http.Get("http://" + pa.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/metrics on the pprof listener: %d, want 404", resp.StatusCode)
	}
}
