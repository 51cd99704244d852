// Package acl is the Corefile's `acl` directive, as CoreDNS 1.15's acl
// plugin reads and runs it: rules of a block that refuse (block: REFUSED),
// empty (filter: NOERROR, no records) or drop (no answer) the queries of
// some zones from some client networks and query types, or let them pass
// (allow). An operator keeps pods from the node's answers for a name (the
// metadata service's, a cloud's internal zone) by their network.
//
// The directive is read here (corefile.Register) and runs before the
// cache, on every query of its block, hits too (answer.Register): a
// refused, emptied or dropped query is never cached, coalesced or
// forwarded, and what it is answered is the client's own. Its answers are
// CoreDNS's: the question, no records, an OPT (the client's UDP size when
// it sent EDNS, else 4096, as CoreDNS's server leaves it; DO set either
// way) holding an Extended DNS Error (RFC 8914: Blocked, 15, or Filtered,
// 17). The rules see the name the client asked: a rewrite in the same
// block would run before acl in CoreDNS and after our cache here, so the
// two are refused together.
package acl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func init() {
	corefile.Register("acl", corefile.Spec{
		Parse:      parse,
		Check:      check,
		Repeatable: true,
		Forms:      "acl [ZONES...] { allow|block|filter|drop [type QTYPE...|*] [net SOURCE...|*] }",
		Describe:   describe,
	})
	answer.Register("acl", setup)
}

// Action is what a matching policy does with a query.
type Action uint8

const (
	none   Action = iota // no policy matched: the next rule decides
	Allow                // the query goes on (no later rule is asked)
	Block                // REFUSED, EDE Blocked
	Filter               // NOERROR without records, EDE Filtered
	Drop                 // no answer
)

var actionNames = [...]string{"", "allow", "block", "filter", "drop"}

// Policy is one line of an acl block: its action for the queries of the
// given types (nil: every type) from the given networks (nil: every
// address).
type Policy struct {
	Action Action
	Types  []uint16
	Nets   []netip.Prefix
}

// Rule is one acl directive: its zones (lower-case FQDNs) and policies, in
// the order written.
type Rule struct {
	Zones    []string
	Policies []Policy
}

// parse reads one acl line and its block into a Rule, appended to the
// block's ([]Rule).
func parse(s *corefile.Server, d *corefile.Directive, prev any) (any, error) {
	rules, _ := prev.([]Rule)
	zones, err := corefile.ZonesOf(s, d, d, d.Args)
	if err != nil {
		return nil, err
	}
	r := Rule{Zones: zones}
	for _, o := range d.Block {
		p, err := parsePolicy(d, o)
		if err != nil {
			return nil, err
		}
		r.Policies = append(r.Policies, p)
	}
	return append(rules, r), nil
}

// parsePolicy reads `ACTION [type QTYPE...] [net SOURCE...]`, as CoreDNS
// does: each section's values up to the next section's name; `*` stands
// for every type or address (and ends its section).
func parsePolicy(d, o *corefile.Directive) (Policy, error) {
	var p Policy
	a := slices.Index(actionNames[1:], strings.ToLower(o.Name))
	if a < 0 {
		return p, corefile.BadOpt(d, o, "unexpected token %q; expect 'allow', 'block', 'filter' or 'drop'", o.Name)
	}
	p.Action = Action(a + 1)
	if o.HasBlock {
		return p, corefile.BadOpt(d, o, "%s takes no block", o.Name)
	}
	args := o.ArgStrings()
	// A section left out, or a "*" in it: every type, every address.
	typed, netted, anyType, anyNet := false, false, false, false
	for len(args) > 0 {
		section := strings.ToLower(args[0])
		if section != "type" && section != "net" {
			return p, corefile.BadOpt(d, o, "unexpected token %q; expect 'type | net'", args[0])
		}
		i := 1
		for i < len(args) && !isSection(args[i]) {
			i++
		}
		vals := args[1:i]
		args = args[i:]
		if len(vals) == 0 {
			return p, corefile.BadOpt(d, o, "no token specified in %q section", section)
		}
		var err error
		var all bool
		if section == "type" {
			typed = true
			p.Types, all, err = parseTypes(vals, p.Types)
			anyType = anyType || all
		} else {
			netted = true
			p.Nets, all, err = parseNets(vals, p.Nets)
			anyNet = anyNet || all
		}
		if err != nil {
			return p, corefile.BadOpt(d, o, "%v", err)
		}
	}
	if !typed || anyType {
		p.Types = nil
	}
	if !netted || anyNet {
		p.Nets = nil
	}
	return p, nil
}

func isSection(tok string) bool {
	t := strings.ToLower(tok)
	return t == "type" || t == "net"
}

// parseTypes adds vals' query types to have; "*" is every type (all) and
// ends the section, as in CoreDNS.
func parseTypes(vals []string, have []uint16) (_ []uint16, all bool, _ error) {
	for _, v := range vals {
		if v == "*" {
			return have, true, nil
		}
		t, ok := dns.StringToType[v]
		if !ok {
			return nil, false, fmt.Errorf("unexpected token %q; expect legal QTYPE", v)
		}
		have = append(have, t)
	}
	return have, false, nil
}

// parseNets adds vals' networks (a single address is its /32 or /128) to
// have; "*" is every address (all) and ends the section, as in CoreDNS.
func parseNets(vals []string, have []netip.Prefix) (_ []netip.Prefix, all bool, _ error) {
	for _, v := range vals {
		if v == "*" {
			return have, true, nil
		}
		if !strings.Contains(v, "/") {
			if strings.Contains(v, ":") {
				v += "/128"
			} else {
				v += "/32"
			}
		}
		n, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, false, fmt.Errorf("illegal CIDR notation %q", v)
		}
		have = append(have, n.Masked())
	}
	return have, false, nil
}

// check refuses acl beside rewrite: CoreDNS's rules see the name rewrite
// made, ours (before the cache) the name asked.
func check(s *corefile.Server, cfg any) (any, error) {
	if s.Has("rewrite") {
		return nil, corefile.ErrorAt(s.Pos, "acl with rewrite in the same block is not supported: CoreDNS's acl sees the name rewrite made, ours runs before the cache and sees the name asked; give acl a block of its own")
	}
	return cfg, nil
}

// describe says what the block's rules do, for -check-config.
func describe(_ *corefile.Server, cfg any) []string {
	var out []string
	for _, r := range cfg.([]Rule) {
		var ps []string
		for _, p := range r.Policies {
			types, nets := "every type", "every address"
			if len(p.Types) > 0 {
				var ts []string
				for _, t := range p.Types {
					ts = append(ts, dns.TypeToString[t])
				}
				types = strings.Join(ts, " ")
			}
			if len(p.Nets) > 0 {
				nets = fmt.Sprint(p.Nets)
			}
			ps = append(ps, fmt.Sprintf("%s %s from %s", actionNames[p.Action], types, nets))
		}
		out = append(out, fmt.Sprintf("acl %s: %s; else allowed (before the cache: a refused, filtered or dropped query is never cached or forwarded)", strings.Join(r.Zones, " "), strings.Join(ps, "; ")))
	}
	return out
}

// rule is a Rule compiled for the serving path.
type rule struct {
	zones    [][]byte // wire, lower-case
	policies []Policy
}

// Handler runs a block's rules on each query, before the cache.
type Handler struct {
	answer.Keeper
	rules []rule
}

// setup compiles a block's rules ([]Rule).
func setup(_ answer.Env, cfg any) (answer.Handler, error) {
	rules, _ := cfg.([]Rule)
	if len(rules) == 0 {
		return nil, nil
	}
	h := &Handler{}
	for _, r := range rules {
		cr := rule{policies: r.Policies}
		for _, z := range r.Zones {
			w, ok := wire.AppendNameWire(nil, z)
			if !ok {
				return nil, fmt.Errorf("acl: zone %q", z)
			}
			cr.zones = append(cr.zones, w)
		}
		h.rules = append(h.rules, cr)
	}
	return h, nil
}

// Query decides the query: the first rule whose zones hold its name and
// one of whose policies matches its type and client decides; allow, or no
// match, lets it pass.
func (h *Handler) Query(r *answer.Request, out []byte) ([]byte, answer.Verdict) {
	client := r.Client.Addr().Unmap()
	for i := range h.rules {
		rl := &h.rules[i]
		if !slices.ContainsFunc(rl.zones, func(z []byte) bool { return wire.InZone(r.Q.Name, z) }) {
			continue
		}
		switch match(rl.policies, r.Q.Type, client) {
		case Allow:
			return out, answer.Pass
		case Block:
			return appendAnswer(out, r, wire.RcodeRefused, dns.ExtendedErrorCodeBlocked), answer.Answered
		case Filter:
			return appendAnswer(out, r, wire.RcodeSuccess, dns.ExtendedErrorCodeFiltered), answer.Answered
		case Drop:
			return out, answer.Drop
		}
	}
	return out, answer.Pass
}

// match is the action of the first policy matching qtype and client.
func match(policies []Policy, qtype uint16, client netip.Addr) Action {
	for _, p := range policies {
		if len(p.Types) > 0 && !slices.Contains(p.Types, qtype) {
			continue
		}
		if len(p.Nets) > 0 && !slices.ContainsFunc(p.Nets, func(n netip.Prefix) bool { return n.Contains(client) }) {
			continue
		}
		return p.Action
	}
	return none
}

// appendAnswer appends CoreDNS's acl answer: the question, no records, an
// OPT with the Extended DNS Error ede.
func appendAnswer(out []byte, r *answer.Request, rcode int, ede uint16) []byte {
	q := r.Q
	flags := wire.FlagQR | q.Flags&(0x7800|wire.FlagRD|wire.FlagCD) | uint16(rcode) // SetReply: opcode, RD, CD
	out = binary.BigEndian.AppendUint16(out, q.ID)
	out = binary.BigEndian.AppendUint16(out, flags)
	out = append(out, 0, 1, 0, 0, 0, 0, 0, 1)
	out = append(out, r.Raw[wire.HeaderLen:q.QEnd]...)
	// acl sets 4096 and DO; CoreDNS's server gives it the client's size
	// when the client sent EDNS, and keeps DO (SizeAndDo clears the
	// version and the extended rcode only).
	size, ttl := uint16(4096), uint32(1<<15)
	if q.EDNS {
		size = q.Size
	}
	out = append(out, 0) // the root
	out = binary.BigEndian.AppendUint16(out, wire.TypeOPT)
	out = binary.BigEndian.AppendUint16(out, size)
	out = binary.BigEndian.AppendUint32(out, ttl)
	out = binary.BigEndian.AppendUint16(out, 6)            // RDLENGTH
	out = binary.BigEndian.AppendUint16(out, dns.EDNS0EDE) // OPTION-CODE
	out = binary.BigEndian.AppendUint16(out, 2)            // OPTION-LENGTH
	return binary.BigEndian.AppendUint16(out, ede)         // INFO-CODE, no text
}
