package server

import (
	"sync/atomic"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Stats counts what the server did. Fields are read by the metrics
// collector at scrape time.
type Stats struct {
	RequestsUDP atomic.Uint64
	RequestsTCP atomic.Uint64
	// Responses by rcode: index 0-15 are header rcodes, 16 is BADVERS.
	Responses [17]atomic.Uint64
	// Malformed queries answered FORMERR/NOTIMP/BADVERS; Dropped messages
	// that could not be answered at all.
	Malformed atomic.Uint64
	Dropped   atomic.Uint64
	// HealthChecks: queries for the health name, answered by the server
	// and counted neither as hits nor as misses.
	HealthChecks atomic.Uint64
	// ReflectorDrops: UDP queries from a reflector source port (see
	// reflectorPort), dropped and counted (also in Dropped).
	ReflectorDrops atomic.Uint64
	TCPConns       atomic.Int64
	TCPRefused     atomic.Uint64
	_              [64]byte
}

func (st *Stats) countRequest(tcp bool) {
	if tcp {
		st.RequestsTCP.Add(1)
	} else {
		st.RequestsUDP.Add(1)
	}
}

func (st *Stats) countRcode(rcode int) {
	if rcode == wire.RcodeBadVers {
		rcode = 16
	}
	if rcode >= 0 && rcode < len(st.Responses) {
		st.Responses[rcode].Add(1)
	}
}

// Counters is a point-in-time sum of the server's and its Resolver's
// counters. Every client query that reached the cache is exactly one of a
// hit (the cache's counters, by kind), StaleServed or CacheMisses; health
// checks, malformed and dropped queries are none of them.
type Counters struct {
	RequestsUDP, RequestsTCP uint64
	Responses                [17]uint64
	Malformed, Dropped       uint64
	// Rejected: misses not admitted (the server's bound on waiting clients
	// and the Resolver's bounds), a part of CacheMisses.
	Rejected       uint64
	Coalesced      uint64
	UpstreamErrors uint64
	// CacheMisses: client queries the cache could not answer.
	CacheMisses uint64
	// StaleServed: client queries answered stale (RFC 8767), not misses.
	StaleServed    uint64
	HealthChecks   uint64
	ReflectorDrops uint64
	TCPConns       int64
	TCPRefused     uint64
}

func (c *Counters) add(st *Stats) {
	c.RequestsUDP += st.RequestsUDP.Load()
	c.RequestsTCP += st.RequestsTCP.Load()
	for i := range st.Responses {
		c.Responses[i] += st.Responses[i].Load()
	}
	c.Malformed += st.Malformed.Load()
	c.Dropped += st.Dropped.Load()
	c.HealthChecks += st.HealthChecks.Load()
	c.ReflectorDrops += st.ReflectorDrops.Load()
	c.TCPConns += st.TCPConns.Load()
	c.TCPRefused += st.TCPRefused.Load()
}

// Snapshot sums the counters of every socket. Each UDP socket counts on its
// own cache line so the serving loops never contend on a counter.
func (s *Server) Snapshot() Counters {
	var c Counters
	c.add(&s.stats)
	rs := s.res.Stats()
	c.Rejected = rs.Rejected.Load()
	c.Coalesced = rs.Coalesced.Load()
	c.UpstreamErrors = rs.UpstreamErrors.Load()
	c.CacheMisses = rs.Misses.Load()
	c.StaleServed = rs.Stale.Load()
	for _, l := range s.udp {
		c.add(&l.stats)
	}
	return c
}

// RcodeLabel names index i of Counters.Responses.
func RcodeLabel(i int) string {
	names := [...]string{"NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED",
		"YXDOMAIN", "YXRRSET", "NXRRSET", "NOTAUTH", "NOTZONE", "RCODE11", "RCODE12", "RCODE13",
		"RCODE14", "RCODE15", "BADVERS"}
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "OTHER"
}
