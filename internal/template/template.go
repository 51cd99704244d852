// Package template answers questions from Go text/template records, as
// CoreDNS's template plugin does (`template CLASS TYPE [ZONE...] { match
// REGEX...; answer "RR"; additional "RR"; authority "RR"; rcode CODE;
// fallthrough [ZONE...] }`), above all `template IN AAAA { rcode NOERROR }`,
// which stops AAAA lookups on IPv4-only clusters.
//
// It runs on the fetch side of the cache, as in CoreDNS where `cache` comes
// before `template` in plugin.cfg: a miss reaches Handler.Serve, whose answer
// the cache stores like any other. Answers are authoritative (AA), each
// record's TTL as written (3600 when the record has none, as miekg/dns
// parses it).
//
// Templates see .Name, .Type, .Class, .Zone, .Match, .Group, .Regex,
// .Message, .Question and .Remote as CoreDNS documents them. .Remote is the
// address of the client whose question the fetch asks (Handler.Asker,
// resolve.Asker): the first of the clients asking one question at once,
// and its answer is then cached and served to every client until it
// expires, exactly as CoreDNS's cache in front of template serves the first
// client's answer to all. `ederror CODE [TEXT]` adds an Extended DNS Error
// option to the answer (Config.EDE); as in CoreDNS, a client sees it only
// from a block without cache, whose cache would drop it. CoreDNS's `var` and `expr` options are
// refused (not implemented).
package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	gotmpl "text/template"
	"text/template/parse"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"

	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Config is one `template` directive.
type Config struct {
	Class, Type uint16   // dns.ClassANY / dns.TypeANY match every class / type
	Zones       []string // lower-case FQDNs: the block's zones when none are given
	Match       []string // regular expressions over the question name; none: ".*"
	Answer      []string // record templates
	Additional  []string
	Authority   []string
	Rcode       int
	// Fallthrough: a name in one of these zones that no regex matches goes
	// to the next plugin; nil: it gets SERVFAIL (CoreDNS's default).
	Fallthrough []string
	// EDE, when set, is `ederror`: an Extended DNS Error option (RFC 8914)
	// in the answer's OPT.
	EDE *EDE
}

// EDE is an Extended DNS Error: its info code and extra text.
type EDE struct {
	Code uint16
	Text string
}

// MaxEDEText bounds an ederror's text: it rides in every answer the
// template writes.
const MaxEDEText = 255

// Next is the rest of the chain: the plugins after template.
type Next = directive.Next

// Lookup resolves a CNAME target a template answered with (A and AAAA
// questions), as CoreDNS's template asks its upstream; nil: not chased.
type Lookup = directive.Lookup

// ErrServFail is returned for SERVFAIL: a name no template matched without
// fallthrough, `rcode SERVFAIL`, or a record that did not execute or parse.
// CoreDNS writes SERVFAIL then without passing it through its cache, so the
// caller answers SERVFAIL and caches nothing.
var ErrServFail = errors.New("template: SERVFAIL")

// Stats counts what templates did (CoreDNS: coredns_template_matches_total,
// coredns_template_template_failures_total, coredns_template_rr_failures_total).
type Stats struct {
	Matches    atomic.Uint64 // questions a template answered
	Failures   atomic.Uint64 // a record template did not execute
	RRFailures atomic.Uint64 // an executed record did not parse
}

// Hooks count one template directive's events under CoreDNS's labels
// (internal/metrics' TemplateCounters); nil functions are skipped.
type Hooks struct {
	Match     func()
	Failure   func(section, text string) // a record template did not execute
	RRFailure func(section, text string) // an executed record did not parse
}

type compiled struct {
	hooks                         Hooks
	cfg                           Config
	regex                         []*regexp.Regexp
	answer, additional, authority []*gotmpl.Template
}

// Handler is the templates of one block, in the order written.
type Handler struct {
	zones     []string
	templates []compiled
	lookup    Lookup
	remote    bool // a record template uses .Remote
	// Asker returns the client a fetch asks for (resolve.Asker); nil, or
	// a zero Addr, renders .Remote empty. Set before the handler serves.
	Asker func(ctx context.Context) netip.Addr
	Stats Stats
}

// UsesRemote reports whether a record template uses .Remote, so the
// transport must record each query's client address.
func (h *Handler) UsesRemote() bool { return h.remote }

// ConfigsUseRemote reports whether a record template of cfgs uses .Remote
// (one that does not compile does not: New refuses it).
func ConfigsUseRemote(cfgs []Config) bool {
	for _, c := range cfgs {
		for _, sec := range [][]string{c.Answer, c.Additional, c.Authority} {
			for _, text := range sec {
				if tm, err := Compile("record", text); err == nil && usesField(tm.Tree.Root, "Remote") {
					return true
				}
			}
		}
	}
	return false
}

// maxRegexpLen is CoreDNS's bound on one match expression.
const maxRegexpLen = 10000

// New compiles the templates of one block. lookup may be nil.
func New(cfgs []Config, lookup Lookup) (*Handler, error) {
	h := &Handler{lookup: lookup}
	for _, c := range cfgs {
		t := compiled{cfg: c}
		for _, re := range c.Match {
			if len(re) > maxRegexpLen {
				return nil, fmt.Errorf("match: regex pattern too long: %d > %d", len(re), maxRegexpLen)
			}
			r, err := regexp.Compile(re)
			if err != nil {
				return nil, fmt.Errorf("match: %q: %v", re, err)
			}
			t.regex = append(t.regex, r)
		}
		if len(t.regex) == 0 {
			t.regex = []*regexp.Regexp{regexp.MustCompile(".*")}
		}
		for _, sec := range []struct {
			name string
			in   []string
			out  *[]*gotmpl.Template
		}{{"answer", c.Answer, &t.answer}, {"additional", c.Additional, &t.additional}, {"authority", c.Authority, &t.authority}} {
			for _, text := range sec.in {
				tm, err := Compile(sec.name, text)
				if err != nil {
					return nil, err
				}
				h.remote = h.remote || usesField(tm.Tree.Root, "Remote")
				*sec.out = append(*sec.out, tm)
			}
		}
		h.zones = append(h.zones, c.Zones...)
		h.templates = append(h.templates, t)
	}
	return h, nil
}

// SetHooks sets the hooks of the i-th template (in the order of New's
// cfgs). Call it before the handler serves.
func (h *Handler) SetHooks(i int, hk Hooks) { h.templates[i].hooks = hk }

// Compile parses one record template as CoreDNS does (with its parseInt
// function) and refuses .Var (var and expr are not implemented).
func Compile(section, text string) (*gotmpl.Template, error) {
	tm, err := gotmpl.New(section).Funcs(gotmpl.FuncMap{"parseInt": strconv.ParseUint}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%s: could not compile template %q: %v", section, text, err)
	}
	if usesField(tm.Tree.Root, "Var") {
		return nil, fmt.Errorf("%s: %q uses .Var: var and expr are not supported", section, text)
	}
	return tm, nil
}

// usesField reports whether a template tree refers to the data field name.
func usesField(n parse.Node, name string) bool {
	found := false
	var walk func(parse.Node)
	walk = func(n parse.Node) {
		if n == nil || found {
			return
		}
		switch n := n.(type) {
		case *parse.ListNode:
			if n == nil {
				return
			}
			for _, c := range n.Nodes {
				walk(c)
			}
		case *parse.ActionNode:
			walk(n.Pipe)
		case *parse.PipeNode:
			if n == nil {
				return
			}
			for _, c := range n.Cmds {
				walk(c)
			}
		case *parse.CommandNode:
			for _, a := range n.Args {
				walk(a)
			}
		case *parse.FieldNode:
			if len(n.Ident) > 0 && n.Ident[0] == name {
				found = true
			}
		case *parse.ChainNode:
			walk(n.Node)
		case *parse.IfNode:
			walk(n.Pipe)
			walk(n.List)
			walk(n.ElseList)
		case *parse.RangeNode:
			walk(n.Pipe)
			walk(n.List)
			walk(n.ElseList)
		case *parse.WithNode:
			walk(n.Pipe)
			walk(n.List)
			walk(n.ElseList)
		case *parse.TemplateNode:
			walk(n.Pipe)
		}
	}
	walk(n)
	return found
}

// data is what a record template sees (CoreDNS's templateData).
type data struct {
	Zone     string
	Name     string
	Regex    string
	Match    []string
	Group    map[string]string
	Class    string
	Type     string
	Message  *dns.Msg
	Question *dns.Question
	Remote   string // the client's IP, as CoreDNS's state.IP()
}

// Meta is CoreDNS's metadata accessor; without the metadata plugin it is
// always "".
func (data) Meta(string) string { return "" }

// Serve answers r from the first matching template, or passes it to next.
func (h *Handler) Serve(ctx context.Context, r *dns.Msg, next Next) (*dns.Msg, error) {
	if len(r.Question) != 1 {
		return next(ctx, r)
	}
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	if zone.Longest(h.zones, name) == "" {
		return next(ctx, r)
	}
	for i := range h.templates {
		t := &h.templates[i]
		d, ok, through := t.match(r, name)
		if !ok {
			if !through {
				return nil, ErrServFail
			}
			continue
		}
		if h.remote && h.Asker != nil {
			if a := h.Asker(ctx); a.IsValid() {
				d.Remote = a.Unmap().String()
			}
		}
		h.Stats.Matches.Add(1)
		if t.hooks.Match != nil {
			t.hooks.Match()
		}
		if t.cfg.Rcode == dns.RcodeServerFailure {
			return nil, ErrServFail
		}
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		m.Rcode = t.cfg.Rcode
		for _, tm := range t.answer {
			rr, err := h.execute(t, tm, d)
			if err != nil {
				return nil, err
			}
			m.Answer = append(m.Answer, rr)
			if cn, ok := rr.(*dns.CNAME); ok && h.lookup != nil && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) {
				if up, err := h.lookup(ctx, cn.Target, q.Qtype); err == nil && up != nil {
					m.Truncated = up.Truncated
					m.Answer = append(m.Answer, up.Answer...)
				}
			}
		}
		for _, tm := range t.additional {
			rr, err := h.execute(t, tm, d)
			if err != nil {
				return nil, err
			}
			m.Extra = append(m.Extra, rr)
		}
		for _, tm := range t.authority {
			rr, err := h.execute(t, tm, d)
			if err != nil {
				return nil, err
			}
			m.Ns = append(m.Ns, rr)
		}
		if e := t.cfg.EDE; e != nil {
			// As CoreDNS's template: an OPT (4096, DO) carrying the option.
			// Clients see it when the block has no cache: CoreDNS's cache
			// drops the OPT of every answer it passes (cache.BuildFetched).
			m.SetEdns0(4096, true)
			o := m.IsEdns0()
			o.Option = append(o.Option, &dns.EDNS0_EDE{InfoCode: e.Code, ExtraText: e.Text})
		}
		return m, nil
	}
	return next(ctx, r)
}

func (h *Handler) execute(t *compiled, tm *gotmpl.Template, d *data) (dns.RR, error) {
	var b bytes.Buffer
	if err := tm.Execute(&b, d); err != nil {
		h.Stats.Failures.Add(1)
		if t.hooks.Failure != nil {
			t.hooks.Failure(tm.Name(), tm.Tree.Root.String())
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrServFail, tm.Name(), err)
	}
	rr, err := dns.NewRR(b.String())
	if err != nil || rr == nil {
		h.Stats.RRFailures.Add(1)
		if t.hooks.RRFailure != nil {
			t.hooks.RRFailure(tm.Name(), tm.Tree.Root.String())
		}
		return nil, fmt.Errorf("%w: %s: record %q: %v", ErrServFail, tm.Name(), b.String(), err)
	}
	return rr, nil
}

// match is CoreDNS's template.match: the data, whether the template
// answers, and (when not) whether the name may go on to the next template.
func (t *compiled) match(r *dns.Msg, name string) (*data, bool, bool) {
	q := r.Question[0]
	z := zone.Longest(t.cfg.Zones, name)
	if z == "" {
		return nil, false, true
	}
	if t.cfg.Class != dns.ClassANY && q.Qclass != dns.ClassANY && q.Qclass != t.cfg.Class {
		return nil, false, true
	}
	if t.cfg.Type != dns.TypeANY && q.Qtype != dns.TypeANY && q.Qtype != t.cfg.Type {
		return nil, false, true
	}
	for _, re := range t.regex {
		if !re.MatchString(name) {
			continue
		}
		d := &data{Zone: z, Regex: re.String(), Name: name, Question: &q, Message: r}
		d.Class, d.Type = dns.ClassToString[q.Qclass], dns.TypeToString[q.Qtype]
		if q.Qclass == dns.ClassANY {
			d.Class = dns.ClassToString[t.cfg.Class]
		}
		if q.Qtype == dns.TypeANY {
			d.Type = dns.TypeToString[t.cfg.Type]
		}
		m := re.FindStringSubmatch(name)
		d.Match = m
		d.Group = make(map[string]string, len(m))
		for i, s := range m {
			d.Group[strconv.Itoa(i)] = s
		}
		for i, g := range re.SubexpNames() {
			if g != "" {
				d.Group[g] = m[i]
			}
		}
		return d, true, false
	}
	return nil, false, t.cfg.Fallthrough != nil && zone.Longest(t.cfg.Fallthrough, name) != ""
}
