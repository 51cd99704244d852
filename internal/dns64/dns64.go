// Package dns64 synthesises AAAA records from A records (RFC 6147) for
// IPv6-only clusters, as CoreDNS's dns64 plugin does (`dns64 [PREFIX] {
// prefix PREFIX; translate_all; allow_ipv4 }`, PREFIX 64:ff9b::/96 by
// default): an AAAA question whose answer has no AAAA record (and is not
// NXDOMAIN) is answered with the name's A records mapped into the prefix,
// each with the smaller of the A record's TTL and the AAAA denial's SOA
// TTL (600 s without one). translate_all synthesises even when AAAA
// records exist.
//
// CoreDNS runs dns64 before its cache and decides per client: without
// allow_ipv4 a client that reached it over IPv4 gets the plain answer.
// Here dns64 runs on the fetch side, where one fetch serves every client
// asking the question, so the decision is per listen family
// (internal/config's checkDNS64): without allow_ipv4, a block whose
// addresses are all IPv4 has no client CoreDNS translates for (the
// directive is dropped, with a note), one whose addresses are all IPv6
// translates as written, and one listening on both families is refused.
// The synthesised answer is cached as one answer (CoreDNS caches the AAAA
// and A answers it combines and synthesises on each query): the same
// records, the TTLs counted from the synthesis.
package dns64

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// DefaultPrefix is RFC 6052's well-known prefix.
var DefaultPrefix = netip.MustParsePrefix("64:ff9b::/96")

// defaultSOATTL caps synthesised TTLs when the AAAA answer has no SOA
// (CoreDNS's value).
const defaultSOATTL = 600

// Config is one `dns64` directive.
type Config struct {
	Prefix       netip.Prefix
	TranslateAll bool
	AllowIPv4    bool
}

// ParsePrefix checks a prefix as CoreDNS does: IPv6, length 32, 40, 48,
// 56, 64 or 96 (RFC 6052 §2.2).
func ParsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if !p.Addr().Is6() {
		return netip.Prefix{}, fmt.Errorf("%q is not an IPv6 prefix", s)
	}
	switch p.Bits() {
	case 32, 40, 48, 56, 64, 96:
	default:
		return netip.Prefix{}, fmt.Errorf("invalid prefix length %d in %q (32, 40, 48, 56, 64 or 96)", p.Bits(), s)
	}
	return p.Masked(), nil
}

// Next is the rest of the chain.
type Next = directive.Next

// Lookup asks for the A records of name through the block (CoreDNS's
// upstream).
type Lookup = directive.Lookup

// Stats counts synthesised answers (CoreDNS:
// coredns_dns64_requests_translated_total).
type Stats struct {
	Translated atomic.Uint64
}

// Handler is one block's dns64.
type Handler struct {
	cfg    Config
	lookup Lookup
	Stats  Stats
	out    atomic.Pointer[atomic.Uint64]
}

// Report makes the handler count translations in c too (internal/metrics'
// coredns_dns64_requests_translated_total counter), from now on.
func (h *Handler) Report(c *atomic.Uint64) { h.out.Store(c) }

// New returns a handler; lookup asks for A records.
func New(cfg Config, lookup Lookup) *Handler {
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = DefaultPrefix
	}
	return &Handler{cfg: cfg, lookup: lookup}
}

// Serve passes r on and, for an AAAA question without AAAA answer,
// synthesises one from the A records.
func (h *Handler) Serve(ctx context.Context, r *dns.Msg, next Next) (*dns.Msg, error) {
	if len(r.Question) != 1 || r.Question[0].Qtype != dns.TypeAAAA || r.Question[0].Qclass != dns.ClassINET {
		return next(ctx, r)
	}
	orig, err := next(ctx, r)
	if err != nil || !h.translate(orig) {
		return orig, err
	}
	a, err := h.lookup(ctx, r.Question[0].Name, dns.TypeA)
	if err != nil {
		return nil, fmt.Errorf("dns64: A lookup: %w", err)
	}
	if a == nil {
		return nil, fmt.Errorf("dns64: upstream returned no response")
	}
	h.Stats.Translated.Add(1)
	if c := h.out.Load(); c != nil {
		c.Add(1)
	}
	return h.synthesize(r, orig, a), nil
}

// translate is CoreDNS's responseShouldDNS64: not for NXDOMAIN; with
// translate_all always; else when the answer has no AAAA.
func (h *Handler) translate(m *dns.Msg) bool {
	if m.Rcode == dns.RcodeNameError && hasSOA(m.Ns) {
		return false // response.Typify's NameError needs the SOA
	}
	if h.cfg.TranslateAll {
		return true
	}
	for _, rr := range m.Answer {
		if rr.Header().Rrtype == dns.TypeAAAA {
			return false
		}
	}
	return true
}

func hasSOA(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if rr.Header().Rrtype == dns.TypeSOA {
			return true
		}
	}
	return false
}

func (h *Handler) synthesize(req, orig, a *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Rcode, m.Truncated = a.Rcode, a.Truncated
	m.Ns, m.Extra = a.Ns, a.Extra
	soaTTL := uint32(defaultSOATTL)
	for _, rr := range orig.Ns {
		if rr.Header().Rrtype == dns.TypeSOA {
			soaTTL = rr.Header().Ttl
		}
	}
	for _, rr := range a.Answer {
		ar, ok := rr.(*dns.A)
		if !ok {
			m.Answer = append(m.Answer, rr)
			continue
		}
		v4, ok := netip.AddrFromSlice(ar.A)
		if !ok || !v4.Unmap().Is4() {
			continue
		}
		hdr := rr.Header()
		m.Answer = append(m.Answer, &dns.AAAA{
			Hdr:  dns.RR_Header{Name: hdr.Name, Rrtype: dns.TypeAAAA, Class: hdr.Class, Ttl: min(hdr.Ttl, soaTTL)},
			AAAA: Embed(h.cfg.Prefix, v4.Unmap()).AsSlice(),
		})
	}
	return m
}

// Embed maps v4 into prefix as RFC 6052 §2.2 does (bits 64-71 stay zero).
func Embed(prefix netip.Prefix, v4 netip.Addr) netip.Addr {
	p := prefix.Addr().As16()
	a := v4.As4()
	var v6 [16]byte
	n := prefix.Bits() / 8
	i, j := 0, 0
	for ; i < n; i++ {
		v6[i] = p[i]
	}
	for ; i < 8 && j < 4; i, j = i+1, j+1 {
		v6[i] = a[j]
	}
	if i == 8 {
		i++
	}
	for ; j < 4; i, j = i+1, j+1 {
		v6[i] = a[j]
	}
	return netip.AddrFrom16(v6)
}
