package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// startForward is the resolver's StartFunc (resolve.Resolver.Start): a miss whose fetch is a
// plain forward (no Corefile directive of its block runs for it) goes to its zone's group with
// ExchangeAsync, and the group's reader hands the answer on. It declines (the fetch then runs
// through chainFetch and forward, blocking) when a block's chain runs for the name or no route
// takes it (forward gives that error).
func (d *Daemon) startForward(qname []byte, query []byte, timeout time.Duration, done resolve.FetchDone) bool {
	name := wire.NameString(qname)
	if c := d.chain.Load(); c != nil && c.runs(name) {
		return false
	}
	return d.startShared(name, query, timeout, done)
}

// startShared starts the forward of name through the shared routes (the
// Router), as forward does.
func (d *Daemon) startShared(name string, query []byte, timeout time.Duration, done resolve.FetchDone) bool {
	routes := d.Router.Current()
	g := routes.Lookup(name)
	if g == nil {
		return false
	}
	f := asyncForwards.Get().(*asyncForward)
	f.d, f.g, f.routes, f.name, f.query, f.timeout, f.done = d, g, routes, name, query, timeout, done
	g.ExchangeAsync(query, timeout, f)
	return true
}

// asyncForward is one startForward in flight.
type asyncForward struct {
	d       *Daemon
	g       *forward.Group
	routes  *forward.RouteTable // the routes g was looked up in
	name    string
	query   []byte
	timeout time.Duration
	done    resolve.FetchDone
}

var asyncForwards = sync.Pool{New: func() any { return new(asyncForward) }}

// ExchangeDone hands the group's result on. When a reload routed the zone elsewhere while the
// query was out, the answer (or the ErrClosed of a retired group) reflects the old
// configuration: the new group is asked, as forward does, in a goroutine.
func (f *asyncForward) ExchangeDone(ans []byte, err error) {
	d, g, routes, name, query, timeout, done := f.d, f.g, f.routes, f.name, f.query, f.timeout, f.done
	*f = asyncForward{}
	asyncForwards.Put(f)
	if d.Router.Current() == routes {
		done.Fetched(ans, err) // no reload since: the common case, without a second lookup
		return
	}
	if now := d.Router.Lookup(name); now != nil && now != g {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			done.Fetched(d.forward(ctx, name, query))
		}()
		return
	}
	done.Fetched(ans, err)
}
