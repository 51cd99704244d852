package running

import (
	"fmt"
	"sync/atomic"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/metrics"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// The Corefile's fetch-side directives run in chains built by
// internal/blocks (BuildChains) and compiled into the views' blocks.

// tableIn is view vi's table published now (-1: the shared view's), for
// the directives' own lookups; nil before the first publish.
func (d *State) tableIn(vi int) func() *blocks.View {
	return func() *blocks.View {
		if p := d.pub.Load(); p != nil {
			return p.view(vi)
		}
		return nil
	}
}

// chainEnv is what the daemon gives the chains: its clock, its log, the
// CoreDNS series of the directives, the table of the view they serve in.
func (d *State) chainEnv(table func() *blocks.View) blocks.ChainEnv {
	env := blocks.ChainEnv{Clock: d.clock, Log: d.log, Table: table}
	if d.Metrics != nil {
		env.Metrics = directiveMetrics{d.Metrics.Directives}
	}
	return env
}

// buildChains builds the chains of cc's blocks as a view picks them (nil
// pick: a zone's first block) over next, serving in table. The groups of
// the blocks' further forwards are made here and owned by the chains
// (Chains.Groups): closed with the State, retired when a reload replaces
// the chains.
func (d *State) buildChains(cc *config.CorefileConfig, pick map[string]int, next resolve.FetchFunc, table func() *blocks.View) (*blocks.Chains, error) {
	env := d.chainEnv(table)
	env.Links = func(s *corefile.Server) ([]*forward.Group, error) {
		var gs []*forward.Group
		for i, l := range cc.Links[s] {
			g, err := d.linkGroup(l, i+2)
			if err != nil {
				for _, g := range gs {
					_ = g.Close()
				}
				return nil, fmt.Errorf("forward %d (%s): %w", i+2, l.Route.Zone, err)
			}
			gs = append(gs, g)
		}
		if len(gs) != len(s.MoreForwards) {
			for _, g := range gs {
				_ = g.Close()
			}
			return nil, fmt.Errorf("%d further forwards, %d mapped", len(s.MoreForwards), len(gs))
		}
		return gs, nil
	}
	return blocks.BuildChains(env, cc.Servers, pick, next)
}

// linkGroup is the group of a block's n-th forward (n >= 2,
// config.ForwardLink): UDP, or TCP with force_tcp or to kube-dns, with
// the forward's options.
func (d *State) linkGroup(l config.ForwardLink, n int) (*forward.Group, error) {
	name := fmt.Sprintf("corefile:%s#%d", l.Route.Zone, n)
	if l.Kube {
		name = fmt.Sprintf("kube-dns#%d", n)
	}
	cfg := forward.GroupConfig{Name: name, Servers: l.Route.Servers, Proto: forward.UDP, MaxInflight: d.cfg.MaxInflight, Logger: d.log.With("group", name)}
	if l.Route.ForceTCP {
		cfg.Proto, cfg.PoolSize = forward.TCP, d.cfg.TCPPoolSize
	}
	if err := withOptions(&cfg, &l.Route.Opts); err != nil {
		return nil, err
	}
	var obs forward.Observer // nil: not counted (a State without metrics)
	if d.Metrics != nil {
		obs = d.Metrics
	}
	return forward.NewGroup(cfg, obs)
}

// initChain builds the Corefile's chains over next (the forward routes)
// for the shared view (blocks.go compiles them into its blocks). Without a
// Corefile there is none.
func (d *State) initChain(next resolve.FetchFunc) error {
	cc := d.cfg.DropIn.Corefile
	if cc == nil {
		return nil
	}
	c, err := d.buildChains(cc, nil, next, d.tableIn(-1))
	if err != nil {
		return err
	}
	d.chain.Store(c)
	d.chainNext = next
	return nil
}

// prepareChain builds the chains of a Corefile change (n is the new
// configuration), not yet in use, and returns the zones of the blocks
// whose fetch-side directives changed: their cached answers came from the
// old directives, and the reloader drops them (CoreDNS starts with a new
// cache on reload). nil chain: no chain to replace.
func (d *State) prepareChain(n *config.Config) (*blocks.Chains, []string, error) {
	if n.DropIn.Corefile == nil || d.chainNext == nil {
		return nil, nil, nil
	}
	c, err := d.buildChains(n.DropIn.Corefile, nil, d.chainNext, d.tableIn(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("directives: %w", err)
	}
	changed := c.Changed(d.chain.Load())
	return c, changed, nil
}

// directiveMetrics gives the directives CoreDNS's series for them
// (directive.Metrics over metrics.Directives).
type directiveMetrics struct{ m *metrics.Directives }

func (dm directiveMetrics) Hosts(file string) (*atomic.Int64, *atomic.Int64, *atomic.Int64) {
	hc := dm.m.Hosts(file)
	return &hc.Entries, &hc.ReloadUnix, &hc.Skipped
}

func (dm directiveMetrics) Template(zone, class, typ string) (func(), func(string, string), func(string, string)) {
	mc := dm.m.Template(zone, class, typ)
	return func() { mc.Matches.Add(1) }, mc.TemplateFailure, mc.RRFailure
}

func (dm directiveMetrics) DNS64() *atomic.Uint64 { return dm.m.DNS64() }

// DirectiveStats returns the counters of the blocks with fetch-side
// directives, as running now (a Corefile change replaces them: call again
// at each scrape).
func (d *State) DirectiveStats() []blocks.BlockStats {
	c := d.viewChain.Load() // with several views: the first view's blocks
	if c == nil {
		c = d.chain.Load()
	}
	return c.Stats()
}
