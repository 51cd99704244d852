package resolve

import (
	"context"
	"net/netip"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Block is what serves the names of one zone (the longest zone of a view
// holding them, as CoreDNS picks a server block): how their answers are
// cached, how a miss of theirs is fetched, and what every answer they get
// goes through. A view's blocks are compiled whole (internal/blocks) and
// never changed; a query finds its block once, when it arrives (the
// server asks the Resolver's BlockFunc), and the block rides with it: to
// the cache, the miss, its flight and its fetch, so nothing looks the
// name up again.
type Block struct {
	// Zone is the zone, a lower-case FQDN; "" for the names in no zone.
	Zone string
	// Policy is the cache policy of the names.
	Policy Policy
	// Fetcher fetches the names' misses (the block's directive chain and
	// forward: internal/blocks, internal/running); nil: the Resolver's
	// Config.Fetch and Config.Start.
	Fetcher Fetcher
	// Metric is the index of the block's CoreDNS metric zone
	// (server.Config.CoreDNSZones), -1 for none, or MetricDropped for
	// names no block serves where they arrived. The server's: resolve
	// carries it unread.
	Metric int
	// Answer is what the block does to every query it answers (log,
	// dnstap, loadbalance, ...: internal/answer), nil for nothing. The
	// server's: resolve carries it unread.
	Answer *answer.Chain
}

// MetricDropped is the Metric of a block that serves no name where its
// queries arrive (CoreDNS refuses them and counts them as "dropped").
const MetricDropped = -2

// BlockFunc returns the block serving a question name (wire format, any
// case). It must not return nil, and must not allocate: the server asks
// it once per query.
type BlockFunc func(name []byte) *Block

// PolicyFunc gives a question name (wire format, any case) its cache
// policy: what a view's blocks are compiled from (internal/blocks).
type PolicyFunc func(name []byte) *Policy

// Policies is f's PolicyFunc: the policy of the block of a name.
func (f BlockFunc) Policies() PolicyFunc {
	return func(name []byte) *Policy { return &f(name).Policy }
}

// Fetcher fetches the misses of a block.
type Fetcher interface {
	// Start starts fetching query (wire format, ID chosen by the
	// transport) for the wire-format, lower-case question name of b
	// without blocking, and reports true; the answer or the error then
	// goes to done.Fetched exactly once, within timeout, from whichever
	// goroutine learnt it (possibly before Start returns). asker is the
	// flight's first asker (wire.Query.From and FromPort; zero for a
	// prefetch). It reports false, having started nothing, when the fetch
	// must block (Fetch, in a goroutine of its own). query stays
	// unchanged until done is called.
	Start(b *Block, name, query []byte, asker netip.AddrPort, timeout time.Duration, done FetchDone) bool
	// Fetch fetches query for the lower-case FQDN qname of b, blocking;
	// ctx carries the deadline and the asker (Asker).
	Fetch(ctx context.Context, b *Block, qname string, query []byte) ([]byte, error)
}

// Zone gives the names at and under Name (an FQDN, "cluster.local.") a
// Policy.
type Zone struct {
	Name   string
	Policy Policy
}

// Zones returns a BlockFunc that gives a name the block of the longest
// zone it is in (a block with the zone's policy and the Resolver's
// fetch), and one with def when it is in none. Zone names are compared
// case-insensitively; "." matches every name; of a zone listed twice the
// first counts.
func Zones(def Policy, zones ...Zone) (BlockFunc, error) {
	b := zone.NewBuilder(&Block{Policy: def, Metric: -1})
	for _, z := range zones {
		if err := b.SetFirst(z.Name, &Block{Zone: z.Name, Policy: z.Policy, Metric: -1}); err != nil {
			return nil, err
		}
	}
	return b.Table().Lookup, nil
}
