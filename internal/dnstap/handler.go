package dnstap

import (
	"io"
	"net/netip"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
)

// The dnstap directive's handler: CLIENT_QUERY when a query of the block
// arrives (a miss: before it goes upstream), CLIENT_RESPONSE once it is
// answered, hits included (dnstap runs before cache in CoreDNS's
// plugin.cfg), and FORWARDER_QUERY and FORWARDER_RESPONSE of every try of
// the block's fetches (answer.ForwardObserver).

// setup opens (or finds) one Tap per distinct configuration of the
// block's dnstap lines ([]Config): a tap is shared by every block and
// view that has it and kept across the reloads that keep it
// (answer.Env.Shared).
func setup(env answer.Env, cfg any) (answer.Handler, error) {
	cfgs, _ := cfg.([]Config)
	if len(cfgs) == 0 {
		return nil, nil
	}
	h := &Handler{}
	totals := env.Stats("dnstap", func() any { return &Totals{} }).(*Totals)
	for _, c := range cfgs {
		t, err := env.Shared("dnstap|"+c.Key(), func() (io.Closer, error) { return closer{New(c, env.Log, totals)}, nil })
		if err != nil {
			return nil, err
		}
		h.Taps = append(h.Taps, t.(closer).Tap)
	}
	return h, nil
}

// closer makes a Tap an io.Closer.
type closer struct{ *Tap }

func (c closer) Close() error {
	c.Tap.Close()
	return nil
}

// Handler sends a block's messages to each of its Taps.
type Handler struct {
	Taps []*Tap
}

// Query sends CLIENT_QUERY of the query as received.
func (h *Handler) Query(r *answer.Request, out []byte) ([]byte, answer.Verdict) {
	m := Message{Type: ClientQuery, TCP: r.TCP, Query: r.Client, QueryTime: r.Start, QueryMessage: r.Raw}
	for _, t := range h.Taps {
		t.Send(&m)
	}
	return out, answer.Pass
}

// Answer sends CLIENT_RESPONSE of the answer, once written (CoreDNS's
// dnstap ResponseWriter).
func (h *Handler) Answer(r *answer.Request, out []byte, start int) []byte {
	m := Message{Type: ClientResponse, TCP: r.TCP, Query: r.Client, QueryTime: r.Start, ResponseTime: r.Clock.Now(), ResponseMessage: out[start:]}
	for _, t := range h.Taps {
		t.Send(&m)
	}
	return out
}

// Forwarded sends FORWARDER_QUERY and, when an answer came,
// FORWARDER_RESPONSE of one try upstream, as CoreDNS's forward does: the
// client (the flight's first asker) is the query address, the upstream
// the response address.
func (h *Handler) Forwarded(client netip.AddrPort, upstream string, tcp bool, start time.Time, query, ans []byte) {
	up, _ := netip.ParseAddrPort(upstream)
	m := Message{Type: ForwarderQuery, TCP: tcp, Query: client, Response: up, QueryTime: start, QueryMessage: query}
	for _, t := range h.Taps {
		t.Send(&m)
	}
	if ans == nil {
		return
	}
	m = Message{Type: ForwarderResponse, TCP: tcp, Query: client, Response: up, QueryTime: start, ResponseTime: time.Now(), ResponseMessage: ans}
	for _, t := range h.Taps {
		t.Send(&m)
	}
}
