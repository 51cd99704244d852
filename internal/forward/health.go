package forward

import (
	"encoding/binary"
	"math/rand/v2"
	"time"
)

const (
	// maxFails consecutive failures mark an upstream down: one lost packet or one slow answer is
	// noise, three in a row with no success between them is an outage.
	maxFails = 3
	// probeInterval is the first wait before probing a down upstream, as CoreDNS's forward plugin:
	// a restarted upstream is back in use within half a second.
	probeInterval = 500 * time.Millisecond
	// probeIntervalMax caps the probe backoff: while every upstream is down queries fail fast, so
	// the probe interval is how long an outage outlives the upstream's recovery.
	probeIntervalMax = 2 * time.Second
)

// failed counts a failure of u and marks it down at maxFails, starting its probe.
func (g *Group) failed(u *upstream, kind string) {
	if u.fails.Add(1) < maxFails || !u.down.CompareAndSwap(false, true) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx.Err() != nil {
		return
	}
	g.obs.Health(g.name, u.name, false)
	g.log.Warn("upstream down", "upstream", u.name, "consecutive_failures", u.fails.Load(), "last_failure", kind)
	g.wg.Add(1)
	go g.probe(u)
}

// probe queries a down upstream for ". IN NS" (recursion not desired, so the upstream need not
// reach the Internet) until it answers, then marks it up. Any valid answer counts, whatever its
// rcode: the upstream is alive. Probes use the group's transport, and may dial a TCP upstream
// during the dial backoff (the probe interval is the pacing then).
func (g *Group) probe(u *upstream) {
	defer g.wg.Done()
	interval := probeInterval
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		query := probeQuery()
		q, _ := parseQuery(query)
		if _, err := g.try(g.ctx, u, query, q, true); err == nil {
			u.fails.Store(0)
			u.down.Store(false)
			g.obs.Health(g.name, u.name, true)
			g.log.Info("upstream up", "upstream", u.name)
			return
		} else if g.ctx.Err() != nil {
			return
		}
		interval = min(2*interval, probeIntervalMax)
		t.Reset(interval)
	}
}

// probeQuery returns ". IN NS" with a random ID and RD clear.
func probeQuery() []byte {
	m := make([]byte, headerLen+5)
	binary.BigEndian.PutUint16(m, uint16(rand.Uint32()))
	binary.BigEndian.PutUint16(m[4:], 1)           // QDCOUNT
	m[headerLen] = 0                               // root name
	binary.BigEndian.PutUint16(m[headerLen+1:], 2) // NS
	binary.BigEndian.PutUint16(m[headerLen+3:], 1) // IN
	return m
}
