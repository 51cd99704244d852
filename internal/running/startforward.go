package running

import (
	"context"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// startShared starts the forward of name through the shared routes (the
// Router), as forward does.
func (d *State) startShared(name string, query []byte, timeout time.Duration, done resolve.FetchDone) bool {
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

// asyncForward is one startShared in flight.
type asyncForward struct {
	d       *State
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
