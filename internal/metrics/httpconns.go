package metrics

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
)

// The HTTP listeners' bounds. Every pod on the node reaches the metrics
// port (hostNetwork): without them one pod holding keep-alive connections
// grew the daemon by ~17 KiB each until the OOM killer came (8,000 took
// 139 MiB and stayed open). Variables so tests can shorten them.
var (
	// httpMaxConns bounds a listener's open connections, apportioned by
	// client address (package fair: a client may hold 8 while the reserve
	// of 64 is kept, more while nobody else needs them). Kubelet's probes
	// and a Prometheus scrape need a handful; 256 idle connections cost
	// about 4 MiB.
	httpMaxConns = 256
	// httpIdleTimeout closes a keep-alive connection with no request for
	// this long; a connection that sends nothing is closed after
	// httpHeaderTimeout, one whose request does not arrive whole after
	// httpReadTimeout, one that does not read its answer after
	// httpWriteTimeout (a scrape of every series is well under a second).
	httpIdleTimeout   = 15 * time.Second
	httpHeaderTimeout = 5 * time.Second
	httpReadTimeout   = 10 * time.Second
	httpWriteTimeout  = 20 * time.Second
	// httpMaxProbes bounds the /health and /ready checks running at once
	// on a listener (each may send a DNS query): kubelet runs one of each
	// at a time; past it a check answers 503 at once, counted.
	httpMaxProbes = 8
)

// connLimiter is a listener that keeps at most httpMaxConns connections
// open, by client share: when the table is full, or the client holds its
// share and only the reserve is free, an idle connection makes room (the
// client's own longest-idle one when it holds its share, else the
// heaviest client's, else the longest-idle of all); with none idle the
// new connection is closed. Idle is what net/http's ConnState says: new
// (no request yet) or idle (between keep-alive requests).
type connLimiter struct {
	net.Listener
	onReject func(reason string) // counted by the caller
	onEvict  func()

	mu     sync.Mutex
	shares *fair.Shares
	conns  map[net.Conn]*limitedConn
}

type limitedConn struct {
	net.Conn
	l         *connLimiter
	client    netip.Addr
	idle      bool      // under l.mu
	idleSince time.Time // under l.mu
	closeOnce sync.Once
}

func newConnLimiter(ln net.Listener, max int, onReject func(string), onEvict func()) *connLimiter {
	return &connLimiter{Listener: ln, shares: fair.NewOnePool(max), conns: make(map[net.Conn]*limitedConn), onReject: onReject, onEvict: onEvict}
}

// Accept returns the next connection it keeps.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var client netip.Addr
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			client = a.AddrPort().Addr().Unmap()
		}
		if lc := l.admit(c, client); lc != nil {
			return lc, nil
		}
		_ = c.Close()
	}
}

func (l *connLimiter) admit(c net.Conn, client netip.Addr) *limitedConn {
	l.mu.Lock()
	var victim *limitedConn
	if v := l.shares.Take(client); v != fair.Taken {
		prefer, anyone := l.shares.MakeRoom(client, v)
		victim = l.longestIdle(func(o *limitedConn) bool { return o.client == prefer })
		if victim == nil && anyone {
			victim = l.longestIdle(func(*limitedConn) bool { return true })
		}
		if victim == nil {
			l.mu.Unlock()
			if v == fair.OverShare {
				l.onReject("client_share")
			} else {
				l.onReject("conns")
			}
			return nil
		}
		delete(l.conns, victim) // its unit goes to the new one
		l.shares.Replace(victim.client, client)
	}
	lc := &limitedConn{Conn: c, l: l, client: client, idle: true, idleSince: time.Now()}
	l.conns[lc] = lc
	l.mu.Unlock()
	if victim != nil {
		l.onEvict()
		_ = victim.Conn.Close()
	}
	return lc
}

// longestIdle is the idle connection, among those ok accepts, idle the
// longest; l.mu is held.
func (l *connLimiter) longestIdle(ok func(*limitedConn) bool) *limitedConn {
	var best *limitedConn
	for _, o := range l.conns {
		if o.idle && ok(o) && (best == nil || o.idleSince.Before(best.idleSince)) {
			best = o
		}
	}
	return best
}

// forget gives up c's place; l.mu is held.
func (l *connLimiter) forget(c *limitedConn) {
	if _, ok := l.conns[c]; ok {
		delete(l.conns, c)
		l.shares.Put(c.client)
	}
}

// connState is the http.Server's ConnState hook: it tells idle
// connections from busy ones.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateActive:
		lc.idle = false
	case http.StateIdle:
		lc.idle, lc.idleSince = true, time.Now()
	case http.StateHijacked, http.StateClosed:
		l.forget(lc)
	}
}

// Close gives up the connection's place and closes it.
func (c *limitedConn) Close() error {
	c.closeOnce.Do(func() {
		c.l.mu.Lock()
		c.l.forget(c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// probeLimiter bounds the probe handlers running at once.
type probeLimiter chan struct{}

// try takes a slot, or reports false when httpMaxProbes run.
func (p probeLimiter) try() bool {
	select {
	case p <- struct{}{}:
		return true
	default:
		return false
	}
}

func (p probeLimiter) done() { <-p }
