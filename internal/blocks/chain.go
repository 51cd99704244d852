package blocks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
	"github.com/nodelocaldns/nodelocaldns/internal/dns64"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/hosts"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/rewrite"
	"github.com/nodelocaldns/nodelocaldns/internal/template"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// The Corefile's directives that CoreDNS's plugin.cfg puts behind `cache`
// (rewrite, dns64, template, hosts; forward last) run on the fetch side:
// a miss's block (its View lookup) carries its chain, which runs the
// block's directives in plugin.cfg order; what the chain answers is cached
// as CoreDNS's cache would cache what the plugins behind it answered. A
// block without such directives fetches straight from its forward,
// unparsed.

// ChainEnv is what building chains uses besides the blocks.
type ChainEnv struct {
	Clock clock.Clock
	Log   *slog.Logger
	// Metrics feeds CoreDNS's per-directive series; nil: not counted.
	Metrics directive.Metrics
	// Table is the view the chains serve in, as it is now: a directive's
	// own lookup (a template's CNAME target) finds its block there, as
	// any query. nil: such lookups go to next.
	Table func() *View
	// Links makes the groups of a block's further forwards
	// (corefile.Server.MoreForwards), one each, in order; the chains own
	// them (Chains.Groups). nil: a block with several forwards is an
	// error.
	Links func(s *corefile.Server) ([]*forward.Group, error)
}

// blockChain is one block's chain.
type blockChain struct {
	zones []string
	run   directive.Next // nil: no fetch-side directive
	// sig is the block's fetch-side directives as configured: a reload
	// that changes it drops the block's cached answers.
	sig any
	// handlers are the block's directives by name (their counters, for
	// metrics).
	handlers map[string]directive.Handler
}

// Chains are the blocks' chains (one view's), in the Corefile's order.
// Built whole, never changed.
type Chains struct {
	blocks []*blockChain
	groups []*forward.Group // the further forwards' groups (ChainEnv.Links)
}

// Groups are the groups the chains own (their blocks' further forwards):
// whoever replaces the chains closes them, after the queries sent to them
// are done.
func (c *Chains) Groups() []*forward.Group {
	if c == nil {
		return nil
	}
	return c.groups
}

// UsesRemote reports whether a directive of any block needs each query's
// client on the fetch side (a template's .Remote, a rewrite edns0 rule's
// client address), so the server must record it
// (Server.SetRecordAskers; corefile.Spec.UsesClient).
func UsesRemote(servers []*corefile.Server) bool { return corefile.UsesClient(servers) }

// BuildChains builds every block's chain. pick (a view's, config.View)
// gives each zone its block, by index in servers; nil: a zone's first
// block. A block with no zone of its own is left out.
func BuildChains(env ChainEnv, servers []*corefile.Server, pick map[string]int, next resolve.FetchFunc) (*Chains, error) {
	c := &Chains{}
	seen := map[string]bool{}
	for i, s := range servers {
		b := &blockChain{}
		for _, z := range s.Zones {
			if pick != nil {
				if pick[z] == i && !seen[z] {
					seen[z] = true
					b.zones = append(b.zones, z)
				}
				continue
			}
			if !seen[z] { // a zone in two blocks (other binds): the first
				seen[z] = true
				b.zones = append(b.zones, z)
			}
		}
		if pick != nil && len(b.zones) == 0 {
			continue
		}
		var except []string
		if s.Forward != nil {
			except = s.Forward.Except
		}
		b.sig = []any{fetchSideSig(s), except, linkSig(s)}
		if err := b.build(env, s, c, next); err != nil {
			for _, g := range c.groups {
				_ = g.Close()
			}
			return nil, fmt.Errorf("%s: %w", s.Pos, err)
		}
		c.blocks = append(c.blocks, b)
	}
	return c, nil
}

// build links s's fetch-side directives in plugin.cfg order (s.Plugins is
// sorted so), ending in the forward routes: each directive registered with
// internal/directive wraps the ones after it. Repeated lines of one
// directive are one handler (it holds them all).
func (b *blockChain) build(ce ChainEnv, s *corefile.Server, c *Chains, next resolve.FetchFunc) error {
	run := directive.Next(func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
		return exchangeMsg(ctx, r, next)
	})
	env := directive.Env{
		Clock: ce.Clock,
		Lookup: func(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
			return lookup(ctx, ce.Table, name, qtype, next)
		},
		Asker: resolve.Asker,
	}
	env.Metrics = ce.Metrics
	b.handlers = map[string]directive.Handler{}
	except := false
	if len(s.MoreForwards) > 0 {
		// Several forwards: CoreDNS runs them in turn (links.go).
		if ce.Links == nil {
			return errors.New("several forward directives: no groups for them")
		}
		gs, err := ce.Links(s)
		if err != nil {
			return err
		}
		c.groups = append(c.groups, gs...)
		except, run = true, forwardLinks(s, run, gs)
	} else if f := s.Forward; f != nil && len(f.Except) > 0 {
		// forward's except: the excepted names go to the plugin after
		// forward, which a node cache's block does not have: CoreDNS
		// answers SERVFAIL ("no next plugin found"). Names with a block of
		// their own never get here. Checked on the name forward would
		// ask (after rewrite), as CoreDNS's forward does.
		except = true
		zones, fwd := f.Except, run
		run = func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
			if len(r.Question) == 1 && zone.HoldsAny(zones, strings.ToLower(r.Question[0].Name)) {
				return nil, fmt.Errorf("%w: %s", ErrExcepted, r.Question[0].Name)
			}
			return fwd(ctx, r)
		}
	}
	// Walk backwards so each link wraps the ones after it.
	for i := len(s.Plugins) - 1; i >= 0; i-- {
		name := s.Plugins[i].Name
		setup, ok := directive.Registered(name)
		if !ok || b.handlers[name] != nil {
			continue
		}
		env.Log = ce.Log.With("component", name, "block", s.Pos.String())
		h, err := setup(env, s.Config(name))
		if err != nil {
			return err
		}
		b.handlers[name] = h
		inner := run
		run = func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
			return h.Serve(ctx, r, inner)
		}
	}
	if len(b.handlers) > 0 || except {
		b.run = run
	}
	return nil
}

// ErrExcepted: the name is in an except zone of the block's forward and no
// plugin follows forward (the fetch fails: SERVFAIL, as CoreDNS's).
var ErrExcepted = errors.New("forward except: no plugin after forward")

// table maps the blocks' zones to their chains (nil: no chains), for
// compiling (CompileView) and comparing (Changed): serving looks names up
// in a View.
func (c *Chains) table() *zone.Table[*blockChain] {
	if c == nil {
		return nil
	}
	b := zone.NewBuilder[*blockChain](nil)
	for _, bc := range c.blocks {
		for _, z := range bc.zones {
			_ = b.SetFirst(z, bc)
		}
	}
	return b.Table()
}

// RunChain fetches query for qname through a block's chain.
func RunChain(ctx context.Context, run directive.Next, qname string, query []byte) ([]byte, error) {
	r := new(dns.Msg)
	if err := r.Unpack(query); err != nil {
		return nil, err
	}
	m, err := run(context.WithValue(ctx, routeKey{}, qname), r)
	if err != nil {
		return nil, err
	}
	m.Id = r.Id
	m.Compress = true // as upstreams pack: truncation keeps as many records
	return m.Pack()
}

// lookup resolves name through the chain of its block in the view the
// chains serve in (a template's CNAME target), as CoreDNS's upstream asks
// its own server.
func lookup(ctx context.Context, table func() *View, name string, qtype uint16, next resolve.FetchFunc) (*dns.Msg, error) {
	depth, _ := ctx.Value(depthKey{}).(int)
	if depth >= maxLookupDepth {
		return nil, fmt.Errorf("chain: %s: more than %d nested lookups (a template CNAME loop?)", name, maxLookupDepth)
	}
	ctx = context.WithValue(ctx, depthKey{}, depth+1)
	r := new(dns.Msg)
	r.SetQuestion(dns.Fqdn(strings.ToLower(name)), qtype)
	r.SetEdns0(dns.DefaultMsgSize, false)
	ctx = context.WithValue(ctx, routeKey{}, r.Question[0].Name)
	if v := viewOf(table); v != nil {
		w := make([]byte, 256)
		if n, err := dns.PackDomainName(r.Question[0].Name, w, 0, nil, false); err == nil {
			if run := v.Lookup(w[:n]).Run; run != nil {
				return run(ctx, r)
			}
		}
	}
	return exchangeMsg(ctx, r, next)
}

// viewOf is table's view now (nil: no table, or none yet).
func viewOf(table func() *View) *View {
	if table == nil {
		return nil
	}
	return table()
}

// depthKey counts nested lookups in a context; maxLookupDepth bounds them
// (CNAME chains through templates, dns64's A lookups): deeper than any
// sane configuration, shallow enough that a loop fails fast.
type depthKey struct{}

const maxLookupDepth = 8

// routeKey is the context key of the name a block's forward is chosen by:
// the question's name before any rewrite (CoreDNS forwards a rewritten
// question with the block's forward, the block chosen by the name the
// client asked).
type routeKey struct{}

// exchangeMsg sends r through the forward routes.
func exchangeMsg(ctx context.Context, r *dns.Msg, next resolve.FetchFunc) (*dns.Msg, error) {
	if len(r.Question) != 1 {
		return nil, errors.New("chain: a query has one question")
	}
	q, err := r.Pack()
	if err != nil {
		return nil, err
	}
	route := strings.ToLower(r.Question[0].Name)
	if n, ok := ctx.Value(routeKey{}).(string); ok {
		route = n
	}
	return unpacked(next(ctx, route, q))
}

// unpacked is the message of an exchange's answer.
func unpacked(ans []byte, err error) (*dns.Msg, error) {
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	if err := m.Unpack(ans); err != nil {
		return nil, err
	}
	return m, nil
}

// fetchSideSig is the text of s's fetch-side directives (those registered
// with internal/directive), as written: derived, so a directive added
// later is in it without a word.
func fetchSideSig(s *corefile.Server) []string {
	var out []string
	for _, p := range s.Plugins {
		if _, ok := directive.Registered(p.Name); ok {
			out = append(out, p.Text)
		}
	}
	return out
}

// BlockStats are the counters of one block's fetch-side directives (nil
// where the block has none), for metrics (CoreDNS: coredns_template_*,
// coredns_hosts_*, coredns_dns64_*).
type BlockStats struct {
	Zones    []string
	Template *template.Stats
	Hosts    *hosts.Stats
	Rewrite  *rewrite.Stats
	DNS64    *dns64.Stats
}

// Stats returns the counters of the blocks with fetch-side directives.
func (c *Chains) Stats() []BlockStats {
	if c == nil {
		return nil
	}
	var out []BlockStats
	for _, b := range c.blocks {
		if b.run == nil {
			continue
		}
		s := BlockStats{Zones: b.zones}
		if h, ok := b.handlers["template"].(*template.Handler); ok {
			s.Template = &h.Stats
		}
		if h, ok := b.handlers["hosts"].(*hosts.Handler); ok {
			s.Hosts = &h.Stats
		}
		if h, ok := b.handlers["rewrite"].(*rewrite.Handler); ok {
			s.Rewrite = &h.Stats
		}
		if h, ok := b.handlers["dns64"].(*dns64.Handler); ok {
			s.DNS64 = &h.Stats
		}
		out = append(out, s)
	}
	return out
}

// Run is the chain of the block holding zone (nil: none runs).
func (c *Chains) Run(zone string) directive.Next {
	if b := c.table().LookupString(zone); b != nil {
		return b.run
	}
	return nil
}

// Zones lists the zones of the blocks.
func (c *Chains) Zones() []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, b := range c.blocks {
		out = append(out, b.zones...)
	}
	return out
}

// Changed lists the zones whose fetch-side directives differ between old
// and c (their cached answers came from the old directives).
func (c *Chains) Changed(old *Chains) []string {
	if old == nil {
		old = &Chains{}
	}
	ot, nt := old.table(), c.table()
	var changed []string
	for _, b := range c.blocks {
		for _, z := range b.zones {
			if ob := ot.LookupString(z); ob == nil || !reflect.DeepEqual(ob.sig, b.sig) || !slices.Contains(ob.zones, z) {
				changed = append(changed, z)
			}
		}
	}
	for _, ob := range old.blocks {
		for _, z := range ob.zones {
			if nb := nt.LookupString(z); (nb == nil || !slices.Contains(nb.zones, z)) && !slices.Contains(changed, z) {
				changed = append(changed, z)
			}
		}
	}
	return changed
}
