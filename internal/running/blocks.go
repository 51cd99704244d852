package running

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/rewrite"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/trace"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The block tables (internal/blocks): every resolver's PolicyFunc is its
// view's table's blocks.View.Policy, so a query finds its block once: the
// server reads the block's CoreDNS metric zone from it (CoreDNSZone), and
// a miss carries the block as the policy's Route to startIn (resolve's
// StartFunc) and fetchIn (its FetchFunc, through resolve.PolicyOf), which
// match nothing again. The block's group is the view's own or the shared
// route table's (reload.go), so the shared routes are compiled into every
// table too: apply recompiles them all when the routes change. The shared
// view (the one-view case's, and autopath's resolver) is d.shared,
// compiled from the blocks' cache policies and chains and swapped whole by
// a Corefile reload; each view of several has its table in its viewTable
// (views.go).

// sharedPolicy is what a view's blocks are compiled from besides the
// chains and routes: the cache policies (over zones) and what each block
// does to every answer it sends (its log, its loadbalance).
type sharedPolicy struct {
	pol     resolve.PolicyFunc
	zones   []string
	answers []blocks.Answers
}

// blockAnswers are the log, loadbalance and whoami of the blocks of srv, by their
// zones, as one view sees them: pick gives the block serving a zone's
// names there (-1: none, the zone is refused). nil when no block logs,
// shuffles or answers whoami.
func (d *State) blockAnswers(srv []*corefile.Server, pick func(zone string) int, tracers func(int) *trace.Tracer) []blocks.Answers {
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
			a := blocks.Answers{Zone: strings.ToLower(z), Log: srv[p].LogRules, Shuffle: srv[p].Loadbalance, Balance: srv[p].Balance, Whoami: srv[p].WhoamiAnswers(),
				Rewrite: rewrite.Answers(srv[p].Rewrites), Taps: d.tapsFor(srv[p].Dnstap)}
			if tracers != nil {
				a.Trace = tracers(p)
			}
			acts = acts || len(a.Log) > 0 || a.Shuffle || a.Whoami || a.Trace != nil || a.Rewrite != nil || len(a.Taps) > 0
			out = append(out, a)
		}
	}
	if !acts {
		return nil
	}
	return out
}

// tracers returns the trace of block p of srv (nil: the block has no
// trace): one Tracer per block, shared by every view that sees it (one
// sampling count per block, as CoreDNS's one plugin instance per server
// block), made anew for each Corefile loaded (CoreDNS's count restarts
// on reload too). Its exporter is the process's one for the endpoint.
func (d *State) tracers(srv []*corefile.Server) func(int) *trace.Tracer {
	return func(p int) *trace.Tracer {
		s := srv[p]
		if s.Trace == nil {
			return nil
		}
		d.traceMu.Lock()
		defer d.traceMu.Unlock()
		if len(d.traceFor) == 0 || d.traceFor[0] != srv[0] {
			// Another Corefile: forget the last one's tracers.
			d.traceFor, d.traceOf = srv, map[*corefile.Server]*trace.Tracer{}
		}
		if t := d.traceOf[s]; t != nil {
			return t
		}
		exp, err := trace.ExporterFor(*s.Trace, d.log.With("component", "trace"))
		if err != nil {
			d.log.Warn("trace: the block's queries are not traced", "block", strings.Join(s.Keys, " "), "err", err)
			return nil
		}
		var local netip.AddrPort
		if len(s.Bind) > 0 {
			local = netip.AddrPortFrom(s.Bind[0], uint16(s.Port))
		}
		t := trace.NewTracer(*s.Trace, trace.Chain(func(n string) bool {
			return slices.ContainsFunc(s.Plugins, func(p corefile.Plugin) bool { return p.Name == n })
		}), local, exp)
		d.traceOf[s] = t
		return t
	}
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

// BlockAnswers is what the block of a policy does to every answer it sends
// (server.Config.BlockAnswers): its log (nil: none), its loadbalance, and
// whether whoami answers it.
func BlockAnswers(p *resolve.Policy) server.Answers {
	if b := blocks.Of(p); b != nil {
		return server.Answers{Log: b.Log, Shuffle: b.Shuffle, Balance: b.Balance, Whoami: b.Whoami, Trace: b.Trace, Rewrite: b.Rewrite, Taps: b.Taps}
	}
	return server.Answers{}
}

// noteActs tells the server whether some block of the tables serving now
// logs, shuffles or answers whoami (server.SetBlockActs); called after
// every swap.
func (d *State) noteActs() {
	if d.Server == nil {
		return
	}
	logs, shuffles, whoami := d.shared.Load().Acts()
	traces := d.shared.Load().Traces()
	rewrites := d.shared.Load().Rewrites()
	taps := d.shared.Load().Taps()
	if d.views != nil {
		for _, t := range d.views.tables {
			l, s, w := t.v.Load().Acts()
			logs, shuffles, whoami = logs || l, shuffles || s, whoami || w
			traces = traces || t.v.Load().Traces()
			rewrites = rewrites || t.v.Load().Rewrites()
			taps = taps || t.v.Load().Taps()
		}
	}
	d.Server.SetBlockActs(server.BlockActs{Log: logs, Shuffle: shuffles, Whoami: whoami, Trace: traces, Rewrite: rewrites, Tap: taps})
}

// compileView compiles a view from its policies, its chains (nil: none)
// and, with several views, its own routes (nil: none), over the shared
// route table and the CoreDNS metric zones: metrics, the view's (nil: all).
func (d *State) compileView(sp sharedPolicy, c *blocks.Chains, vr *blocks.Routes, metrics []string) (*blocks.View, error) {
	if metrics == nil {
		metrics = d.metricZones
	}
	return blocks.CompileView(blocks.Sources{
		Default: d.policyDefault, Policy: sp.pol, PolicyZones: sp.zones,
		Chains: c, Own: vr, Shared: d.routes, Metrics: metrics,
		Answers: sp.answers, Sink: d.sink,
	})
}

// sharedView is the shared view's compiled blocks now.
func (d *State) sharedView(name []byte) *resolve.Policy { return d.shared.Load().Policy(name) }

// CoreDNSZone is the CoreDNS metric zone of a policy's block
// (server.Config.CoreDNSZone): the index in CoreDNSZones, -1 for none.
func CoreDNSZone(p *resolve.Policy) int {
	if b := blocks.Of(p); b != nil {
		if b.Refused {
			// No block here (another bind or port): CoreDNS refuses it
			// before any zone and counts it as "dropped".
			return server.CDDroppedZone
		}
		return b.Metric
	}
	return -1
}

// startIn is the StartFunc of the resolver serving by table
// (resolve.Resolver.Start): a miss whose block's fetch is a plain forward
// goes to the block's group with ExchangeAsync, and the group's reader
// hands the answer on (startforward.go). It declines (the fetch then runs
// through fetchIn, blocking) when the block runs directives, refuses the
// zone or has no group.
func (d *State) startIn(table func() *blocks.View) resolve.StartFunc {
	return func(pol *resolve.Policy, qname []byte, query []byte, timeout time.Duration, done resolve.FetchDone) bool {
		b := blocks.Of(pol)
		if b == nil || b.Run != nil || b.Refused || b.Group == nil {
			return false
		}
		d.startAsync(table, b, qname, query, timeout, done)
		return true
	}
}

// fetchIn is the FetchFunc of the resolver serving by table: the block's
// chain when it runs directives (ending in forwardIn), REFUSED when the
// view serves no block for the name (as CoreDNS answers), else the block's
// group.
func (d *State) fetchIn(table func() *blocks.View) resolve.FetchFunc {
	return func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		name, ok := wireName(qname)           // nil when it does not pack: no second ask
		b := blocks.Of(resolve.PolicyOf(ctx)) // every resolver's policies are a table's
		if b == nil {
			if !ok {
				return nil, errors.New("invalid name " + qname)
			}
			b = table().Lookup(name)
		}
		switch {
		case b.Run != nil:
			return blocks.RunChain(ctx, b.Run, qname, query)
		case b.Refused:
			return blocks.RefusedAnswer(query)
		}
		return d.exchange(tapping(ctx, b), table, name, b.Group, query)
	}
}

// forwardIn is the end of the chains of the view table serves: the
// forward of the block holding qname (the name the client asked, before
// any rewrite), or REFUSED; never the block's chain again.
func (d *State) forwardIn(table func() *blocks.View) resolve.FetchFunc {
	return func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		name, ok := wireName(qname)
		if !ok {
			return nil, errors.New("invalid name " + qname)
		}
		b := table().Lookup(name)
		if b.Refused {
			return blocks.RefusedAnswer(query)
		}
		return d.exchange(tapping(ctx, b), table, name, b.Group, query)
	}
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
func (d *State) exchange(ctx context.Context, table func() *blocks.View, name []byte, g *forward.Group, query []byte) ([]byte, error) {
	for try := 1; ; try++ {
		if g == nil {
			return nil, errors.New("no route for " + wire.NameString(name))
		}
		ans, err := g.Exchange(ctx, query)
		if name == nil {
			return ans, err
		}
		now := table().Lookup(name).Group
		if now == g || now == nil || try == 3 || ctx.Err() != nil {
			return ans, err
		}
		g = now
	}
}

// tapping is ctx telling the forward of b's dnstap (forwardTap), when b
// has one.
func tapping(ctx context.Context, b *blocks.Block) context.Context {
	if len(b.Taps) == 0 {
		return ctx
	}
	return forward.WithTapper(ctx, forwardTap{taps: b.Taps, client: resolve.AskerPort(ctx)})
}

// tapsFor are the taps of a block's dnstap directives: one Tap per
// distinct configuration, shared by every block and view that has it and
// kept across reloads that keep it (closeUnusedTaps closes the others).
func (d *State) tapsFor(cfgs []dnstap.Config) []*dnstap.Tap {
	if len(cfgs) == 0 {
		return nil
	}
	d.tapMu.Lock()
	defer d.tapMu.Unlock()
	if d.taps == nil {
		d.taps = map[string]*dnstap.Tap{}
	}
	out := make([]*dnstap.Tap, 0, len(cfgs))
	for _, c := range cfgs {
		k := c.Key()
		t := d.taps[k]
		if t == nil {
			t = dnstap.New(c, d.log)
			d.taps[k] = t
		}
		out = append(out, t)
	}
	return out
}

// closeUnusedTaps closes the taps no block of srv has (nil: all), once
// the tables that held them are no longer served.
func (d *State) closeUnusedTaps(srv []*corefile.Server) {
	used := map[string]bool{}
	{
		for _, s := range srv {
			for _, c := range s.Dnstap {
				used[c.Key()] = true
			}
		}
	}
	d.tapMu.Lock()
	var gone []*dnstap.Tap
	for k, t := range d.taps {
		if !used[k] {
			gone = append(gone, t)
			delete(d.taps, k)
		}
	}
	d.tapMu.Unlock()
	for _, t := range gone {
		go t.Close() // a query still holding it sends into a closed queue's drops
	}
}
