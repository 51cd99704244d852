package rewrite

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/rwanswer"
)

// Answers returns the answer side of a block's rules (internal/rwanswer):
// every rule, in order, so that the ttl and rcode rules see the question
// the earlier rules rewrote and a stop ends the walk as here; nil when no
// rule is a ttl or rcode rule.
func Answers(rules []*Rule) *rwanswer.Rules {
	steps := make([]rwanswer.Step, 0, len(rules))
	for _, r := range rules {
		switch {
		case r.answer != nil:
			steps = append(steps, *r.answer)
		case r.cname != nil:
			steps = append(steps, rwanswer.Step{Kind: rwanswer.Always, Stop: r.stop})
		case r.edns0 != nil:
			steps = append(steps, rwanswer.Step{Kind: rwanswer.Opt, Stop: r.stop, Opt: &r.edns0.OptRule})
		case r.kind == "type":
			steps = append(steps, rwanswer.Step{Kind: rwanswer.Type, Stop: r.stop, From: r.fromType, To: r.toType})
		case r.kind == "class":
			steps = append(steps, rwanswer.Step{Kind: rwanswer.Class, Stop: r.stop, From: r.fromType, To: r.toType})
		default:
			steps = append(steps, rwanswer.Step{Kind: rwanswer.Name, Stop: r.stop, Rename: r.apply})
		}
	}
	return rwanswer.New(steps)
}

// parseAnswerRule reads a ttl or rcode rule's arguments (after the rule
// type), as CoreDNS's newTTLRule and newRCodeRule: `[MATCH] NAME TTL` with
// TTL a number or a range MIN-MAX (either end may be left out, not both),
// `[MATCH] NAME FROM TO` with rcodes by name or number (0-23).
func parseAnswerRule(kind string, args []string) (*rwanswer.Step, error) {
	values := 1
	if kind == "rcode" {
		values = 2
	}
	if len(args) < 1+values {
		return nil, fmt.Errorf("too few (%d) arguments for a %s rule", len(args), kind)
	}
	if len(args) > 2+values {
		return nil, fmt.Errorf("too many (%d) arguments for a %s rule", len(args), kind)
	}
	s := &rwanswer.Step{Kind: rwanswer.TTL}
	v := args[len(args)-values:]
	if kind == "ttl" {
		var ok bool
		if s.Min, s.Max, ok = parseTTL(v[0]); !ok {
			return nil, fmt.Errorf("invalid TTL '%s' for a ttl rule", v[0])
		}
	} else {
		s.Kind = rwanswer.Rcode
		from, ok := parseRcode(v[0])
		if !ok {
			return nil, fmt.Errorf("invalid matching RCODE '%s' for a rcode rule", v[0])
		}
		to, ok := parseRcode(v[1])
		if !ok {
			return nil, fmt.Errorf("invalid replacement RCODE '%s' for a rcode rule", v[1])
		}
		s.From, s.To = from, to
	}
	match, name := Exact, args[0]
	if len(args) == 2+values {
		match, name = strings.ToLower(args[0]), args[1]
	}
	switch match {
	case Exact:
		n := normalize(name)
		s.Match = func(q string) bool { return q == n }
	case Prefix:
		n := normalize(name)
		s.Match = func(q string) bool { return strings.HasPrefix(q, n) }
	case Suffix:
		n := normalize(name)
		s.Match = func(q string) bool { return strings.HasSuffix(q, n) }
	case Substring:
		n := normalize(name)
		s.Match = func(q string) bool { return strings.Contains(q, n) }
	case Regex:
		if len(name) > maxRegexpLen {
			return nil, fmt.Errorf("regex pattern too long in a %s rule: %d > %d", kind, len(name), maxRegexpLen)
		}
		p, err := regexp.Compile(name)
		if err != nil {
			return nil, fmt.Errorf("invalid regex pattern in a %s rule: %s", kind, name)
		}
		s.Match = func(q string) bool { return p.MatchString(q) }
	default:
		return nil, fmt.Errorf("%s rule supports only exact, prefix, suffix, substring, and regex name matching", kind)
	}
	return s, nil
}

// parseTTL is CoreDNS's isValidTTL: N, MIN-MAX, MIN- (up to 2^31-1) or
// -MAX (from 0); not "-", not MIN > MAX.
func parseTTL(v string) (lo, hi uint32, ok bool) {
	a, b, rng := strings.Cut(v, "-")
	num := func(s string, def uint32) (uint32, bool) {
		if s == "" {
			return def, true
		}
		n, err := strconv.ParseUint(s, 10, 32)
		return uint32(n), err == nil
	}
	if !rng {
		n, ok := num(a, 0)
		return n, n, ok && a != ""
	}
	if a == "" && b == "" || strings.Contains(b, "-") {
		return 0, 0, false
	}
	lo, ok1 := num(a, 0)
	hi, ok2 := num(b, 2147483647)
	if !ok1 || !ok2 || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}

// parseRcode is CoreDNS's isValidRCode: a number up to 23 or a name.
func parseRcode(v string) (uint16, bool) {
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return uint16(n), n <= 23
	}
	c, ok := dns.StringToRcode[strings.ToUpper(v)]
	return uint16(c), ok
}
