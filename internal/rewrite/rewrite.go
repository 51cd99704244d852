// Package rewrite rewrites question names and, on the way back, the names
// in the answer, as CoreDNS's rewrite plugin does for its `name` rules:
// `rewrite [continue|stop] name [exact|prefix|suffix|substring|regex] FROM
// TO [answer auto | answer name FROM TO | answer value FROM TO ...]`. The
// client sees the question it asked, and (with exact rules, answer auto,
// or explicit answer rules) the names it asked for in the records.
//
// CoreDNS runs rewrite before its cache, so its cache keys the rewritten
// question. Here rewrite runs on the fetch side, behind the cache, which
// keys the client's question: the answers are the same; two names
// rewritten to one are cached (and their TTLs counted down) apart, and the
// upstream is asked once per name instead of once for both.
//
// CoreDNS sends a rule without answer rewriting (a prefix, suffix,
// substring or regex rule without `answer`) back with the rewritten
// question, which clients reject; here the question is always restored
// (the cache keys and checks it).
//
// `type` and `class` rules (`rewrite [continue|stop] type FROM TO`) change
// the question's type or class before it is asked, as CoreDNS's; the
// client gets the answer to the rewritten question under the question it
// asked (CoreDNS leaves the rewritten one in it, which clients reject; as
// for name rules, it is restored here).
//
// `ttl` and `rcode` rules (`rewrite [continue|stop] ttl|rcode [exact|
// prefix|suffix|substring|regex] NAME TTL|FROM TO`) act on the answer, which
// CoreDNS rewrites after its cache: they are parsed here and applied by the
// server to every answer of the block, cache hits too (internal/rwanswer,
// Answers); here they only end the walk of a block's rules (`stop`) where
// they match, as in CoreDNS.
//
// `edns0` rules (`rewrite [continue|stop] edns0 local|nsid|subnet
// set|replace|append|unset ...`) change the options of the query sent
// upstream, as CoreDNS's change the request its forward sends: static and
// hex values, {qname}, {qtype} and {client_ip} (the address of the client
// whose question started the fetch: resolve.Asker) and subnet from it. The
// answer is cached and shared, as in CoreDNS (its cache keys no option);
// clients asking one name at once share one fetch, so the options are the
// first one's (CoreDNS sends each concurrent miss with its own). The
// client's own options are not forwarded (the upstream query is built
// apart, with only the DO bit), so `replace` finds only what an earlier
// rule put there, and `revert` has nothing to restore. {client_port},
// {server_ip}, {server_port}, {protocol} and metadata {/label} values are
// refused: the fetch does not know them.
//
// `cname` rules rewrite CNAME targets in the answer and look the new
// target up (cname.go). The name rule's `metadata` form is refused.
package rewrite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
	"github.com/nodelocaldns/nodelocaldns/internal/rwanswer"
)

// Match types of a name rule.
const (
	Exact     = "exact"
	Prefix    = "prefix"
	Suffix    = "suffix"
	Substring = "substring"
	Regex     = "regex"
)

// maxRegexpLen is CoreDNS's bound on a pattern.
const maxRegexpLen = 10000

// Next is the rest of the chain.
type Next = directive.Next

// ErrServFail: the rewritten name is not a domain name (CoreDNS answers
// SERVFAIL).
var ErrServFail = errors.New("rewrite: SERVFAIL")

// Stats counts rewritten questions.
type Stats struct {
	Rewritten atomic.Uint64
}

// stringRewriter maps one name (or record value) to another.
type stringRewriter interface{ rewrite(string) string }

// regexRewriter replaces a name matching pattern with replacement, {N}
// standing for the Nth group.
type regexRewriter struct {
	pattern     *regexp.Regexp
	replacement string
}

func (r *regexRewriter) rewrite(s string) string {
	g := r.pattern.FindStringSubmatch(s)
	if len(g) == 0 {
		return s
	}
	return expand(r.replacement, g)
}

func expand(tmpl string, groups []string) string {
	for i, v := range groups {
		tmpl = strings.ReplaceAll(tmpl, "{"+strconv.Itoa(i)+"}", v)
	}
	return tmpl
}

// remapRewriter maps the name orig, and names under it, to replacement.
type remapRewriter struct{ orig, replacement string }

func (r *remapRewriter) rewrite(s string) string {
	if s == r.orig {
		return r.replacement
	}
	if i := len(s) - len(r.orig); i > 0 && s[i-1] == '.' && s[i:] == r.orig {
		return s[:i] + r.replacement
	}
	return s
}

// suffixRewriter replaces the suffix suffix with replacement.
type suffixRewriter struct{ suffix, replacement string }

func (r *suffixRewriter) rewrite(s string) string {
	if b, ok := strings.CutSuffix(s, r.suffix); ok {
		return b + r.replacement
	}
	return s
}

// responseRule rewrites one record of the answer: its owner name, or its
// value (the target name of SRV, MX, CNAME, NS, DNAME, NAPTR, SOA, PTR).
type responseRule struct {
	value bool
	rw    stringRewriter
	cname *cnameRule // a cname rule (rw unused)
}

func (rr responseRule) apply(r dns.RR) {
	if !rr.value {
		r.Header().Name = rr.rw.rewrite(r.Header().Name)
		return
	}
	if p := valueOf(r); p != nil && *p != "" {
		*p = rr.rw.rewrite(*p)
	}
}

func valueOf(r dns.RR) *string {
	switch r := r.(type) {
	case *dns.SRV:
		return &r.Target
	case *dns.MX:
		return &r.Mx
	case *dns.CNAME:
		return &r.Target
	case *dns.NS:
		return &r.Ns
	case *dns.DNAME:
		return &r.Target
	case *dns.NAPTR:
		return &r.Replacement
	case *dns.SOA:
		return &r.Ns
	case *dns.PTR:
		return &r.Ptr
	}
	return nil
}

// Rule is one `rewrite ... name ...`, `... type ...` or `... class ...`
// line.
type Rule struct {
	// kind is name, type or class; a type or class rule rewrites the
	// question's type (class) fromType to toType.
	kind             string
	fromType, toType uint16
	stop             bool
	match            string
	from, to         string
	pattern          *regexp.Regexp
	auto             bool
	static           []responseRule
	// answer is a ttl or rcode rule as the answer side applies it.
	answer *rwanswer.Step
	// edns0 is an edns0 rule, cname a cname rule.
	edns0       *edns0Rule
	cname       *cnameRule
	description string
}

// String is the rule as written (for errors and logs).
func (r *Rule) String() string { return r.description }

// normalize is CoreDNS's plugin.Name.Normalize: lower case, fully qualified.
func normalize(s string) string { return strings.ToLower(dns.Fqdn(s)) }

// ParseRule reads one rewrite line's arguments (after `rewrite`), as
// CoreDNS's newRule and newNameRule.
func ParseRule(args []string) (*Rule, error) {
	if len(args) == 0 {
		return nil, errors.New("no rule type specified")
	}
	r := &Rule{kind: "name", stop: true, description: strings.Join(args, " ")}
	switch strings.ToLower(args[0]) {
	case "continue":
		r.stop = false
		args = args[1:]
	case "stop":
		args = args[1:]
	}
	if len(args) == 0 {
		return nil, errors.New("continue or stop must be followed by a rule type")
	}
	switch t := strings.ToLower(args[0]); t {
	case "name":
	case "answer":
		return nil, errors.New("response rewrites must begin with a name rule")
	case "type", "class":
		if err := r.parseTypeRule(t, args); err != nil {
			return nil, err
		}
		return r, nil
	case "ttl", "rcode":
		a, err := parseAnswerRule(t, args[1:])
		if err != nil {
			return nil, err
		}
		a.Stop = r.stop
		r.kind, r.answer = t, a
		return r, nil
	case "edns0":
		e, err := parseEdns0(args[1:])
		if err != nil {
			return nil, err
		}
		r.kind, r.edns0 = t, e
		return r, nil
	case "cname":
		c, err := parseCNAME(args[1:])
		if err != nil {
			return nil, err
		}
		r.kind, r.cname = t, c
		return r, nil
	default:
		return nil, fmt.Errorf("invalid rule type %q", args[0])
	}
	if err := r.parseNameRule(args[1:]); err != nil {
		return nil, err
	}
	return r, nil
}

// parseTypeRule reads a type or class rule (CoreDNS's typeRule and
// classRule): the question's type (class) FROM becomes TO; nothing of the
// answer is rewritten back.
func (r *Rule) parseTypeRule(t string, args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("%s rules must have exactly two arguments", t)
	}
	names := dns.StringToType
	if t == "class" {
		names = dns.StringToClass
	}
	from, ok1 := names[strings.ToUpper(args[1])]
	to, ok2 := names[strings.ToUpper(args[2])]
	switch {
	case !ok1:
		return fmt.Errorf("invalid %s %q", t, strings.ToUpper(args[1]))
	case !ok2:
		return fmt.Errorf("invalid %s %q", t, strings.ToUpper(args[2]))
	}
	r.kind, r.fromType, r.toType = t, from, to
	return nil
}

// parseNameRule reads a name rule's arguments (after `name`): [MATCH]
// FROM TO and its answer rewrites.
func (r *Rule) parseNameRule(args []string) error {
	if len(args) < 2 {
		return errors.New("too few arguments for a name rule")
	}
	if len(args) == 2 {
		r.match, r.from, r.to = Exact, normalize(args[0]), normalize(args[1])
	} else {
		r.match = strings.ToLower(args[0])
		if r.match == Regex {
			r.from, r.to = args[1], args[2]
		} else {
			r.from, r.to = normalize(args[1]), normalize(args[2])
		}
	}
	answerStart := 3
	if len(args) == 2 {
		answerStart = 2
	}
	if len(args) > answerStart && args[answerStart] == "metadata" {
		return errors.New("the metadata form is not supported")
	}
	if len(args) > answerStart {
		var err error
		if r.auto, r.static, err = parseAnswers(r.match, args[answerStart:]); err != nil {
			return err
		}
	}
	switch r.match {
	case Exact:
		if _, err := validRegex(r.to, r.from); err != nil {
			return err
		}
		r.auto = true // CoreDNS: exact rules always rewrite the answer back
	case Prefix, Substring:
	case Suffix:
		if r.auto {
			// CoreDNS: the suffix's own answer rewriter, ahead of the
			// explicit ones.
			sr := &suffixRewriter{suffix: r.to, replacement: r.from}
			r.static = append([]responseRule{{rw: sr}, {value: true, rw: sr}}, r.static...)
			r.auto = false
		}
	case Regex:
		p, err := validRegex(r.from, r.to)
		if err != nil {
			return err
		}
		r.pattern, r.to = p, normalize(r.to)
	default:
		return fmt.Errorf("name rule supports only exact, prefix, suffix, substring, and regex name matching, received: %s", r.match)
	}
	return nil
}

func parseAnswers(match string, args []string) (bool, []responseRule, error) {
	if len(args) < 2 {
		return false, nil, fmt.Errorf("invalid arguments for %s rule", match)
	}
	auto, names := false, 0
	var rules []responseRule
	last := ""
	for i := 0; i < len(args); {
		if last == "" && args[i] != "answer" {
			return false, nil, fmt.Errorf("unexpected %q: answer rules begin with answer", args[i])
		}
		if args[i] == "answer" {
			i++
		}
		if i == len(args) {
			return false, nil, fmt.Errorf("type missing for answer rule for %s rule", match)
		}
		last = args[i]
		i++
		switch last {
		case "auto":
			auto = true
		case "name", "value":
			if len(args)-i < 2 {
				return false, nil, fmt.Errorf("%s answer rule for %s rule: 2 arguments required", last, match)
			}
			p, err := validRegex(args[i], args[i+1])
			if err != nil {
				return false, nil, fmt.Errorf("%s answer rule for %s rule: %v", last, match, err)
			}
			rules = append(rules, responseRule{value: last == "value", rw: &regexRewriter{pattern: p, replacement: normalize(args[i+1])}})
			if last == "name" {
				names++
			}
			i += 2
		default:
			return false, nil, fmt.Errorf("invalid type %q for answer rule for %s rule", last, match)
		}
	}
	if auto && names > 0 {
		return false, nil, errors.New("auto name answer rule cannot be combined with explicit name answer rules")
	}
	return auto, rules, nil
}

func validRegex(from, to string) (*regexp.Regexp, error) {
	if len(from) > maxRegexpLen {
		return nil, fmt.Errorf("regex pattern too long: %d > %d", len(from), maxRegexpLen)
	}
	p, err := regexp.Compile(from)
	if err != nil {
		return nil, fmt.Errorf("invalid regex matching pattern: %s", from)
	}
	used := 0
	for i := 0; i <= 100; i++ {
		if strings.Contains(to, "{"+strconv.Itoa(i)+"}") {
			used++
		}
	}
	if used > p.NumSubexp() {
		return nil, fmt.Errorf("the rewrite pattern (%s) uses more subexpressions than its matching pattern (%s)", to, from)
	}
	return p, nil
}

// apply rewrites name; ok is false when the rule does not match.
func (r *Rule) apply(name string) (string, bool) {
	switch r.match {
	case Exact:
		if name == r.from {
			return r.to, true
		}
	case Prefix:
		if after, ok := strings.CutPrefix(name, r.from); ok {
			return r.to + after, true
		}
	case Suffix:
		if before, ok := strings.CutSuffix(name, r.from); ok {
			return before + r.replacementSuffix(), true
		}
	case Substring:
		if strings.Contains(name, r.from) {
			return strings.ReplaceAll(name, r.from, r.to), true
		}
	case Regex:
		if g := r.pattern.FindStringSubmatch(name); len(g) > 0 {
			return expand(r.to, g), true
		}
	}
	return "", false
}

func (r *Rule) replacementSuffix() string { return r.to }

// Handler is one block's rewrite rules, in the order written.
type Handler struct {
	rules []*Rule
	Stats Stats
	// Lookup resolves a cname rule's new target through its block; nil:
	// cname rules do nothing.
	Lookup directive.Lookup
	// Log is where a failed lookup is told; nil: nowhere.
	Log *slog.Logger
	// Asker gives the client a fetch asks for (edns0 rules' {client_ip}
	// and subnet); nil: none.
	Asker func(ctx context.Context) netip.Addr
}

// New returns the handler of rules.
func New(rules []*Rule) *Handler { return &Handler{rules: rules} }

// Serve rewrites r's question, asks next, and rewrites the answer back.
func (h *Handler) Serve(ctx context.Context, r *dns.Msg, next Next) (*dns.Msg, error) {
	if len(r.Question) != 1 {
		return next(ctx, r)
	}
	orig := r.Question[0]
	var back []responseRule
	done := false
	for _, rule := range h.rules {
		if rule.cname != nil {
			// Applies to every question, on the answer (CoreDNS's
			// RewriteDone).
			back, done = append(back, responseRule{cname: rule.cname}), true
			if rule.stop {
				break
			}
			continue
		}
		if rule.edns0 != nil {
			var client netip.Addr
			if h.Asker != nil {
				client = h.Asker(ctx)
			}
			if rule.edns0.apply(r, client) {
				done = true
				if rule.stop {
					break
				}
			}
			continue
		}
		if rule.answer != nil {
			// ttl and rcode rules act on the answer (Answers); a match
			// with stop ends the walk here too.
			if rule.stop && rule.answer.Match(strings.ToLower(r.Question[0].Name)) {
				break
			}
			continue
		}
		if rule.kind != "name" {
			q := &r.Question[0].Qtype
			if rule.kind == "class" {
				q = &r.Question[0].Qclass
			}
			if *q != rule.fromType {
				continue
			}
			*q, done = rule.toType, true
			if rule.stop {
				break
			}
			continue
		}
		cur := strings.ToLower(r.Question[0].Name)
		n, ok := rule.apply(cur)
		if !ok {
			continue
		}
		if _, ok := dns.IsDomainName(n); !ok {
			r.Question[0] = orig
			return nil, fmt.Errorf("%w: invalid name after rewrite: %s", ErrServFail, n)
		}
		r.Question[0].Name = n
		done = true
		if rule.auto {
			// Back to the name this rule saw (a continue rule's
			// successors map back to it in turn).
			rw := &remapRewriter{orig: n, replacement: cur}
			back = append(back, responseRule{rw: rw}, responseRule{value: true, rw: rw})
		}
		back = append(back, rule.static...)
		if rule.stop {
			break
		}
	}
	if !done {
		return next(ctx, r)
	}
	h.Stats.Rewritten.Add(1)
	m, err := next(ctx, r)
	asked := r.Question[0]
	r.Question[0] = orig
	if err != nil {
		return nil, err
	}
	m = m.Copy()
	m.Question = []dns.Question{orig}
	h.rewriteBack(ctx, back, m, asked.Qtype)
	return m, nil
}

// rewriteBack applies the response rules back (the last first) to every
// record of the answer m to a question of type qtype.
func (h *Handler) rewriteBack(ctx context.Context, back []responseRule, m *dns.Msg, qtype uint16) {
	if len(back) == 0 {
		return
	}
	for _, sec := range [][]dns.RR{m.Ns, m.Answer, m.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			for i := len(back) - 1; i >= 0; i-- {
				if back[i].cname != nil {
					h.rewriteCNAME(ctx, back[i].cname, m, rr, qtype)
					continue
				}
				back[i].apply(rr)
			}
		}
	}
}
