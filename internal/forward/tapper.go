package forward

import (
	"context"
	"time"
)

// Tapper hears of every try of an exchange (the Corefile's dnstap: CoreDNS's
// forward sends FORWARDER_QUERY and FORWARDER_RESPONSE for each): the
// server's "ip:port", whether the try was over TCP, when it began, the
// query sent and the answer (nil: none). It is called on the goroutine
// that learnt the result and must not block; the buffers are valid only
// during the call. An exchange has one when its Done (ExchangeAsync)
// implements it and Tapping reports true, or when its ctx (Exchange) was
// made by WithTapper.
type Tapper interface {
	Tapping() bool
	Tried(upstream string, tcp bool, start time.Time, query, answer []byte)
}

type tapperKey struct{}

// WithTapper returns ctx carrying t for Exchange.
func WithTapper(ctx context.Context, t Tapper) context.Context {
	return context.WithValue(ctx, tapperKey{}, t)
}

// tapperOf is ctx's Tapper; nil: none.
func tapperOf(ctx context.Context) Tapper {
	t, _ := ctx.Value(tapperKey{}).(Tapper)
	return t
}
