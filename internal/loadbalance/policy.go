package loadbalance

import (
	"math/rand/v2"
	"net"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Policy is a loadbalance directive with more than the plain round_robin
// policy: CoreDNS's weighted policy (a weight file) or prefer (subnets
// first). A block with plain round_robin has no Policy (Shuffle, in
// place); a Policy's answers are unpacked and packed again.
type Policy struct {
	// Weights is the weighted policy's weight file; nil: round_robin.
	Weights *Weights
	// Prefer are prefer's subnets, in the order written: after the
	// policy, the addresses in the first come first, then the second's,
	// then the rest (CoreDNS's reorderPreferredSubnets).
	Prefer []*net.IPNet
}

// Apply applies p to a NOERROR answer as CoreDNS's loadbalance writer
// does (not to AXFR/IXFR, nor to a message without a question): the
// weighted policy or round_robin, then prefer. It returns resp itself when
// nothing applies, else a new message (packed with compression).
func (p *Policy) Apply(resp []byte) []byte {
	if len(resp) < wire.HeaderLen || resp[3]&0xF != 0 || resp[2]&0x78 != 0 { // NOERROR, opcode QUERY
		return resp
	}
	m, opt, ok := unpackAnswer(resp)
	if !ok {
		return resp
	}
	if p.Weights != nil {
		switch m.Question[0].Qtype {
		case dns.TypeA, dns.TypeAAAA, dns.TypeSRV:
			t := p.Weights.table()
			m.Answer, m.Extra = t.weighted(m.Answer), t.weighted(m.Extra)
		}
	} else {
		m.Answer, m.Ns, m.Extra = roundRobin(m.Answer), roundRobin(m.Ns), roundRobin(m.Extra)
	}
	if len(p.Prefer) > 0 {
		m.Answer, m.Extra = preferred(m.Answer, p.Prefer), preferred(m.Extra, p.Prefer)
	}
	return repack(m, opt, resp)
}

// weighted is CoreDNS's weightedRoundRobin: CNAMEs, other records,
// addresses, MX, with one address drawn by weight (an address the file
// does not list for its owner weighs 1) moved to the top. A section
// without addresses is left as it is.
func (t *weightTable) weighted(in []dns.RR) []dns.RR {
	cname, address, mx, rest := byKind(in)
	if len(address) == 0 {
		return in
	}
	ws := make([]uint, len(address))
	var sum uint
	for i, r := range address {
		ws[i] = uint(t.weight(r))
		sum += ws[i]
	}
	// CoreDNS draws v in [0, sum) over the addresses sorted by weight; the
	// chance of each is its weight over the sum either way.
	v := uint(rand.N(sum))
	for i, w := range ws {
		if v < w {
			address[0], address[i] = address[i], address[0]
			break
		}
		v -= w
	}
	out := append(cname, rest...)
	out = append(out, address...)
	return append(out, mx...)
}

// preferred is CoreDNS's reorderRecords: CNAMEs, the addresses in the
// subnets' order (each subnet's in their order, then the rest), MX, then
// the other records.
func preferred(in []dns.RR, subnets []*net.IPNet) []dns.RR {
	cname, address, mx, rest := byKind(in)
	out := make([]dns.RR, 0, len(in))
	out = append(out, cname...)
	seen := make([]bool, len(address))
	for _, n := range subnets {
		for i, r := range address {
			if !seen[i] && n.Contains(addressOf(r)) {
				out = append(out, r)
				seen[i] = true
			}
		}
	}
	for i, r := range address {
		if !seen[i] {
			out = append(out, r)
		}
	}
	out = append(out, mx...)
	return append(out, rest...)
}

func addressOf(r dns.RR) net.IP {
	switch r := r.(type) {
	case *dns.A:
		return r.A
	case *dns.AAAA:
		return r.AAAA
	}
	return nil
}
