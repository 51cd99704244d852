package running

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// startAsync starts the forward of a miss to its block's group; the
// group's reader calls ExchangeDone.
func (d *State) startAsync(table func() *blocks.View, b *blocks.Block, name []byte, query []byte, timeout time.Duration, done resolve.FetchDone) {
	f := asyncForwards.Get().(*asyncForward)
	f.d, f.table, f.view, f.g, f.query, f.timeout, f.done = d, table, table(), b.Group, query, timeout, done
	f.name = append(f.name[:0], name...)
	if len(b.Taps) > 0 {
		f.tap = forwardTap{taps: b.Taps, client: resolve.AskerOf(done)}
	}
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
	tap     forwardTap // the block's dnstap (none: not tapping)
}

// Tapping and Tried make the forward tell the block's dnstap of each try
// (forward.Tapper).
func (f *asyncForward) Tapping() bool { return len(f.tap.taps) > 0 }

func (f *asyncForward) Tried(upstream string, tcp bool, start time.Time, query, answer []byte) {
	f.tap.Tried(upstream, tcp, start, query, answer)
}

// forwardTap sends a block's FORWARDER_QUERY and FORWARDER_RESPONSE, as
// CoreDNS's forward does for each try: the client (the flight's first
// asker) is the query address, the upstream the response address.
type forwardTap struct {
	taps   []*dnstap.Tap
	client netip.AddrPort
}

func (t forwardTap) Tapping() bool { return len(t.taps) > 0 }

func (t forwardTap) Tried(upstream string, tcp bool, start time.Time, query, answer []byte) {
	up, _ := netip.ParseAddrPort(upstream)
	m := dnstap.Message{Type: dnstap.ForwarderQuery, TCP: tcp, Query: t.client, Response: up, QueryTime: start, QueryMessage: query}
	for _, tp := range t.taps {
		tp.Send(&m)
	}
	if answer == nil {
		return
	}
	m = dnstap.Message{Type: dnstap.ForwarderResponse, TCP: tcp, Query: t.client, Response: up, QueryTime: start, ResponseTime: time.Now(), ResponseMessage: answer}
	for _, tp := range t.taps {
		tp.Send(&m)
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
	d, table, view, g, query, timeout, done, tap := f.d, f.table, f.view, f.g, f.query, f.timeout, f.done, f.tap
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
			if tap.Tapping() {
				ctx = forward.WithTapper(ctx, tap)
			}
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
