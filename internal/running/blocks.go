package running

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The block tables (internal/blocks): every view's resolver finds a
// query's block in its view's table of the snapshot published now
// (d.pub), once per query (the server asks it); the block carries its
// cache policy, CoreDNS metric zone and answer-side handlers to the
// server, and its Route to the fetch (the view's forwarder, below), which
// matches nothing again. A block's group is the view's own or the shared
// route table's (reload.go), so the shared routes are compiled into every
// table too. A reload compiles every table anew, from the sources that
// changed and those that did not, and publishes them with one pointer
// store (publish): a query sees the old configuration or the new one.

// snapshot is the configuration serving now: the shared view's blocks
// (the one-view case's, and autopath's resolver) and each view's, with
// several views; all compiled over the same routes; and the node
// listener's (node.go), over its own.
type snapshot struct {
	shared *blocks.View
	views  []*blocks.View // by view index; nil: one view
	node   *blocks.View   // nil without -node-listen
}

// view is view vi's table (the shared one when there is no such view;
// nodeVI: the node listener's).
func (p *snapshot) view(vi int) *blocks.View {
	if vi == nodeVI {
		return p.node
	}
	if vi >= 0 && vi < len(p.views) {
		return p.views[vi]
	}
	return p.shared
}

// sharedPolicy is what a view's blocks are compiled from besides the
// chains and routes: the cache policies (over zones) and the answer-side
// handlers of the blocks (by zone).
type sharedPolicy struct {
	pol     resolve.PolicyFunc
	zones   []string
	answers []blocks.Answers
}

// blockAnswers are the answer-side chains of the blocks of srv, by their
// zones, as one view sees them: pick gives the block serving a zone's
// names there (-1: none, the zone is refused). nil when no block has a
// handler.
func blockAnswers(srv []*corefile.Server, chains map[*corefile.Server]*answer.Chain, pick func(zone string) int) []blocks.Answers {
	var out []blocks.Answers
	seen := map[string]bool{}
	acts := false
	for _, s := range srv {
		for _, z := range s.Zones {
			if seen[z] {
				continue
			}
			seen[z] = true
			p := pick(z)
			if p < 0 {
				continue
			}
			c := chains[srv[p]]
			acts = acts || c != nil
			out = append(out, blocks.Answers{Zone: strings.ToLower(z), Chain: c})
		}
	}
	if !acts {
		return nil
	}
	return out
}

// answerChains sets up the answer-side handlers of every block of srv
// (the directives registered with internal/answer, in plugin.cfg order):
// one chain per block, shared by every view that sees it (one trace
// sampling count per block, as CoreDNS's one plugin instance per server
// block), made anew for each Corefile loaded. What they open (dnstap's
// taps, trace's exporters) is asked of d.res for round.
func (d *State) answerChains(srv []*corefile.Server, round *round) (map[*corefile.Server]*answer.Chain, error) {
	out := map[*corefile.Server]*answer.Chain{}
	for _, s := range srv {
		c, err := d.answerChain(s, round)
		if err != nil {
			return nil, err
		}
		if c != nil {
			out[s] = c
		}
	}
	return out, nil
}

func (d *State) answerChain(s *corefile.Server, round *round) (*answer.Chain, error) {
	env := answer.Env{
		Log: d.log, // what the handlers open is shared by blocks: Block.Pos names the block
		Out: d.queryLogOut,
		Shared: func(key string, open func() (io.Closer, error)) (io.Closer, error) {
			return d.res.get(round, key, open)
		},
		Stats: d.res.stats,
	}
	for _, p := range s.Plugins {
		env.Block.Plugins = append(env.Block.Plugins, p.Name)
	}
	if len(s.Bind) > 0 {
		env.Block.Local = netip.AddrPortFrom(s.Bind[0], uint16(s.Port))
	}
	env.Block.Pos = s.Pos.String()
	var names []string
	var hs []answer.Handler
	for _, name := range env.Block.Plugins {
		setup, ok := answer.Registered(name)
		if !ok || slices.Contains(names, name) {
			continue
		}
		h, err := setup(env, s.Config(name))
		if err != nil {
			return nil, errors.New(s.Pos.String() + ": " + name + ": " + err.Error())
		}
		if h != nil {
			names, hs = append(names, name), append(hs, h)
		}
	}
	return answer.NewChain(names, hs), nil
}

// firstBlock is the shared view's pick: the first block of a zone (where
// every listen address sees a block answering alike: config.View).
func firstBlock(srv []*corefile.Server) func(zone string) int {
	first := map[string]int{}
	for i, s := range srv {
		for _, z := range s.Zones {
			if _, ok := first[z]; !ok {
				first[z] = i
			}
		}
	}
	return func(z string) int {
		if i, ok := first[z]; ok {
			return i
		}
		return -1
	}
}

// compileView compiles a view from its policies, its chains (nil: none)
// and, with several views, its own routes (nil: none), over routes and
// the CoreDNS metric zones: metrics, the view's (nil: all). vi is the
// view's index (-1: the shared view), whose table the forwarder finds
// the current blocks in.
func (d *State) compileView(vi int, sp sharedPolicy, c *blocks.Chains, vr *blocks.Routes, metrics []string, routes []forward.Route) (*blocks.View, error) {
	if metrics == nil {
		metrics = d.metricZones
	}
	return blocks.CompileView(blocks.Sources{
		Default: d.policyDefault, Policy: sp.pol, PolicyZones: sp.zones,
		Chains: c, Own: vr, Shared: routes, Metrics: metrics,
		Answers: sp.answers, Forwarder: forwarder{d: d, vi: vi},
	})
}

// blocksIn is the BlockFunc of view vi's resolver (-1: the shared view's):
// the block of a name in the snapshot published now.
func (d *State) blocksIn(vi int) resolve.BlockFunc {
	return func(name []byte) *resolve.Block { return &d.lookup(vi, name).Block }
}

// lookup is the block of name in view vi of the snapshot published now:
// the one matcher a query's block is found by (the server's, once per
// query, through the resolvers' BlockFunc; a fetch's second look when a
// reload routed its name elsewhere).
func (d *State) lookup(vi int, name []byte) *blocks.Block {
	if n := d.lookups.Load(); n != nil {
		n.Add(1)
	}
	return d.pub.Load().view(vi).Lookup(name)
}

// CountLookupsForTest counts every lookup of a query's block in n (nil:
// none counted).
func (d *State) CountLookupsForTest(n *atomic.Int64) { d.lookups.Store(n) }

// forwarder fetches the misses of view vi's blocks (blocks.Forwarder):
// a block whose fetch is a plain forward goes to its group with
// ExchangeAsync, and the group's reader hands the answer on
// (startforward.go); one that runs directives, refuses its zone or has no
// group is fetched blocking (Fetch).
type forwarder struct {
	d  *State
	vi int
}

// table is the view's table published now.
func (f forwarder) table() *blocks.View { return f.d.pub.Load().view(f.vi) }

func (f forwarder) Start(b *blocks.Block, name, query []byte, asker netip.AddrPort, timeout time.Duration, done resolve.FetchDone) bool {
	if b.Run != nil || b.Refused || b.Group == nil {
		return false
	}
	f.d.startAsync(f, b, name, query, asker, timeout, done)
	return true
}

// Fetch runs the block's chain when it runs directives (ending in
// forwardIn), answers REFUSED when the view serves no block for the name
// (as CoreDNS answers), else asks the block's group.
func (f forwarder) Fetch(ctx context.Context, b *blocks.Block, qname string, query []byte) ([]byte, error) {
	switch {
	case b.Run != nil:
		// The chain's end forwards qname by b (forwardIn), unless a
		// directive asks for another name.
		return blocks.RunChain(context.WithValue(ctx, routedKey{}, routed{qname, b}), b.Run, qname, query)
	case b.Refused:
		return blocks.RefusedAnswer(query)
	}
	name, _ := wireName(qname) // nil when it does not pack: no second ask
	return f.d.exchange(tapping(ctx, b), f, name, b.Group, query)
}

// forwardIn is the end of the chains of view vi: the forward of the block
// holding qname (the name the client asked, before any rewrite), or
// REFUSED; never the block's chain again.
func (d *State) forwardIn(vi int) resolve.FetchFunc {
	f := forwarder{d: d, vi: vi}
	return func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		name, ok := wireName(qname)
		if !ok {
			return nil, errors.New("invalid name " + qname)
		}
		b := routedBlock(ctx, qname)
		if b == nil {
			b = d.lookup(vi, name) // a name a directive asked (a CNAME target), not the miss's
		}
		if b.Refused {
			return blocks.RefusedAnswer(query)
		}
		return d.exchange(tapping(ctx, b), f, name, b.Group, query)
	}
}

// routedKey is the context key of the block a chain runs for (routed):
// its end forwards the miss's name by it, without looking it up again.
type routedKey struct{}

type routed struct {
	name string // lower-case FQDN
	b    *blocks.Block
}

// routedBlock is the block the chain runs for when qname is its miss's
// name; nil otherwise.
func routedBlock(ctx context.Context, qname string) *blocks.Block {
	if r, ok := ctx.Value(routedKey{}).(routed); ok && r.name == qname {
		return r.b
	}
	return nil
}

// wireName is the wire form of a presentation name as the resolver and
// the chains give it (escapes included: wire.NameString writes them).
func wireName(s string) ([]byte, bool) {
	buf := make([]byte, 256)
	n, err := dns.PackDomainName(dns.Fqdn(s), buf, 0, nil, false)
	if err != nil {
		return nil, false
	}
	return buf[:n], true
}

// exchange asks g. When a reload routed the name elsewhere while the
// query was out, the answer (or the ErrClosed of a retired group) reflects
// the old configuration: the new group is asked, three times at most (nil
// name: not known, no second ask).
func (d *State) exchange(ctx context.Context, f forwarder, name []byte, g *forward.Group, query []byte) ([]byte, error) {
	for try := 1; ; try++ {
		if g == nil {
			return nil, errors.New("no route for " + wire.NameString(name))
		}
		view := f.table()
		ans, err := g.Exchange(ctx, query)
		if name == nil || f.table() == view {
			return ans, err // no reload meanwhile: the common case, without a second lookup
		}
		now := d.lookup(f.vi, name).Group
		if now == g || now == nil || try == 3 || ctx.Err() != nil {
			return ans, err
		}
		g = now
	}
}

// tapping is ctx telling the forward of b's forward observers (dnstap:
// forwardTap), when b has some.
func tapping(ctx context.Context, b *blocks.Block) context.Context {
	fo := b.Answer.Forwarders()
	if len(fo) == 0 {
		return ctx
	}
	return forward.WithTapper(ctx, forwardTap{obs: fo, client: resolve.AskerPort(ctx)})
}

// round is the shared resources (answer.Env.Shared) one Corefile's
// handlers asked for, by key.
type round struct {
	keys map[string]bool
}

// resources are the answer-side handlers' shared resources (dnstap's
// taps, trace's exporters): opened when a Corefile first asks for one,
// kept while the Corefile serving asks for it, closed once it no longer
// does (a reload's commit, or Close).
type resources struct {
	mu   sync.Mutex
	open map[string]io.Closer
	// kept are the handlers' counters and bounds (answer.Env.Stats),
	// kept for the State's life.
	kept map[string]any
}

// stats is answer.Env.Stats: the value of key, made the first time.
func (r *resources) stats(key string, make func() any) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.kept[key]; ok {
		return v
	}
	if r.kept == nil {
		r.kept = map[string]any{}
	}
	v := make()
	r.kept[key] = v
	return v
}

// stat is the value of key, nil when no handler made it.
func (r *resources) stat(key string) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kept[key]
}

// get returns the resource key, opening it with open when none is, and
// notes that round asked for it.
func (r *resources) get(rd *round, key string, open func() (io.Closer, error)) (io.Closer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rd.keys == nil {
		rd.keys = map[string]bool{}
	}
	rd.keys[key] = true
	if c, ok := r.open[key]; ok {
		return c, nil
	}
	c, err := open()
	if err != nil {
		return nil, err
	}
	if r.open == nil {
		r.open = map[string]io.Closer{}
	}
	r.open[key] = c
	return c, nil
}

// keepOnly closes the resources rd did not ask for (nil: all), in the
// background: a query still holding one finds it closed (a tap's queue
// drops what it is sent).
func (r *resources) keepOnly(rd *round) {
	r.mu.Lock()
	var gone []io.Closer
	for k, c := range r.open {
		if rd == nil || !rd.keys[k] {
			gone = append(gone, c)
			delete(r.open, k)
		}
	}
	r.mu.Unlock()
	for _, c := range gone {
		go c.Close()
	}
}
