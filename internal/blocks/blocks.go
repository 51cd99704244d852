// Package blocks is the one place that decides which block serves a name.
// What serves each part of the name space (the Corefile's server blocks as
// one view sees them, or without a Corefile the zones the flags name) is
// compiled into a View: per zone, one Block holding what the server and
// the resolver read (resolve.Block: its cache policy, its CoreDNS metric
// zone, its answer-side handlers, its fetch) and how its misses are
// fetched (Route: its fetch-side directive chain, its forward group, the
// view's own or the shared route table's, or REFUSED). A query looks its
// name up once, when it arrives (the server asks its view's resolver,
// whose BlockFunc is a View's Block); the Block rides with the query and
// its miss to the fetch (resolve.Fetcher, which the Block is), and a
// directive's own lookups (a template's CNAME target) look up the same
// View, so nothing is matched twice and nothing matches elsewhere.
//
// A View is built whole and never changed: a reload (a Corefile edit, a
// new ConfigMap or resolv.conf: internal/running) compiles new ones and
// publishes them at once, so a query sees the old configuration or the
// new one, never a mix.
//
// The sources a view is compiled from live here too: the blocks' fetch-side
// chains (BuildChains: each block's directives, registered with
// internal/directive, linked in plugin.cfg order) and, with several views,
// a view's own routes (Routes: its groups, its refused zones). Each
// source is a zone table (internal/zone): compiling costs the zones'
// labels, not the product of the sources' sizes.
package blocks

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Route is how the misses of a block's names are fetched.
type Route struct {
	// Run is the block's fetch-side chain (template, hosts, rewrite,
	// dns64, ending in its forward); nil: the fetch is a plain forward.
	Run directive.Next
	// Group is the forward group of the zone: the view's own, or the
	// shared route table's; nil: no route (the fetch fails).
	Group *forward.Group
	// Refused: no block of the view serves the zone (CoreDNS answers
	// REFUSED).
	Refused bool
}

// Forwarder fetches the misses of a view's blocks by their Route
// (internal/running's: the groups, the retry when a reload routed a name
// elsewhere, dnstap's forward tries).
type Forwarder interface {
	// Start is resolve.Fetcher's Start for the block b.
	Start(b *Block, name, query []byte, asker netip.AddrPort, timeout time.Duration, done resolve.FetchDone) bool
	// Fetch is resolve.Fetcher's Fetch for the block b.
	Fetch(ctx context.Context, b *Block, qname string, query []byte) ([]byte, error)
}

// Block is what serves the names of one zone (the longest zone of the
// view holding them).
type Block struct {
	// Block is what the server and the resolver read; its Fetcher is this
	// Block (with a Forwarder), so the fetch finds the Route.
	resolve.Block
	Route
	fwd Forwarder
}

// Start and Fetch make a Block its own resolve.Fetcher: they hand the
// miss to the view's Forwarder with the block's Route.
func (b *Block) Start(_ *resolve.Block, name, query []byte, asker netip.AddrPort, timeout time.Duration, done resolve.FetchDone) bool {
	return b.fwd.Start(b, name, query, asker, timeout, done)
}

func (b *Block) Fetch(ctx context.Context, _ *resolve.Block, qname string, query []byte) ([]byte, error) {
	return b.fwd.Fetch(ctx, b, qname, query)
}

// View is the compiled table of one view. Safe for concurrent use; never
// modified once compiled.
type View struct {
	t *zone.Table[*Block]
}

// Compile builds a view over zones (any order, duplicates ignored; "."
// allowed). at gives the block of a zone as the configuration says it,
// evaluated at the zone's own name; def is the block of names in no zone.
// fwd fetches the blocks' misses (nil: the resolver's Config.Fetch).
//
// The sources of a block (the policies, the chains, the view's routes) may
// each know a different set of zones: zones must be their union. Then the
// longest zone holding a name is also the longest of each source's zones
// holding it, extended to the union, so evaluating every source at that
// zone gives what it would give for the name.
func Compile(zones []string, def Block, fwd Forwarder, at func(zone string) (Block, error)) (*View, error) {
	d := &def
	d.fwd = fwd
	if fwd != nil {
		d.Fetcher = d
	}
	b := zone.NewBuilder(d)
	for _, z := range zones {
		if b.Has(z) {
			continue
		}
		blk, err := at(z)
		if err != nil {
			return nil, fmt.Errorf("blocks: zone %s: %w", z, err)
		}
		bp := &blk
		bp.Zone, bp.fwd = z, fwd
		if fwd != nil {
			bp.Fetcher = bp
		}
		if err := b.Set(z, bp); err != nil {
			return nil, fmt.Errorf("blocks: invalid zone %q", z)
		}
	}
	return &View{t: b.Table()}, nil
}

// Lookup returns the block serving name (wire format, any case). It
// allocates nothing, and costs the name's labels, not the view's zones.
func (v *View) Lookup(name []byte) *Block { return v.t.Lookup(name) }

// Block is Lookup's block as the server and the resolver see it: a
// resolve.BlockFunc.
func (v *View) Block(name []byte) *resolve.Block { return &v.t.Lookup(name).Block }

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
	// Answers are the answer-side handlers of the blocks the view sees, by
	// their zones (the longest holding a zone is its block's); nil: no
	// block has any.
	Answers []Answers
	// Forwarder fetches the blocks' misses; nil: the resolver's
	// Config.Fetch and Config.Start.
	Forwarder Forwarder
}

// Answers is the answer-side chain (log, loadbalance, whoami, ...) of the
// block serving the names of Zone in one view.
type Answers struct {
	Zone  string // lower-case FQDN
	Chain *answer.Chain
}

// CompileView compiles a view from its sources. Its zones are the union
// of theirs, so the longest zone holding a name is also each source's.
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
	ab := zone.NewBuilder[*answer.Chain](nil)
	for _, a := range s.Answers {
		zones = append(zones, a.Zone)
		if err := ab.SetFirst(a.Zone, a.Chain); err != nil {
			return nil, fmt.Errorf("blocks: %w", err)
		}
	}
	answers := ab.Table()
	chains := s.Chains.table()
	def := Block{Block: resolve.Block{Policy: s.Default, Metric: -1}}
	return Compile(zones, def, s.Forwarder, func(z string) (Block, error) {
		w, err := zoneWire(z)
		if err != nil {
			return Block{}, err
		}
		b := Block{Block: resolve.Block{Policy: *s.Policy(w), Metric: metrics.Lookup(w), Answer: answers.Lookup(w)}}
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
		if b.Refused {
			// No block here (another bind or port): CoreDNS refuses it
			// before any zone and counts it as "dropped".
			b.Metric = resolve.MetricDropped
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

// zoneWire is the wire form of a zone as the sources give it.
func zoneWire(z string) ([]byte, error) {
	w, ok := wire.AppendNameWire(nil, z)
	if !ok {
		return nil, fmt.Errorf("invalid zone name %q", z)
	}
	return w, nil
}
