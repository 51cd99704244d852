package forward

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Done receives the result of ExchangeAsync.
type Done interface {
	// ExchangeDone gets the answer (the caller's ID set) or the error, exactly once. The
	// answer may be the upstream reader's buffer: it is valid only until ExchangeDone
	// returns (copy what is kept). It runs on the goroutine that learnt the result (an
	// upstream's reader, a try's timer, or the goroutine that went on with the failover),
	// possibly before ExchangeAsync returns: it must not block for long, and the next
	// answers of that reader wait for it.
	ExchangeDone(ans []byte, err error)
}

// ExchangeAsync is Exchange without a goroutine waiting for the answer: the first try is sent
// from the caller's goroutine and its answer handed to done by the upstream's reader, so a
// miss that the first server answers costs no goroutine and no hand-off between goroutines.
// When that try fails, times out, is truncated, or its answer is one Exchange would not keep
// (SERVFAIL or REFUSED while another server is healthy), the rest of the walk runs as
// Exchange's does, in a goroutine of its own. The whole exchange, first try included, is
// bounded by timeout from now (Exchange's ctx deadline).
// A TCP try that would have to dial or wait for a free slot is made that way too.
//
// query must not change until done is called and ExchangeAsync has returned: done may run
// (on another goroutine: a try's timer, a connection's failure) before the first try's query
// is copied out. The result is the one Exchange would give.
func (g *Group) ExchangeAsync(query []byte, timeout time.Duration, done Done) {
	q, err := g.enter(query)
	if err != nil {
		done.ExchangeDone(nil, err)
		return
	}
	a := asyncPool.Get().(*asyncExchange)
	a.g, a.query, a.q, a.done = g, query, q, done
	a.deadline = time.Now().Add(timeout) // real time, as a context deadline
	// The first try ends at TryTimeout or at the caller's deadline, whichever comes first, as
	// Exchange's try does within its ctx.
	a.try = min(g.cfg.TryTimeout, timeout)
	g.begin(&a.w)
	if a.try <= 0 {
		// Past the deadline already: Exchange tries nothing, neither does this.
		a.resume(false)
		return
	}
	u := g.nextServer(&a.w)
	a.u = u
	if u == nil || u.down.Load() {
		// Only the try when every server is down gets here: rare, and held back
		// (heldBack) on TCP; the blocking path has it all.
		go a.resume(true)
		return
	}
	a.seen = u.answers.Load()
	a.start = g.clk.Now()
	if u.udp != nil {
		if err := u.udp.start(query, q, a); err != nil {
			a.tried(nil, err)
		}
		return
	}
	if !u.tcp.start(query, q, a) {
		go a.resume(true) // needs a dial or a free slot: wait for it in a goroutine
	}
}

// asyncExchange is one ExchangeAsync: the walk and what its first try needs.
type asyncExchange struct {
	g        *Group
	query    []byte
	q        question
	done     Done
	deadline time.Time
	try      time.Duration // the first try's bound: TryTimeout, or less before the deadline
	w        walk
	u        *upstream // the first try's server
	seen     uint64    // u's answers when the try began
	start    time.Time // on the group's clock
	reasked  bool      // the first try's server asked again over TCP (resumeTCP)
}

var asyncPool = sync.Pool{New: func() any { return new(asyncExchange) }}

// udpAnswer is the first try's result over UDP, as exchangeUDP returns it.
func (a *asyncExchange) udpAnswer(ans []byte, err error) {
	defer a.recoverTry()
	ans, err = checkedUDP(a.u, ans, err)
	if reaskOverTCP(ans, err) {
		// The full answer over TCP from the same server (Group.try), then on.
		go a.resumeTCP()
		return
	}
	a.tried(ans, err)
}

// tcpAnswer is the first try's result over a pooled TCP connection. A connection closed
// before it answered is not the server's fault: the query is sent once more, on another
// connection, within what is left of the try, as tcpPool.exchange does (resumeClosed).
func (a *asyncExchange) tcpAnswer(ans []byte, err error) {
	defer a.recoverTry()
	if err != nil && (errors.Is(err, errPeerClosed) || errors.Is(err, errStalled)) {
		a.g.obs.Failure(a.g.name, a.u.name, KindClosed)
		go a.resumeClosed(err)
		return
	}
	a.tried(ans, err)
}

// resumeClosed is tcpPool.exchange's second send after the first try's connection closed
// before answering (with err), bounded by the rest of the try; then the walk goes on.
func (a *asyncExchange) resumeClosed(err error) {
	defer a.recoverTry()
	ctx, cancel := a.context()
	defer cancel()
	var ans []byte
	if ctx.Err() == nil {
		ans, err = a.u.tcp.exchangeWithin(ctx, a.try-a.g.clk.Now().Sub(a.start), a.query, a.q)
	}
	err = a.accounted(ans, err, errors.Is(ctx.Err(), context.Canceled))
	a.goOn(ctx, ans, err)
}

// accounted does Group.attempt's accounting of the first try's server: the Observer hears of
// the answer or the failure, and the server's health follows. A try abandoned (the group
// closed, or canceled: the caller gave up) is not the server's fault: its error is marked so.
func (a *asyncExchange) accounted(ans []byte, err error, canceled bool) error {
	g, u := a.g, a.u
	if t, ok := a.done.(Tapper); ok && t.Tapping() {
		t.Tried(u.name, g.cfg.Proto == TCP || a.reasked, a.start, a.query, ans)
	}
	switch {
	case err != nil && (canceled || errors.Is(err, ErrClosed)):
		return fmt.Errorf("%w: %w", errAbandoned, err)
	case err != nil:
		kind := failureKind(err)
		if !u.gone.Load() { // a removed endpoint's series are gone (Remover)
			g.obs.Failure(g.name, u.name, kind)
		}
		g.failed(u, kind, a.seen)
	default:
		if !u.gone.Load() {
			g.obs.Exchange(g.name, u.name, wire.Rcode(ans), g.clk.Now().Sub(a.start))
		}
		g.answered(u)
	}
	return err
}

// goOn ends the walk after the first try's result: with it, or with the rest of the walk
// within ctx.
func (a *asyncExchange) goOn(ctx context.Context, ans []byte, err error) {
	if final, ans, err := a.g.take(&a.w, a.q, ans, err); final {
		a.finish(ans, err)
		return
	}
	ans, err = a.g.walk(ctx, a.query, a.q, &a.w)
	a.finish(ans, err)
}

// tried accounts for the first try as Group.attempt does and finishes, or goes on with the
// walk in a goroutine. ans may be borrowed (the reader's buffer): what outlives the call (a
// fallback kept for the rest of the walk) is copied.
func (a *asyncExchange) tried(ans []byte, err error) {
	defer a.recoverTry()
	err = a.accounted(ans, err, false)
	final, ans, err := a.g.take(&a.w, a.q, ans, err)
	if !final {
		if a.w.fallback != nil {
			a.w.fallback = append([]byte(nil), a.w.fallback...)
		}
		go a.resume(false)
		return
	}
	a.finish(ans, err)
}

// resume goes on with the walk, blocking; redo: the server nextServer chose last was not tried
// yet (or its try is to be made again whole).
func (a *asyncExchange) resume(redo bool) {
	defer a.recoverTry()
	ctx, cancel := a.context()
	defer cancel()
	g := a.g
	if redo && a.u != nil {
		ans, err := g.attempt(ctx, a.u, a.query, a.q)
		a.goOn(ctx, ans, err)
		return
	}
	ans, err := g.walk(ctx, a.query, a.q, &a.w)
	a.finish(ans, err)
}

// resumeTCP asks the first try's server again over TCP after a truncated or oversized UDP
// answer, with a try of its own (Group.try), and goes on.
func (a *asyncExchange) resumeTCP() {
	defer a.recoverTry()
	ctx, cancel := a.context()
	defer cancel()
	tctx, tcancel, timer := a.g.tryContext(ctx)
	ans, err := exchangeTCPOnce(tctx, a.u.name, nil, a.query, a.q)
	release(tcancel, timer)
	a.reasked = true
	err = a.accounted(ans, err, errors.Is(ctx.Err(), context.Canceled))
	a.goOn(ctx, ans, err)
}

// context is the rest of the exchange's time, carrying its Tapper (the
// walk's tries are tapped as the first was).
func (a *asyncExchange) context() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(context.Background(), a.deadline)
	if t, ok := a.done.(Tapper); ok && t.Tapping() {
		ctx = WithTapper(ctx, t)
	}
	return ctx, cancel
}

// finish hands the result to the caller and recycles a.
func (a *asyncExchange) finish(ans []byte, err error) {
	g, done := a.g, a.done
	*a = asyncExchange{}
	asyncPool.Put(a)
	g.leave()
	exchangeDone(done, ans, err)
}
