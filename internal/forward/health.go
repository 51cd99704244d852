package forward

import (
	"math/rand/v2"
	"time"
)

const (
	// maxFails consecutive failures mark an upstream down: one lost packet or one slow answer is
	// noise, three in a row with no success between them is an outage. A timeout counts only if
	// the upstream answered nothing else while the try waited: a few names it never answers
	// must not take it down for every other name.
	maxFails = 3
	// probeInterval is the first wait before probing a down upstream, as CoreDNS's forward plugin:
	// a restarted upstream is back in use within half a second.
	probeInterval = 500 * time.Millisecond
	// probeIntervalMax caps the probe backoff: it bounds how long a recovered upstream stays
	// marked down while others are up (when all are down, queries still try one of them).
	probeIntervalMax = 2 * time.Second
)

// failed counts a failure of u that began when u had given seen answers, and marks u down at
// maxFails, starting its probe. A timeout while u answered other queries does not count: the
// name is slow, not the server.
func (g *Group) failed(u *upstream, kind string, seen uint64) {
	if kind == KindTimeout && u.answers.Load() != seen {
		return
	}
	if g.cfg.MaxFails < 0 || u.fails.Add(1) < int32(g.cfg.MaxFails) || !u.down.CompareAndSwap(false, true) || u.gone.Load() {
		return
	}
	g.obs.Health(g.name, u.name, false)
	g.log.Warn("upstream down", "upstream", u.name, "consecutive_failures", u.fails.Load(), "last_failure", kind)
	g.startProbe(u)
}

// answered records a valid answer from u: it resets the failures and marks u up.
func (g *Group) answered(u *upstream) {
	u.answers.Add(1)
	u.fails.Store(0)
	if u.down.CompareAndSwap(true, false) && !u.gone.Load() {
		g.obs.Health(g.name, u.name, true)
		g.log.Info("upstream up", "upstream", u.name)
	}
}

// startProbe starts u's probe unless one runs or the group is closed.
func (g *Group) startProbe(u *upstream) {
	if !u.probing.CompareAndSwap(false, true) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx.Err() != nil {
		u.probing.Store(false)
		return
	}
	g.wg.Add(1)
	go g.probe(u)
}

// probe queries a down upstream for ". IN NS" (or GroupConfig.ProbeName; recursion not desired, so the upstream need not
// reach the Internet) until it is up again, then ends. Any valid answer counts, whatever its
// rcode: the upstream is alive. A TCP upstream is probed over a connection of its own, so a
// pooled connection that stopped delivering answers cannot keep it down.
func (g *Group) probe(u *upstream) {
	defer g.wg.Done()
	interval := g.cfg.ProbeInterval
	t := g.clk.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C():
		}
		if u.gone.Load() {
			return // an endpoint no longer followed: nothing to bring back
		}
		if u.down.Load() {
			query := probeQuery(uint16(rand.Uint32()), g.probeName)
			q, _ := parseQuery(query)
			if _, err := g.try(g.ctx, u, query, q, true); err == nil {
				g.answered(u)
			} else if g.ctx.Err() != nil {
				return
			}
		}
		if !u.down.Load() {
			// Up (by this probe or a query's answer). Marked down again between these
			// two lines, it needs a probe: this one goes on.
			u.probing.Store(false)
			if !u.down.Load() || !u.probing.CompareAndSwap(false, true) {
				return
			}
			interval = g.cfg.ProbeInterval
		} else {
			interval = min(2*interval, max(probeIntervalMax, g.cfg.ProbeInterval))
		}
		t.Reset(interval)
	}
}
