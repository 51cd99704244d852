package daemon

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/dns64"
	"github.com/nodelocaldns/nodelocaldns/internal/hosts"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/rewrite"
	"github.com/nodelocaldns/nodelocaldns/internal/template"
)

// The Corefile's directives that CoreDNS's plugin.cfg puts behind `cache`
// (rewrite, dns64, template, hosts; forward last) run on the fetch side:
// a miss calls the FetchFunc, which picks the question's block (the longest
// zone, as Policies.Lookup) and runs that block's chain in plugin.cfg
// order; what the chain answers is cached as CoreDNS's cache would cache
// what the plugins behind it answered. A block without such directives
// fetches straight from its forward, unparsed.

// msgNext is one link of a block's chain.
type msgNext func(ctx context.Context, r *dns.Msg) (*dns.Msg, error)

// blockChain is one block's chain.
type blockChain struct {
	zones []string
	run   msgNext // nil: no fetch-side directive
	// sig is the block's fetch-side directives as configured: a reload
	// that changes it drops the block's cached answers.
	sig any
	// Counters of the block's directives (for metrics).
	template *template.Handler
	hosts    *hosts.Handler
	rewrite  *rewrite.Handler
	dns64    *dns64.Handler
}

// fetchChain is what the daemon's FetchFunc runs: the blocks' chains,
// longest zone first. Swapped whole when the Corefile changes.
type fetchChain struct {
	blocks []*blockChain
}

// chainFetch wraps next (the forward routes) with the Corefile's chains.
// Without a Corefile it returns next itself.
func (d *Daemon) chainFetch(next resolve.FetchFunc) (resolve.FetchFunc, error) {
	cc := d.cfg.DropIn.Corefile
	if cc == nil {
		return next, nil
	}
	c, err := d.buildChains(cc.Servers, nil, next)
	if err != nil {
		return nil, err
	}
	d.chain.Store(c)
	d.chainNext = next
	return func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		if c := d.chain.Load(); c != nil {
			return c.fetch(ctx, qname, query, next)
		}
		return next(ctx, qname, query)
	}, nil
}

// prepareChain builds the chains of a Corefile change (n is the new
// configuration), not yet in use, and returns the zones of the blocks
// whose fetch-side directives changed: their cached answers came from the
// old directives, and the reloader drops them (CoreDNS starts with a new
// cache on reload). nil chain: no chain to replace.
func (d *Daemon) prepareChain(n *config.Config) (*fetchChain, []string, error) {
	if n.DropIn.Corefile == nil || d.chainNext == nil {
		return nil, nil, nil
	}
	c, err := d.buildChains(n.DropIn.Corefile.Servers, nil, d.chainNext)
	if err != nil {
		return nil, nil, fmt.Errorf("directives: %w", err)
	}
	old := d.chain.Load()
	var changed []string
	for _, b := range c.blocks {
		for _, z := range b.zones {
			if ob := old.block(z); ob == nil || !reflect.DeepEqual(ob.sig, b.sig) || !slices.Contains(ob.zones, z) {
				changed = append(changed, z)
			}
		}
	}
	for _, ob := range old.blocks {
		for _, z := range ob.zones {
			if nb := c.block(z); (nb == nil || !slices.Contains(nb.zones, z)) && !slices.Contains(changed, z) {
				changed = append(changed, z)
			}
		}
	}
	return c, changed, nil
}

// usesRemote reports whether a template of any block uses .Remote, so
// the server must record each query's client (Server.SetRecordAskers).
func usesRemote(servers []*corefile.Server) bool {
	for _, s := range servers {
		if template.ConfigsUseRemote(s.Templates) {
			return true
		}
	}
	return false
}

// buildChains builds every block's chain. pick (a view's, config.View)
// gives each zone its block, by index in servers; nil: a zone's first
// block. A block with no zone of its own is left out.
func (d *Daemon) buildChains(servers []*corefile.Server, pick map[string]int, next resolve.FetchFunc) (*fetchChain, error) {
	c := &fetchChain{}
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
		b.sig = []any{s.Templates, s.Hosts, rewriteSig(s.Rewrites), s.DNS64}
		if err := b.build(d, s, c, next); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Pos, err)
		}
		c.blocks = append(c.blocks, b)
	}
	return c, nil
}

// build links s's fetch-side directives in plugin.cfg order (s.Plugins is
// sorted so), ending in the forward routes.
func (b *blockChain) build(d *Daemon, s *corefile.Server, c *fetchChain, next resolve.FetchFunc) error {
	run := msgNext(func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
		return exchangeMsg(ctx, r, next)
	})
	have := false
	// Walk backwards so each link wraps the ones after it.
	for i := len(s.Plugins) - 1; i >= 0; i-- {
		switch s.Plugins[i].Name {
		case "hosts":
			h := hosts.New(*s.Hosts, d.clock, d.log.With("component", "hosts", "block", s.Pos.String()))
			b.hosts = h
			if d.Metrics != nil {
				hc := d.Metrics.Directives.Hosts(s.Hosts.Path)
				h.Report(&hc.Entries, &hc.ReloadUnix)
			}
			inner := run
			run = func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
				return h.Serve(ctx, r, hosts.Next(inner))
			}
			have = true
		case "dns64":
			// Without allow_ipv4 the configuration refused an IPv4
			// listener (config.checkDNS64).
			cfg := *s.DNS64
			h := dns64.New(cfg, func(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
				return c.lookup(ctx, name, qtype, next)
			})
			b.dns64 = h
			if d.Metrics != nil {
				h.Report(d.Metrics.Directives.DNS64())
			}
			inner := run
			run = func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
				return h.Serve(ctx, r, dns64.Next(inner))
			}
			have = true
		case "rewrite":
			if b.rewrite != nil {
				continue
			}
			h := rewrite.New(s.Rewrites)
			b.rewrite = h
			inner := run
			run = func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
				return h.Serve(ctx, r, rewrite.Next(inner))
			}
			have = true
		case "template":
			if b.template != nil {
				continue // repeated lines: one handler holds them all
			}
			h, err := template.New(s.Templates, func(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
				return c.lookup(ctx, name, qtype, next)
			})
			if err != nil {
				return err
			}
			b.template = h
			h.Asker = resolve.Asker
			if d.Metrics != nil {
				for i, tc := range s.Templates {
					mc := d.Metrics.Directives.Template(tc.Zones[0], dns.ClassToString[tc.Class], dns.TypeToString[tc.Type])
					h.SetHooks(i, template.Hooks{Match: func() { mc.Matches.Add(1) }, Failure: mc.TemplateFailure, RRFailure: mc.RRFailure})
				}
			}
			inner := run
			run = func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
				return h.Serve(ctx, r, template.Next(inner))
			}
			have = true
		}
	}
	if have {
		b.run = run
	}
	return nil
}

// block returns the block of the longest zone containing qname.
func (c *fetchChain) block(qname string) *blockChain {
	var best *blockChain
	bestLen := -1
	for _, b := range c.blocks {
		for _, z := range b.zones {
			if len(z) > bestLen && (z == "." || qname == z || strings.HasSuffix(qname, "."+z)) {
				best, bestLen = b, len(z)
			}
		}
	}
	return best
}

// runs reports whether the directives of qname's block run for it: its fetch is not a plain
// forward.
func (c *fetchChain) runs(qname string) bool {
	b := c.block(qname)
	return b != nil && b.run != nil
}

func (c *fetchChain) fetch(ctx context.Context, qname string, query []byte, next resolve.FetchFunc) ([]byte, error) {
	b := c.block(qname)
	if b == nil || b.run == nil {
		return next(ctx, qname, query)
	}
	r := new(dns.Msg)
	if err := r.Unpack(query); err != nil {
		return nil, err
	}
	m, err := b.run(context.WithValue(ctx, routeKey{}, qname), r)
	if err != nil {
		return nil, err
	}
	m.Id = r.Id
	m.Compress = true // as upstreams pack: truncation keeps as many records
	return m.Pack()
}

// lookup resolves name through its block's chain (a template's CNAME
// target), as CoreDNS's upstream asks its own server.
func (c *fetchChain) lookup(ctx context.Context, name string, qtype uint16, next resolve.FetchFunc) (*dns.Msg, error) {
	depth, _ := ctx.Value(depthKey{}).(int)
	if depth >= maxLookupDepth {
		return nil, fmt.Errorf("chain: %s: more than %d nested lookups (a template CNAME loop?)", name, maxLookupDepth)
	}
	ctx = context.WithValue(ctx, depthKey{}, depth+1)
	r := new(dns.Msg)
	r.SetQuestion(dns.Fqdn(strings.ToLower(name)), qtype)
	r.SetEdns0(dns.DefaultMsgSize, false)
	b := c.block(r.Question[0].Name)
	ctx = context.WithValue(ctx, routeKey{}, r.Question[0].Name)
	if b == nil || b.run == nil {
		return exchangeMsg(ctx, r, next)
	}
	return b.run(ctx, r)
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
	ans, err := next(ctx, route, q)
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	if err := m.Unpack(ans); err != nil {
		return nil, err
	}
	return m, nil
}

func rewriteSig(rules []*rewrite.Rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.String())
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

// DirectiveStats returns the counters of the blocks with fetch-side
// directives, as running now (a Corefile change replaces them: call again
// at each scrape).
func (d *Daemon) DirectiveStats() []BlockStats {
	c := d.viewChain.Load() // with several views: the first view's blocks
	if c == nil {
		c = d.chain.Load()
	}
	if c == nil {
		return nil
	}
	var out []BlockStats
	for _, b := range c.blocks {
		if b.run == nil {
			continue
		}
		s := BlockStats{Zones: b.zones}
		if b.template != nil {
			s.Template = &b.template.Stats
		}
		if b.hosts != nil {
			s.Hosts = &b.hosts.Stats
		}
		if b.rewrite != nil {
			s.Rewrite = &b.rewrite.Stats
		}
		if b.dns64 != nil {
			s.DNS64 = &b.dns64.Stats
		}
		out = append(out, s)
	}
	return out
}
