package server

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net/netip"
	"strconv"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// logQuery writes -querylog's line of one answered query (when
// Config.QueryLog is set: the serving path pays a nil check otherwise).
// source says where its answer came from.
func (s *Server) logQuery(client netip.AddrPort, tcp bool, q *wire.Query, resp []byte, source answer.Source, start time.Time) {
	proto := "udp"
	if tcp {
		proto = "tcp"
	}
	rcode := wire.Rcode(resp)
	if source == answer.FromCache && (rcode != wire.RcodeSuccess && rcode != wire.RcodeNXDomain && rcode != wire.RcodeServFail ||
		wire.EqualNameFold(q.Name, healthName)) {
		source = answer.FromServer
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
		slog.String("cache", source.String()))
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
