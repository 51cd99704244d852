package running

import (
	"context"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// startAsync starts the forward of a miss to its block's group; the
// group's reader calls ExchangeDone.
func (d *State) startAsync(table func() *blocks.View, b *blocks.Block, name []byte, query []byte, timeout time.Duration, done resolve.FetchDone) {
	f := asyncForwards.Get().(*asyncForward)
	f.d, f.table, f.view, f.g, f.query, f.timeout, f.done = d, table, table(), b.Group, query, timeout, done
	f.name = append(f.name[:0], name...)
	b.Group.ExchangeAsync(query, timeout, f)
}

// asyncForward is one startAsync in flight.
type asyncForward struct {
	d       *State
	table   func() *blocks.View
	view    *blocks.View // the table g was looked up in
	g       *forward.Group
	name    []byte // wire; the buffer is kept with the pooled value
	query   []byte
	timeout time.Duration
	done    resolve.FetchDone
}

var asyncForwards = sync.Pool{New: func() any { return new(asyncForward) }}

// ExchangeDone hands the group's result on. When a reload routed the zone
// elsewhere while the query was out, the answer (or the ErrClosed of a
// retired group) reflects the old configuration: the new group is asked,
// as exchange does, in a goroutine.
func (f *asyncForward) ExchangeDone(ans []byte, err error) {
	d, table, view, g, query, timeout, done := f.d, f.table, f.view, f.g, f.query, f.timeout, f.done
	if table() == view {
		// No reload since: the common case, without a second lookup.
		f.release()
		done.Fetched(ans, err)
		return
	}
	if now := table().Lookup(f.name).Group; now != nil && now != g {
		name := append([]byte(nil), f.name...)
		f.release()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			done.Fetched(d.exchange(ctx, table, name, now, query))
		}()
		return
	}
	f.release()
	done.Fetched(ans, err)
}

func (f *asyncForward) release() {
	name := f.name
	*f = asyncForward{name: name[:0]}
	asyncForwards.Put(f)
}
