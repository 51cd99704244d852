package server

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net/netip"
	"strconv"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Where an answer came from, for the query log.
const (
	fromCache    = "hit"      // a cache entry
	fromUpstream = "miss"     // resolved upstream (or SERVFAIL) after a miss
	fromStale    = "stale"    // a stale entry (RFC 8767) after a miss
	fromServer   = "local"    // an error or the health name, answered by the server itself
	fromOverload = "overload" // not admitted (flight bound, waiters per question, waiting clients)
	fromAutopath = "autopath" // answered (or dropped) by autopath (autopath.go)
)

// logOn reports whether answered queries are logged (-querylog, or the
// Corefile's log of some block: acts as loaded by the caller): the serving
// path calls logQuery only then.
func (s *Server) logOn(acts uint32) bool { return s.cfg.QueryLog != nil || acts&actLog != 0 }

// logQuery writes the query log lines of one answered query: -querylog's
// and the Corefile's log of its block (blog, nil: none; dnslog). local is
// the address it arrived on, query the query as received. It is only
// called when logOn: the serving path pays a nil check and a load
// otherwise.
func (s *Server) logQuery(blog *dnslog.Log, client netip.AddrPort, local netip.Addr, tcp bool, q *wire.Query, query []byte, resp []byte, source string, start time.Time) {
	if blog != nil && !(source == fromCache && wire.EqualNameFold(q.Name, healthName)) {
		blog.Log(&dnslog.Entry{Remote: client, Local: local, TCP: tcp, Q: q, Query: query, Resp: resp, Duration: s.cfg.Clock.Now().Sub(start)})
	}
	if s.cfg.QueryLog == nil {
		return
	}
	proto := "udp"
	if tcp {
		proto = "tcp"
	}
	rcode := wire.Rcode(resp)
	if source == fromCache && (rcode != wire.RcodeSuccess && rcode != wire.RcodeNXDomain && rcode != wire.RcodeServFail ||
		wire.EqualNameFold(q.Name, healthName)) {
		source = fromServer
	}
	name := ""
	if len(q.Name) > 0 {
		name = wire.NameString(q.Name)
	}
	s.cfg.QueryLog.LogAttrs(context.Background(), slog.LevelInfo, "query",
		slog.String("client", client.String()),
		slog.String("proto", proto),
		slog.String("name", name),
		slog.String("type", typeString(q.Type)),
		slog.String("rcode", RcodeLabel(rcode)),
		slog.Duration("duration", s.cfg.Clock.Now().Sub(start)),
		slog.String("cache", source))
}

var typeNames = map[uint16]string{
	wire.TypeA: "A", wire.TypeNS: "NS", wire.TypeCNAME: "CNAME", wire.TypeSOA: "SOA", wire.TypePTR: "PTR",
	wire.TypeMX: "MX", wire.TypeTXT: "TXT", wire.TypeAAAA: "AAAA", wire.TypeSRV: "SRV", wire.TypeANY: "ANY",
	64: "SVCB", 65: "HTTPS", 257: "CAA", 43: "DS", 48: "DNSKEY", 46: "RRSIG", 47: "NSEC", 50: "NSEC3",
	251: "IXFR", 252: "AXFR",
}

func typeString(t uint16) string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// sockaddrAddrPort decodes a raw struct sockaddr_in or sockaddr_in6 (as
// recvmmsg fills it in; the family is in host byte order, the port in
// network order).
func sockaddrAddrPort(sa []byte) netip.AddrPort {
	if len(sa) < 8 {
		return netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(sa[2:4])
	switch binary.NativeEndian.Uint16(sa[0:2]) {
	case afInet:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port)
	case afInet6:
		if len(sa) >= 24 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])).Unmap(), port)
		}
	}
	return netip.AddrPort{}
}
