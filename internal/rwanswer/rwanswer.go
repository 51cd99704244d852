// Package rwanswer is the answer side of the Corefile's rewrite: the `ttl`
// and `rcode` rules, which CoreDNS's rewrite plugin applies to the answer
// it writes back. CoreDNS's plugin.cfg puts rewrite before cache, so these
// rules act on every answer, cache hits too, after the cache has counted
// the TTLs down: the server applies Rules.Apply to every answer it sends
// whose block has such rules (a property of the block in internal/blocks'
// table, as loadbalance is), so our cache keeps the upstream's TTLs and
// rcode and they count down as they do in CoreDNS's.
//
// Which rules apply to an answer is decided as CoreDNS decides it: the
// block's rules are walked in the order written, on the question the
// client asked, each name, type or class rule rewriting the question the
// later rules see, a matching rule with `stop` ending the walk (the fetch
// side, internal/rewrite, walks the same rules on the same question). The
// ttl and rcode rules that matched are then applied to each record of the
// answer (OPT apart), in the reverse order, as CoreDNS's ResponseReverter
// does: a ttl rule clamps the record's TTL into its range; an rcode rule
// replaces its FROM rcode by TO (once more per record, so chained rcode
// rules see each other's result as CoreDNS's do; once when the answer has
// no record).
//
// The common answer is rewritten in place with one allocation (the
// question's name as text, which the rules match); an rcode beyond the
// header's 4 bits is applied by unpacking and packing the answer (an answer
// without OPT cannot carry one: it is then sent as it was, where CoreDNS
// fails to write it). It opens no socket and knows no zone.
package rwanswer

import (
	"encoding/binary"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Kind is what a step of the walk is.
type Kind uint8

// The kinds of rewrite rule, as the answer side sees them.
const (
	// Name rewrites the question's name (Step.Rename).
	Name Kind = iota
	// Type and Class rewrite the question's type (class) From to To.
	Type
	Class
	// TTL clamps the answer's TTLs into [Min, Max] when Match holds.
	TTL
	// Rcode replaces the answer's rcode From by To when Match holds.
	Rcode
	// Opt is an edns0 rule (Step.Opt): it acts on the query sent
	// upstream; here it only counts for the walk's stop.
	Opt
	// Always is a rule that applies to every question and acts elsewhere
	// (cname, on the fetch side): here it only counts for the walk's stop.
	Always
)

// Step is one rewrite rule.
type Step struct {
	Kind Kind
	// Stop: when the rule applies, the walk ends (CoreDNS's `stop`, the
	// default).
	Stop bool
	// Rename is a name rule's rewrite of the lower-case question name: the
	// new name and whether the rule matched.
	Rename func(name string) (string, bool)
	// Match is a ttl or rcode rule's test of the lower-case question
	// name.
	Match func(name string) bool
	// From, To: a type or class rule's type (class), an rcode rule's
	// rcode.
	From, To uint16
	// Min, Max: a ttl rule's range.
	Min, Max uint32
	// Opt is an edns0 rule.
	Opt *OptRule
}

// maxActs bounds the rules applied to one answer without allocating;
// more are still applied.
const maxActs = 8

// Rules is a block's rewrite rules, in the order written; nil when none is
// a ttl or rcode rule (then no answer is touched).
type Rules struct {
	steps []Step
}

// New returns the rules of steps, nil when no step acts on the answer.
func New(steps []Step) *Rules {
	for _, s := range steps {
		if s.Kind == TTL || s.Kind == Rcode {
			return &Rules{steps: steps}
		}
	}
	return nil
}

// Apply applies the rules to the answer resp, in place or (an extended
// rcode) by returning a repacked answer. A message it cannot read is
// returned unchanged.
func (r *Rules) Apply(resp []byte) []byte {
	if r == nil || len(resp) < wire.HeaderLen {
		return resp
	}
	if qd, _, _, _ := wire.Counts(resp); qd != 1 {
		return resp
	}
	var buf [maxActs]*Step
	acts := r.match(resp, buf[:0])
	if len(acts) == 0 {
		return resp
	}
	for _, a := range acts {
		if a.Kind == Rcode && (a.From > 0xF || a.To > 0xF) {
			return applyMsg(resp, acts)
		}
	}
	if !applyWire(resp, acts) {
		return applyMsg(resp, acts)
	}
	return resp
}

// match walks the rules on resp's question and returns the ttl and rcode
// rules that apply, in the order written.
func (r *Rules) match(resp []byte, acts []*Step) []*Step {
	qname, _, err := dns.UnpackDomainName(resp, wire.HeaderLen)
	if err != nil {
		return nil
	}
	_, qtype, qclass, _, err := wire.ReadQuestion(resp)
	if err != nil {
		return nil
	}
	name := strings.ToLower(qname)
	var opts optSet
	for i := range r.steps {
		s := &r.steps[i]
		done := false
		switch s.Kind {
		case Name:
			n, ok := s.Rename(name)
			if !ok {
				continue
			}
			if _, ok := dns.IsDomainName(n); !ok {
				// CoreDNS answers SERVFAIL with no rule applied.
				return nil
			}
			name, done = n, true
		case Type:
			if qtype == s.From {
				qtype, done = s.To, true
			}
		case Class:
			if qclass == s.From {
				qclass, done = s.To, true
			}
		case TTL, Rcode:
			if s.Match(name) {
				acts, done = append(acts, s), true
			}
		case Opt:
			done = opts.apply(s.Opt)
		case Always:
			done = true
		}
		if done && s.Stop {
			break
		}
	}
	return acts
}

// applyWire applies acts to resp in place; false: resp is not readable
// here (the caller tries the slow way).
func applyWire(resp []byte, acts []*Step) bool {
	_, an, ns, ar := wire.Counts(resp)
	_, _, _, off, err := wire.ReadQuestion(resp)
	if err != nil {
		return false
	}
	// Check the whole message before touching it.
	end := off
	for i := 0; i < int(an)+int(ns)+int(ar); i++ {
		if end, err = wire.SkipName(resp, end); err != nil || end+10 > len(resp) {
			return false
		}
		end += 10 + int(binary.BigEndian.Uint16(resp[end+8:]))
		if end > len(resp) {
			return false
		}
	}
	n := 0
	for i := 0; i < int(an)+int(ns)+int(ar); i++ {
		off, _ = wire.SkipName(resp, off)
		typ := binary.BigEndian.Uint16(resp[off:])
		if typ != dns.TypeOPT {
			n++
			for j := len(acts) - 1; j >= 0; j-- {
				applyRR(resp, off, acts[j])
			}
		}
		off += 10 + int(binary.BigEndian.Uint16(resp[off+8:]))
	}
	if n == 0 {
		for j := len(acts) - 1; j >= 0; j-- {
			applyRR(resp, -1, acts[j])
		}
	}
	return true
}

// applyRR applies one rule for the record whose type is at resp[off:]
// (off < 0: for the message alone, rcode rules only).
func applyRR(resp []byte, off int, a *Step) {
	switch a.Kind {
	case TTL:
		if off < 0 {
			return
		}
		t := binary.BigEndian.Uint32(resp[off+4:])
		if t < a.Min {
			t = a.Min
		} else if t > a.Max {
			t = a.Max
		}
		binary.BigEndian.PutUint32(resp[off+4:], t)
	case Rcode:
		if uint16(wire.Rcode(resp)) == a.From {
			resp[3] = resp[3]&0xF0 | byte(a.To)
		}
	}
}

// applyMsg applies acts by unpacking resp and packing it again, as
// CoreDNS's ResponseReverter applies them to a message.
func applyMsg(resp []byte, acts []*Step) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(resp); err != nil {
		return resp
	}
	rrs := 0
	for _, sec := range [][]dns.RR{m.Ns, m.Answer, m.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			rrs++
			for j := len(acts) - 1; j >= 0; j-- {
				applyMsgRR(m, rr, acts[j])
			}
		}
	}
	if rrs == 0 {
		for j := len(acts) - 1; j >= 0; j-- {
			applyMsgRR(m, nil, acts[j])
		}
	}
	m.Compress = true
	out, err := m.Pack()
	if err != nil {
		return resp
	}
	return out
}

func applyMsgRR(m *dns.Msg, rr dns.RR, a *Step) {
	switch a.Kind {
	case TTL:
		if rr == nil {
			return
		}
		if h := rr.Header(); h.Ttl < a.Min {
			h.Ttl = a.Min
		} else if h.Ttl > a.Max {
			h.Ttl = a.Max
		}
	case Rcode:
		if m.Rcode == int(a.From) {
			m.Rcode = int(a.To)
		}
	}
}
