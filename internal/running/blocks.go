package running

import (
	"context"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The block table (internal/blocks): every resolver's PolicyFunc is its
// view's blocks.View.Policy, so a miss finds its block once, and the block
// rides with it as the policy's Route: startBlock (resolve's StartFunc)
// and fetchBlock (its FetchFunc, through resolve.PolicyOf) read it and
// match nothing again. The shared view (the one-view case's, and
// autopath's resolver) is d.shared, compiled from the blocks' cache
// policies and chains and swapped whole by a Corefile reload; each view of
// several is compiled with its resolver and replaced with it (views.go).

// sharedPolicy is what the shared view's policies are compiled from.
type sharedPolicy struct {
	pol   resolve.PolicyFunc
	zones []string
}

// compileView compiles a view from its policies, its chains (nil: none)
// and, with several views, its routes (nil: the shared route table).
func (d *State) compileView(sp sharedPolicy, c *blocks.Chains, vr *blocks.Routes) (*blocks.View, error) {
	return blocks.CompileView(d.policyDefault, sp.pol, sp.zones, c, vr)
}

// sharedView is the shared view's compiled blocks now.
func (d *State) sharedView(name []byte) *resolve.Policy { return d.shared.Load().Policy(name) }

// startBlock is every resolver's StartFunc (resolve.Resolver.Start): a
// miss whose block's fetch is a plain forward goes to the block's group, or
// the shared route table's group for the name, with ExchangeAsync, and the
// group's reader hands the answer on. It declines (the fetch then runs
// through fetchBlock, blocking) when the block runs directives or refuses
// the zone, or no route takes the name (forward gives that error).
func (d *State) startBlock(pol *resolve.Policy, qname []byte, query []byte, timeout time.Duration, done resolve.FetchDone) bool {
	if b := blocks.Of(pol); b != nil {
		if b.Run != nil || b.Refused {
			return false
		}
		if b.Group != nil {
			b.Group.ExchangeAsync(query, timeout, fetchDone{done})
			return true
		}
	}
	return d.startShared(wire.NameString(qname), query, timeout, done)
}

// fetchBlock is every resolver's FetchFunc: the block's chain when it runs
// directives (ending in the view's routes), REFUSED when the view serves
// no block for the name (as CoreDNS answers), the view's own group, or the
// shared route table.
func (d *State) fetchBlock(ctx context.Context, qname string, query []byte) ([]byte, error) {
	b := blocks.Of(resolve.PolicyOf(ctx))
	switch {
	case b == nil:
	case b.Run != nil:
		return blocks.RunChain(ctx, b.Run, qname, query)
	case b.Refused:
		return blocks.RefusedAnswer(query)
	case b.Group != nil:
		return b.Group.Exchange(ctx, query)
	}
	return d.forward(ctx, qname, query)
}
