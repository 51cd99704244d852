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
	// Rejected misses over the in-flight bound; Coalesced misses that
	// waited on another client's upstream query.
	Rejected  atomic.Uint64
	Coalesced atomic.Uint64
	// UpstreamErrors: misses answered SERVFAIL because forwarding failed
	// or the answer was unusable.
	UpstreamErrors atomic.Uint64
	// StaleServed: answers served stale (RFC 8767).
	StaleServed atomic.Uint64
	TCPConns    atomic.Int64
	TCPRefused  atomic.Uint64
	_           [64]byte
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

// Counters is a point-in-time sum of the server's Stats.
type Counters struct {
	RequestsUDP, RequestsTCP uint64
	Responses                [17]uint64
	Malformed, Dropped       uint64
	Rejected, Coalesced      uint64
	UpstreamErrors           uint64
	StaleServed              uint64
	TCPConns                 int64
	TCPRefused               uint64
}

func (c *Counters) add(st *Stats) {
	c.RequestsUDP += st.RequestsUDP.Load()
	c.RequestsTCP += st.RequestsTCP.Load()
	for i := range st.Responses {
		c.Responses[i] += st.Responses[i].Load()
	}
	c.Malformed += st.Malformed.Load()
	c.Dropped += st.Dropped.Load()
	c.Rejected += st.Rejected.Load()
	c.Coalesced += st.Coalesced.Load()
	c.UpstreamErrors += st.UpstreamErrors.Load()
	c.StaleServed += st.StaleServed.Load()
	c.TCPConns += st.TCPConns.Load()
	c.TCPRefused += st.TCPRefused.Load()
}

// Snapshot sums the counters of every socket. Each UDP socket counts on its
// own cache line so the serving loops never contend on a counter.
func (s *Server) Snapshot() Counters {
	var c Counters
	c.add(&s.stats)
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
