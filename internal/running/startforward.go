package running

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// startAsync starts the forward of a miss to its block's group; the
// group's reader calls ExchangeDone.
func (d *State) startAsync(fw forwarder, b *blocks.Block, name, query []byte, asker netip.AddrPort, timeout time.Duration, done resolve.FetchDone) {
	f := asyncForwards.Get().(*asyncForward)
	f.d, f.fw, f.view, f.g, f.query, f.timeout, f.done = d, fw, fw.table(), b.Group, query, timeout, done
	f.name = append(f.name[:0], name...)
	if fo := b.Answer.Forwarders(); len(fo) > 0 {
		f.tap = forwardTap{obs: fo, client: asker}
	}
	b.Group.ExchangeAsync(query, timeout, f)
}

// asyncForward is one startAsync in flight.
type asyncForward struct {
	d       *State
	fw      forwarder
	view    *blocks.View // the table g was looked up in
	g       *forward.Group
	name    []byte // wire; the buffer is kept with the pooled value
	query   []byte
	timeout time.Duration
	done    resolve.FetchDone
	tap     forwardTap // the block's forward observers (none: not tapping)
}

// Tapping and Tried make the forward tell the block's forward observers
// of each try (forward.Tapper).
func (f *asyncForward) Tapping() bool { return len(f.tap.obs) > 0 }

func (f *asyncForward) Tried(upstream string, tcp bool, start time.Time, query, answer []byte) {
	f.tap.Tried(upstream, tcp, start, query, answer)
}

// forwardTap tells a block's forward observers (dnstap's FORWARDER_QUERY
// and FORWARDER_RESPONSE) of each try, as CoreDNS's forward does: client
// is the flight's first asker.
type forwardTap struct {
	obs    []answer.ForwardObserver
	client netip.AddrPort
}

func (t forwardTap) Tapping() bool { return len(t.obs) > 0 }

func (t forwardTap) Tried(upstream string, tcp bool, start time.Time, query, ans []byte) {
	for _, o := range t.obs {
		o.Forwarded(t.client, upstream, tcp, start, query, ans)
	}
}

var (
	_ forward.Tapper = (*asyncForward)(nil)
	_ forward.Tapper = forwardTap{}
)

var asyncForwards = sync.Pool{New: func() any { return new(asyncForward) }}

// ExchangeDone hands the group's result on. When a reload routed the zone
// elsewhere while the query was out, the answer (or the ErrClosed of a
// retired group) reflects the old configuration: the new group is asked,
// as exchange does, in a goroutine.
func (f *asyncForward) ExchangeDone(ans []byte, err error) {
	d, fw, view, g, query, timeout, done, tap := f.d, f.fw, f.view, f.g, f.query, f.timeout, f.done, f.tap
	if fw.table() == view {
		// No reload since: the common case, without a second lookup.
		f.release()
		done.Fetched(ans, err)
		return
	}
	if now := d.lookup(fw.vi, f.name).Group; now != nil && now != g {
		name := append([]byte(nil), f.name...)
		f.release()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if tap.Tapping() {
				ctx = forward.WithTapper(ctx, tap)
			}
			done.Fetched(d.exchange(ctx, fw, name, now, query))
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
