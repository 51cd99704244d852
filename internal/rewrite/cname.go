package rewrite

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// cnameRule is `rewrite [continue|stop] cname [exact|prefix|suffix|
// substring|regex] FROM TO`, as CoreDNS's cnameTargetRule: it applies to
// every question (so a stop ends the walk there), and in the answer each
// CNAME whose target matches gets the new target, the records after it
// replaced by the answer to the new target (same type), looked up through
// the target's block (Handler.Lookup, as CoreDNS asks its own server).
//
// CoreDNS rewrites each answer after its cache, looking the new target up
// every time; here the rewritten answer is what the cache keeps: the same
// records, counted down as one entry (the shortest TTL of both decides
// when it is asked again) instead of two.
type cnameRule struct {
	match    string
	from, to string
	pattern  *regexp.Regexp
}

func parseCNAME(args []string) (*cnameRule, error) {
	c := &cnameRule{}
	switch len(args) {
	case 3:
		c.match = strings.ToLower(args[0])
		switch c.match {
		case Exact, Prefix, Suffix, Substring, Regex:
		default:
			return nil, fmt.Errorf("unknown cname rewrite type: %s", c.match)
		}
		c.from, c.to = strings.ToLower(args[1]), strings.ToLower(args[2])
	case 2:
		c.match, c.from, c.to = Exact, strings.ToLower(args[0]), strings.ToLower(args[1])
	default:
		return nil, fmt.Errorf("too few (%d) arguments for a cname rule", len(args))
	}
	if c.match == Exact {
		c.from, c.to = normalize(c.from), normalize(c.to)
	}
	if c.match == Regex {
		if len(c.from) > maxRegexpLen {
			return nil, fmt.Errorf("regex pattern too long in a cname rule: %d > %d", len(c.from), maxRegexpLen)
		}
		p, err := regexp.Compile(c.from)
		if err != nil {
			return nil, fmt.Errorf("invalid cname rewrite regex pattern: %w", err)
		}
		c.pattern = p
	}
	return c, nil
}

// target gives the new target of a CNAME whose target is t; ok false: the
// rule does not match it.
func (c *cnameRule) target(t string) (string, bool) {
	switch c.match {
	case Exact:
		return c.to, t == c.from
	case Prefix:
		if after, ok := strings.CutPrefix(t, c.from); ok {
			return c.to + after, true
		}
	case Suffix:
		if before, ok := strings.CutSuffix(t, c.from); ok {
			return before + c.to, true
		}
	case Substring:
		if strings.Contains(t, c.from) {
			return strings.ReplaceAll(t, c.from, c.to), true
		}
	case Regex:
		g := c.pattern.FindStringSubmatch(t)
		if len(g) == 0 {
			return "", false
		}
		s := c.to
		for i, v := range g {
			s = strings.ReplaceAll(s, "{"+strconv.Itoa(i)+"}", v)
		}
		return s, true
	}
	return "", false
}

// rewriteCNAME applies c to the record rr of m (the answer to a question
// of type qtype), as CoreDNS's RewriteResponse does.
func (h *Handler) rewriteCNAME(ctx context.Context, c *cnameRule, m *dns.Msg, rr dns.RR, qtype uint16) {
	cn, ok := rr.(*dns.CNAME)
	if !ok || h.Lookup == nil {
		return
	}
	from := cn.Target
	to, ok := c.target(from)
	if !ok {
		return
	}
	up, err := h.Lookup(ctx, to, qtype)
	if err != nil || up == nil {
		if h.Log != nil {
			h.Log.Warn("rewrite cname: lookup of the new target failed", "target", to, "err", err)
		}
		return
	}
	var answer []dns.RR
	for _, a := range m.Answer {
		if x, ok := a.(*dns.CNAME); ok {
			answer = append(answer, a)
			if x.Target == from {
				x.Target = to
				break
			}
		}
	}
	m.Answer = append(answer, up.Answer...)
	m.Truncated = up.Truncated
}
