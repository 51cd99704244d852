package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
)

// Probe answers a health or readiness check: nil means healthy.
type Probe func(ctx context.Context) error

// HTTPConfig configures one HTTP listener.
type HTTPConfig struct {
	Addr       string
	Health     Probe // /health: 200 when nil is returned, else 500
	Ready      Probe // /ready: 200 when nil is returned, else 503
	HealthOnly bool  // serve /health and /ready only (no /metrics)
	// PProfOnly: serve /debug/pprof/ only (ServePProf).
	PProfOnly bool
	// Log gets one line if the listener stops serving with an error;
	// nil discards it (the error is counted either way).
	Log *slog.Logger
}

// listener is the listener label of nodelocaldns_http_errors_total.
func (c HTTPConfig) listener() string {
	switch {
	case c.HealthOnly:
		return "health"
	case c.PProfOnly:
		return "pprof"
	}
	return "metrics"
}

// newHTTPErrors registers nodelocaldns_http_errors_total, with both
// listeners at 0 from the start so an increase() alert works.
func newHTTPErrors(r *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "http_errors_total",
		Help: "HTTP listeners (metrics, health) that stopped serving with an error; the endpoint is gone until the daemon restarts.",
	}, []string{"listener"})
	c.WithLabelValues("metrics")
	c.WithLabelValues("health")
	r.MustRegister(c)
	return c
}

// newHTTPBounds registers nodelocaldns_http_rejects_total and
// nodelocaldns_http_evicted_total (httpconns.go), at 0 from the start.
func newHTTPBounds(r *prometheus.Registry) (rejects, evicted *prometheus.CounterVec) {
	rejects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "http_rejects_total",
		Help: "HTTP connections closed at once and probes refused, by listener and reason: conns (the listener's connection bound, none idle to close), client_share (the client held its share, none of its own idle), probe_busy (a /health or /ready check over the bound on concurrent checks: 503).",
	}, []string{"listener", "reason"})
	evicted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "http_evicted_total",
		Help: "Idle HTTP connections closed to make room for a new one, by listener.",
	}, []string{"listener"})
	for _, l := range []string{"metrics", "health"} {
		for _, why := range []string{"conns", "client_share", "probe_busy"} {
			rejects.WithLabelValues(l, why)
		}
		evicted.WithLabelValues(l)
	}
	r.MustRegister(rejects, evicted)
	return rejects, evicted
}

// httpProbeTimeout bounds one /health or /ready handler: kubelet's default
// HTTP probe timeout is 1 s.
const httpProbeTimeout = 900 * time.Millisecond

// Serve listens on cfg.Addr and serves /metrics, /health, /ready (and
// pprof when enabled) until ctx is done. It returns once listening, with
// the bound address; if serving fails after that (the listening socket
// broke), the error is logged once and counted in
// nodelocaldns_http_errors_total: DNS goes on, the exec probes do not use
// this listener.
//
// The listener sets SO_REUSEPORT, so the instance that replaces this one
// during a rolling update can listen on the same address while this one
// still runs: each connection reaches one of them. That is fine for
// scrapes; a kubelet probe that must reach one instance uses the exec
// probe instead (daemon.Probe).
func (m *Metrics) Serve(ctx context.Context, cfg HTTPConfig) (net.Addr, error) {
	mux := http.NewServeMux()
	switch {
	case cfg.PProfOnly:
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	default:
		if !cfg.HealthOnly {
			mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
		}
		probes := make(probeLimiter, httpMaxProbes)
		busy := m.httpRejects.WithLabelValues(cfg.listener(), "probe_busy")
		mux.HandleFunc("/health", probeHandler(m.cd.timedHealth(cfg.Health), http.StatusInternalServerError, probes, busy))
		mux.HandleFunc("/ready", probeHandler(cfg.Ready, http.StatusServiceUnavailable, probes, busy))
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("http listen %s: %w", cfg.Addr, err)
	}
	m.serveOn(ctx, ln, mux, cfg)
	return ln.Addr(), nil
}

// ServePProf serves /debug/pprof/ alone on addr (PProfAddr's default is
// loopback: config), with the same bounds as the other listeners.
func (m *Metrics) ServePProf(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	return m.Serve(ctx, HTTPConfig{Addr: addr, PProfOnly: true, Log: log})
}

// serveOn serves handler on ln until ctx is done, logging and counting a
// serving error. Connections are bounded by client share (connLimiter)
// and by time (httpconns.go).
func (m *Metrics) serveOn(ctx context.Context, ln net.Listener, handler http.Handler, cfg HTTPConfig) {
	name := cfg.listener()
	lim := newConnLimiter(ln, httpMaxConns,
		func(why string) { m.httpRejects.WithLabelValues(name, why).Inc() },
		func() { m.httpEvicted.WithLabelValues(name).Inc() })
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: httpHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    8 << 10,
		ConnState:         lim.connState,
	}
	if cfg.PProfOnly {
		// A CPU profile or trace writes for as long as asked (?seconds=,
		// 30 by default); pprof refuses one longer than WriteTimeout.
		srv.WriteTimeout = 0
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(lim); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.httpErrors.WithLabelValues(name).Inc()
			if cfg.Log != nil {
				cfg.Log.Error("HTTP listener stopped serving; its endpoints are gone until restart", "listener", name, "addr", ln.Addr().String(), "err", err)
			}
		}
	}()
}

// probeHandler answers a probe: 200 "ok" when p returns nil, else
// failCode; 503 at once when httpMaxProbes checks run already (counted in
// busy).
func probeHandler(p Probe, failCode int, slots probeLimiter, busy prometheus.Counter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p == nil {
			fmt.Fprintln(w, "ok")
			return
		}
		if !slots.try() {
			busy.Inc()
			http.Error(w, "busy: too many checks at once", http.StatusServiceUnavailable)
			return
		}
		defer slots.done()
		ctx, cancel := context.WithTimeout(r.Context(), httpProbeTimeout)
		defer cancel()
		if err := p(ctx); err != nil {
			http.Error(w, err.Error(), failCode)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}
