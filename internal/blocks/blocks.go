// Package blocks is the one place that decides which block serves a name.
// What serves each part of the name space (the Corefile's server blocks as
// one view sees them, or without a Corefile the zones the flags name) is
// compiled into a View: per zone, one Block holding its cache policy, its
// fetch-side directive chain, its forward group (the view's own, or the
// shared route table's: kube-dns, stub domains, the node's resolvers),
// whether the zone is refused, its CoreDNS metric zone, and what it does
// to every answer it sends (its log, its loadbalance). A query looks its
// name up once (the resolver's PolicyFunc, which the server also asks for
// the metric zone, the log and the loadbalance of an answer); the Block rides with a miss as the policy's Route
// to the fetch (resolve's StartFunc, and PolicyOf in a FetchFunc), and a
// directive's own lookups (a template's CNAME target) look up the same
// View, so nothing is matched twice and nothing matches elsewhere.
//
// A View is built whole and never changed: a reload (a Corefile edit, a
// new ConfigMap or resolv.conf: internal/running) compiles a new one and
// swaps one pointer, so a query sees the old configuration or the new one,
// never a mix.
//
// The sources a view is compiled from live here too: the blocks' fetch-side
// chains (BuildChains: each block's directives, registered with
// internal/directive, linked in plugin.cfg order) and, with several views,
// a view's own routes (Routes: its groups, its refused zones).
package blocks

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/rwanswer"
	"github.com/nodelocaldns/nodelocaldns/internal/trace"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Block is what serves the names of one zone (the longest zone of the
// view holding them).
type Block struct {
	// Zone is the zone, a lower-case FQDN; "" for the names in no zone.
	Zone string
	// Policy is the cache policy; its Route is this Block.
	Policy resolve.Policy
	// Run is the block's fetch-side chain (template, hosts, rewrite,
	// dns64, ending in its forward); nil: the fetch is a plain forward.
	Run directive.Next
	// Group is the forward group of the zone: the view's own, or the
	// shared route table's; nil: no route (the fetch fails).
	Group *forward.Group
	// Refused: no block of the view serves the zone (CoreDNS answers
	// REFUSED).
	Refused bool
	// Metric is the CoreDNS metric zone of the names (the index of its
	// label in Sources.Metrics, as server.Config.CoreDNSZones lists them);
	// -1: none holds them.
	Metric int
	// Log is the block's log (the Corefile's log: internal/dnslog); nil:
	// the block does not log.
	Log *dnslog.Log
	// Shuffle: the block has loadbalance (internal/loadbalance), every
	// answer it sends is shuffled, hits too.
	Shuffle bool
	// Balance is loadbalance's weighted policy or prefer subnets (nil:
	// plain round_robin).
	Balance *loadbalance.Policy
	// Trace is the block's trace (the Corefile's trace:
	// internal/trace); nil: the block's queries are not traced.
	Trace *trace.Tracer
	// Whoami: the block answers every query with the client's own
	// address and port (internal/whoami), before the cache.
	Whoami bool
	// Rewrite: the block's rewrite ttl and rcode rules, applied to every
	// answer it sends, hits too (internal/rwanswer); nil: none.
	Rewrite *rwanswer.Rules
	// Taps are the block's dnstap directives (internal/dnstap); nil:
	// none.
	Taps []*dnstap.Tap
}

// View is the compiled table of one view. Safe for concurrent use; never
// modified once compiled.
type View struct {
	t        *zone.Table[*Block]
	logs     bool // some block logs
	shuffles bool // some block shuffles
	whoami   bool // some block answers whoami
	traces   bool // some block traces
	rewrites bool // some block rewrites its answers
	taps     bool // some block taps (dnstap)
}

// Compile builds a view over zones (any order, duplicates ignored; "."
// allowed). at gives the block of a zone as the configuration says it,
// evaluated at the zone's own name; def is the block of names in no zone.
//
// The sources of a block (the policies, the chains, the view's routes) may
// each know a different set of zones: zones must be their union. Then the
// longest zone holding a name is also the longest of each source's zones
// holding it, extended to the union, so evaluating every source at that
// zone gives what it would give for the name.
func Compile(zones []string, def Block, at func(zone string) (Block, error)) (*View, error) {
	d := &def
	d.Policy.Route = d
	b := zone.NewBuilder(d)
	v := &View{}
	note := func(x *Block) {
		v.logs = v.logs || x.Log != nil
		v.shuffles = v.shuffles || x.Shuffle
		v.whoami = v.whoami || x.Whoami
		v.traces = v.traces || x.Trace != nil
		v.rewrites = v.rewrites || x.Rewrite != nil
		v.taps = v.taps || len(x.Taps) > 0
	}
	note(d)
	for _, z := range zones {
		if b.Has(z) {
			continue
		}
		blk, err := at(z)
		if err != nil {
			return nil, fmt.Errorf("blocks: zone %s: %w", z, err)
		}
		blk.Zone = z
		bp := &blk
		bp.Policy.Route = bp
		if err := b.Set(z, bp); err != nil {
			return nil, fmt.Errorf("blocks: invalid zone %q", z)
		}
		note(bp)
	}
	v.t = b.Table()
	return v, nil
}

// Acts reports whether some block of the view logs, whether some
// shuffles and whether some answers whoami: the server asks a name's
// block for them only then.
func (v *View) Acts() (logs, shuffles, whoami bool) { return v.logs, v.shuffles, v.whoami }

// Traces reports whether some block of the view traces its queries.
func (v *View) Traces() bool { return v.traces }

// Rewrites reports whether some block of the view has rewrite ttl or
// rcode rules (Block.Rewrite).
func (v *View) Rewrites() bool { return v.rewrites }

// Taps reports whether some block of the view has dnstap.
func (v *View) Taps() bool { return v.taps }

// Lookup returns the block serving name (wire format, any case). It
// allocates nothing, and costs the name's labels, not the view's zones.
func (v *View) Lookup(name []byte) *Block { return v.t.Lookup(name) }

// Policy is Lookup's block's policy: a resolve.PolicyFunc.
func (v *View) Policy(name []byte) *resolve.Policy { return &v.Lookup(name).Policy }

// Of returns the block a policy was found with (its Route); nil when it
// came from elsewhere.
func Of(p *resolve.Policy) *Block {
	if p == nil {
		return nil
	}
	b, _ := p.Route.(*Block)
	return b
}

// Zones lists the view's zones, longest first (for logs and tests).
func (v *View) Zones() []string {
	out := slices.Clone(v.t.Zones())
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return out
}

// Sources are what a view's blocks are compiled from.
type Sources struct {
	// Default is the cache policy of names in no zone.
	Default resolve.Policy
	// Policy gives the blocks' cache policies (resolve.Zones) over the
	// zones PolicyZones.
	Policy      resolve.PolicyFunc
	PolicyZones []string
	// Chains are the view's fetch-side chains; nil: none.
	Chains *Chains
	// Own are the view's own routes (several views); nil: none.
	Own *Routes
	// Shared is the shared route table: a zone's group serves the names
	// of its longest zone (of a zone listed twice, the last); zones are
	// lower-case FQDNs.
	Shared []forward.Route
	// Metrics are CoreDNS's metric zones, by label index (a zone listed
	// twice keeps the first, the root the last, as CoreDNS's servers
	// listed them; "" is no zone: a label of no block of this view).
	Metrics []string
	// Answers are what the view's blocks do to every answer they send
	// (log, loadbalance) and whether they answer whoami, by the zones of the blocks the view sees; the
	// longest holding a zone is its block. nil: no block does anything.
	Answers []Answers
	// Sink is where the blocks' log lines go; required when a block of
	// Answers logs.
	Sink *dnslog.Sink
}

// Answers is what the block serving the names of Zone (in one view) does
// to every answer it sends, besides caching.
type Answers struct {
	Zone    string              // lower-case FQDN
	Log     []dnslog.Rule       // the block's log rules; nil: no log
	Shuffle bool                // loadbalance
	Balance *loadbalance.Policy // loadbalance weighted or prefer; nil: round_robin
	Whoami  bool                // whoami answers the block's queries
	Trace   *trace.Tracer       // the block's trace; nil: none
	Rewrite *rwanswer.Rules     // rewrite's ttl and rcode rules; nil: none
	Taps    []*dnstap.Tap       // the block's dnstap directives, opened; nil: none
}

// CompileView compiles a view from its sources. Its zones are the union
// of theirs, so the longest zone holding a name is also each source's.
// Each source is a zone table, so the compile costs the zones' labels,
// not the product of the sources' sizes.
func CompileView(s Sources) (*View, error) {
	zones := slices.Clone(s.PolicyZones)
	zones = append(zones, s.Chains.Zones()...)
	if s.Own != nil {
		zones = append(zones, s.Own.Zones...)
	}
	shared := zone.NewBuilder[*forward.Group](nil)
	for _, r := range s.Shared {
		zones = append(zones, r.Zone)
		_ = shared.Set(r.Zone, r.Group) // of a zone listed twice, the last
	}
	routes := shared.Table()
	zones = append(zones, s.Metrics...)
	metrics := metricTable(s.Metrics)
	answers := zone.NewBuilder(-1)
	logs := make([]*dnslog.Log, len(s.Answers)) // one Log per block and view
	for i, a := range s.Answers {
		zones = append(zones, a.Zone)
		if err := answers.SetFirst(a.Zone, i); err != nil {
			return nil, fmt.Errorf("blocks: %w", err)
		}
		if len(a.Log) > 0 {
			if s.Sink == nil {
				return nil, fmt.Errorf("blocks: zone %s logs without a sink", a.Zone)
			}
			logs[i] = s.Sink.Compile(a.Log)
		}
	}
	ans := answers.Table()
	chains := s.Chains.table()
	def := Block{Policy: s.Default, Metric: -1}
	return Compile(zones, def, func(z string) (Block, error) {
		w, ok := wire.AppendNameWire(nil, z)
		if !ok {
			return Block{}, fmt.Errorf("invalid zone name %q", z)
		}
		b := Block{Policy: *s.Policy(w), Metric: metrics.Lookup(w)}
		if chains != nil {
			if c := chains.Lookup(w); c != nil {
				b.Run = c.run
			}
		}
		if s.Own != nil {
			b.Refused, b.Group = s.Own.At(z)
		}
		if b.Group == nil {
			b.Group = routes.Lookup(w)
		}
		if i := ans.Lookup(w); i >= 0 {
			a := &s.Answers[i]
			b.Log, b.Shuffle, b.Balance, b.Whoami, b.Trace = logs[i], a.Shuffle, a.Balance, a.Whoami, a.Trace
			b.Rewrite = a.Rewrite
			b.Taps = a.Taps
		}
		return b, nil
	})
}

// metricTable gives a zone the index of the longest metric zone holding
// it (-1: none): of a zone listed twice the first, of the root the last
// (as CoreDNS's servers list them); "" is no zone.
func metricTable(metrics []string) *zone.Table[int] {
	b := zone.NewBuilder(-1)
	for i, z := range metrics {
		switch {
		case z == "":
		case z == ".":
			_ = b.Set(z, i)
		default:
			_ = b.SetFirst(z, i)
		}
	}
	return b.Table()
}
