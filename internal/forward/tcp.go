package forward

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

const (
	// writeTimeout bounds a write when the caller's context has no deadline: a peer that stops
	// reading must not pin a writer (and every queued writer behind it) forever.
	writeTimeout = 2 * time.Second
	// dialBackoffMin is the wait after the first failed dial: short, because a restarted kube-dns
	// pod is usually reachable again within a second.
	dialBackoffMin = 100 * time.Millisecond
	// dialBackoffMax caps the doubling: queries meanwhile fail over at once instead of waiting on
	// SYNs, and health probes (which ignore the backoff) bring a recovered upstream back sooner.
	dialBackoffMax = 2 * time.Second
	// maxFrame is the largest DNS message over TCP plus its two-byte length (RFC 1035 §4.2.2).
	maxFrame = 2 + 65535
	// readBufStart is a connection's first read buffer: a few typical answers. It grows (up to
	// maxFrame) only as a frame's bytes arrive, never on the length the upstream announces.
	readBufStart = 4096
)

// errStalled is why a connection that delivered no frame for a whole try is closed: it may
// wait on a frame that never completes (a lying length prefix), so it must not take more
// queries. Its other queries are asked again on another connection.
var errStalled = errors.New("connection delivered no answer for a whole try")

// tcpPool is a small set of long-lived TCP connections to one upstream with many queries
// outstanding on each, answers matched by ID in any order (RFC 7766 §6.2.1.1).
type tcpPool struct {
	addr       netip.AddrPort
	group      string
	upstream   string
	size       int
	maxPerConn int
	maxQueries int
	idle       time.Duration
	try        time.Duration
	tls        *tls.Config // nil: plain TCP
	clk        clock.Clock
	obs        Observer
	log        *slog.Logger

	mu      sync.Mutex
	conns   []*tcpConn // open and not retired: usable or draining
	dialing int
	waiters int
	changed chan struct{} // closed and replaced when capacity may have freed up and waiters > 0
	closed  bool
	// retiring: the upstream is an endpoint no longer followed (retire): no new query, each
	// connection closes once its queries are answered or given up; gone runs once the last
	// one is closed.
	retiring  bool
	gone      func()
	open      int       // connections dialled and not yet shut (Observer.Conns' count)
	dialFails int       // consecutive failed dials
	nextDial  time.Time // no dial before this (on clk)
	dialErr   error
	heldErr   error          // what a query gets while dialling is held back (made once per failed dial)
	wg        sync.WaitGroup // reader goroutines

	// timers recycles the try timers (on clk) of exchange: a query's try is bounded by one
	// of them instead of a context and timer of its own (5 allocations per miss).
	timers timerPool
}

// tcpConn is one pipelined connection. It has one reader goroutine; writers take wmu.
type tcpConn struct {
	pool *tcpPool
	nc   net.Conn
	// Writes are combined: a query appends its frame to wbuf and wakes the
	// connection's writer goroutine, which first yields once, so the other
	// queries of a burst (a batch of misses from one recvmmsg) append
	// theirs, then writes everything with one write(2). An ExchangeAsync
	// try writes the queue itself instead, without blocking, when nobody
	// is writing (writeQuery). Frames never interleave: whoever sets
	// writing owns the socket's write side until it finds wbuf empty.
	wmu     sync.Mutex
	wbuf    []byte
	wspare  []byte
	writing bool
	rc      syscall.RawConn
	// writeNow's argument and results, and the function given to rc.Write (made once: a
	// closure per call would cost three allocations a query). Used by the owner of the
	// write side only (writing).
	wout    []byte
	wn      int
	werr    error
	writeFn func(fd uintptr) bool
	wake    chan struct{} // capacity 1
	wdone   chan struct{} // closed when the reader exits

	// Guarded by pool.mu.
	pending     map[uint16]*tcpWait // wire ID → waiter; nil value: cancelled, answer may still come
	outstanding int                 // non-nil entries of pending
	nextID      uint16
	sent        int
	frames      uint64 // complete frames read: a query that saw none for a whole try closes c
	draining    bool   // reached maxQueries: takes no new queries, closes when outstanding is 0
	dead        bool
	cause       error // why we closed it, if we did
	lastUsed    time.Time
}

type tcpResult struct {
	msg []byte
	err error
}

// tcpWait is a query waiting for its answer on a connection: Exchange's parks on ch; an
// ExchangeAsync try (a non-nil) gets its result in a.tcpAnswer, and timer (on clk, recycled
// with the wait) ends the try.
type tcpWait struct {
	ch     chan tcpResult // capacity 1: exactly one send
	a      *asyncExchange
	timer  clock.Timer
	clk    clock.Clock
	c      *tcpConn
	id     uint16
	q      question
	frames uint64 // c's frames read when the query was sent (see cancel)
	whole  bool   // the timer ends a whole try (not the caller's deadline before it)
}

// tcpWaits recycles waits: a Exchange's once its result is taken (a cancelled one may still
// get its late answer: it is not reused), an ExchangeAsync's once its result is handed over.
var tcpWaits = sync.Pool{New: func() any { return &tcpWait{ch: make(chan tcpResult, 1)} }}

func recycleTCPWait(w *tcpWait) {
	w.a, w.c, w.q = nil, nil, question{}
	tcpWaits.Put(w)
}

func newTCPPool(addr netip.AddrPort, cfg *GroupConfig, clk clock.Clock, obs Observer, log *slog.Logger) *tcpPool {
	return &tcpPool{
		addr:       addr,
		group:      cfg.Name,
		upstream:   addr.String(),
		size:       cfg.PoolSize,
		maxPerConn: cfg.MaxPerConn,
		maxQueries: cfg.MaxQueriesPerConn,
		idle:       cfg.IdleTimeout,
		try:        cfg.TryTimeout,
		tls:        cfg.TLS,
		clk:        clk,
		obs:        obs,
		log:        log,
		changed:    make(chan struct{}),
	}
}

// exchange sends query (whose parsed question is q) and returns the validated answer with the
// wire ID still in it. The try ends at ctx's end or after the pool's try timeout, whichever
// comes first. When the connection closed before answering (by the peer, or by us because it
// stalled), the query is sent once more on another connection, within the same try.
func (p *tcpPool) exchange(ctx context.Context, query []byte, q question) ([]byte, error) {
	t := p.timers.get(p.clk, p.try)
	defer p.timers.put(t)
	ans, err := p.exchangeOnce(ctx, t.C(), query, q)
	if err != nil && (errors.Is(err, errPeerClosed) || errors.Is(err, errStalled)) && ctx.Err() == nil {
		p.obs.Failure(p.group, p.upstream, KindClosed)
		ans, err = p.exchangeOnce(ctx, t.C(), query, q)
	}
	return ans, err
}

// exchangeWithin is one send of the query bounded by left on the pool's clock: the second
// send of an ExchangeAsync try whose connection closed before answering, within what is left
// of that try.
func (p *tcpPool) exchangeWithin(ctx context.Context, left time.Duration, query []byte, q question) ([]byte, error) {
	t := p.clk.NewTimer(max(left, 0))
	defer t.Stop()
	return p.exchangeOnce(ctx, t.C(), query, q)
}

// exchangeOnce is one send of the query; expired fires when the try's time is up.
func (p *tcpPool) exchangeOnce(ctx context.Context, expired <-chan time.Time, query []byte, q question) ([]byte, error) {
	c, id, w, frames, err := p.acquire(ctx, expired)
	if err != nil {
		return nil, err
	}
	sent := p.clk.Now()
	c.writeQuery(query, id, false)
	select {
	case r := <-w.ch:
		// Each wait gets exactly one send (dispatch or fail, after taking it out of
		// pending under the lock): once received, it is free. A cancelled one may still
		// get its late answer: it is not reused.
		recycleTCPWait(w)
		if r.err != nil {
			return nil, r.err
		}
		if err := checkAnswer(r.msg, id, q); err != nil {
			return nil, fmt.Errorf("answer from %s: %w", p.upstream, err)
		}
		return r.msg, nil
	case <-expired:
		p.cancel(c, id, true, frames)
		return nil, fmt.Errorf("wait for answer from %s: %w", p.upstream, errTryTimeout)
	case <-ctx.Done():
		wholeTry := errors.Is(context.Cause(ctx), errTryTimeout) || p.clk.Now().Sub(sent) >= p.try
		p.cancel(c, id, wholeTry, frames)
		return nil, fmt.Errorf("wait for answer from %s: %w", p.upstream, context.Cause(ctx))
	}
}

// acquire reserves a wire ID on a connection. It dials a new connection while the pool is not
// full and every open one already has queries outstanding, to spread queries: an upstream built
// on miekg/dns (CoreDNS) answers one connection's queries one at a time, in order.
// It also returns the connection's count of frames read so far.
func (p *tcpPool) acquire(ctx context.Context, expired <-chan time.Time) (*tcpConn, uint16, *tcpWait, uint64, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, 0, nil, 0, ErrClosed
		}
		if p.retiring {
			p.mu.Unlock()
			return nil, 0, nil, 0, fmt.Errorf("%s: %w", p.upstream, errRetired)
		}
		best := p.leastLoaded()
		open := len(p.conns) + p.dialing
		mayDial := open < p.size && !p.clk.Now().Before(p.nextDial)
		if mayDial && (best == nil || best.outstanding > 0) {
			c, err := p.dialLocked(ctx)
			if err != nil {
				p.mu.Unlock()
				return nil, 0, nil, 0, err
			}
			best = c
		}
		if best != nil {
			id, w := best.reserve()
			frames := best.frames
			p.mu.Unlock()
			return best, id, w, frames, nil
		}
		if open < p.size {
			// No connection, and dialling is held back after failures: fail now so the
			// group moves on to the next upstream.
			err := p.heldErr
			p.mu.Unlock()
			if err == nil {
				err = fmt.Errorf("reconnect held back after failures: dial %s: no connection", p.upstream)
			}
			return nil, 0, nil, 0, err
		}
		// Every connection is full or still being dialled: wait for a slot.
		wait := p.changed
		p.waiters++
		p.mu.Unlock()
		var cause error
		select {
		case <-wait:
		case <-expired:
			cause = errTryTimeout
		case <-ctx.Done():
			cause = context.Cause(ctx)
		}
		if cause != nil {
			p.mu.Lock()
			p.waiters--
			p.mu.Unlock()
			return nil, 0, nil, 0, fmt.Errorf("wait for a connection to %s: %w", p.upstream, cause)
		}
		p.mu.Lock()
		p.waiters--
	}
}

// leastLoaded returns the usable connection with the fewest outstanding queries, or nil.
func (p *tcpPool) leastLoaded() *tcpConn {
	var best *tcpConn
	for _, c := range p.conns {
		if c.draining || c.dead || c.outstanding >= p.maxPerConn {
			continue
		}
		if best == nil || c.outstanding < best.outstanding {
			best = c
		}
	}
	return best
}

// dialLocked dials a connection with p.mu held on entry and on return (it is released while
// dialling), adds it to the pool and starts its reader. The dial ends with ctx or after the
// try timeout (real time: the dial is the kernel's).
func (p *tcpPool) dialLocked(ctx context.Context) (*tcpConn, error) {
	p.dialing++
	p.mu.Unlock()
	d := net.Dialer{Timeout: p.try}
	var nc net.Conn
	var err error
	if p.tls != nil {
		// The handshake is part of the dial, within the same timeout.
		nc, err = (&tls.Dialer{NetDialer: &d, Config: p.tls}).DialContext(ctx, "tcp", p.upstream)
	} else {
		nc, err = d.DialContext(ctx, "tcp", p.upstream)
	}
	p.mu.Lock()
	p.dialing--
	p.wake()
	if err != nil {
		err = fmt.Errorf("dial %s: %w", p.upstream, err)
		if !errors.Is(err, context.Canceled) { // the caller gave up: not the upstream's fault
			p.dialFailedLocked(err)
		}
		return nil, err
	}
	if p.closed {
		nc.Close()
		return nil, ErrClosed
	}
	if p.dialFails > 0 {
		p.log.Info("reconnected to upstream", "upstream", p.upstream, "failed_dials", p.dialFails)
	}
	p.dialFails, p.dialErr, p.heldErr, p.nextDial = 0, nil, nil, time.Time{}
	raw := nc
	if tc, ok := nc.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	rc, err := raw.(syscall.Conn).SyscallConn()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("dial %s: %w", p.upstream, err)
	}
	c := &tcpConn{
		pool:     p,
		nc:       nc,
		rc:       rc,
		pending:  make(map[uint16]*tcpWait),
		nextID:   uint16(rand.Uint32()),
		lastUsed: time.Now(),
		wake:     make(chan struct{}, 1),
		wdone:    make(chan struct{}),
	}
	c.writeFn = c.writeSome
	c.draining = p.retiring // dialled for a query taken before the retirement: that one only
	p.conns = append(p.conns, c)
	p.open++
	p.obs.Conns(p.group, p.upstream, 1)
	p.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

func (p *tcpPool) dialFailedLocked(err error) {
	p.dialFails++
	if p.dialFails == 1 {
		p.log.Warn("cannot connect to upstream", "upstream", p.upstream, "err", err)
	}
	backoff := dialBackoffMax
	if p.dialFails < 8 {
		backoff = min(dialBackoffMin<<(p.dialFails-1), dialBackoffMax)
	}
	p.nextDial = p.clk.Now().Add(backoff)
	p.dialErr = err
	p.heldErr = fmt.Errorf("reconnect held back after failures: %w", err)
}

// heldBack returns the error a query gets at once when the pool has no connection and
// dialling is held back after failures, else nil: the group checks it before building a try
// for a down upstream, so an outage costs each query little more than the error.
func (p *tcpPool) heldBack() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.conns) == 0 && p.dialing == 0 && p.heldErr != nil && p.clk.Now().Before(p.nextDial) {
		return p.heldErr
	}
	return nil
}

// reserve takes a free wire ID on c. Called with pool.mu held on a live, non-draining conn.
func (c *tcpConn) reserve() (uint16, *tcpWait) {
	id := c.nextID
	for {
		if _, used := c.pending[id]; !used {
			break
		}
		id++
	}
	c.nextID = id + 1
	w := tcpWaits.Get().(*tcpWait)
	c.pending[id] = w
	c.outstanding++
	c.sent++
	if c.sent >= c.pool.maxQueries {
		c.draining = true
	}
	c.lastUsed = time.Now()
	return id, w
}

// start sends query as ExchangeAsync's try when a connection has a free slot now; it reports
// false (nothing sent) when the try would have to dial or wait for a slot, or the pool is
// closed: the caller then makes it with exchange. The answer, a failure or the end of the try
// (a.try: TryTimeout, or the caller's deadline before it) goes to a.tcpAnswer from the
// connection's reader or the try's timer.
func (p *tcpPool) start(query []byte, q question, a *asyncExchange) bool {
	p.mu.Lock()
	if p.closed || p.retiring {
		p.mu.Unlock()
		return false
	}
	best := p.leastLoaded()
	mayDial := len(p.conns)+p.dialing < p.size && !p.clk.Now().Before(p.nextDial)
	if best == nil || best.outstanding > 0 && mayDial {
		p.mu.Unlock()
		return false
	}
	id, w := best.reserve()
	w.a, w.c, w.id, w.q, w.frames = a, best, id, q, best.frames
	w.whole = a.try >= p.try
	if w.timer == nil || w.clk != p.clk {
		w.clk = p.clk
		w.timer = p.clk.AfterFunc(a.try, w.expire)
	} else {
		w.timer.Reset(a.try)
	}
	p.mu.Unlock()
	best.writeQuery(query, id, true)
	return true
}

// tcpClaim is what deliver needs of a wait, taken under pool.mu (claimLocked).
type tcpClaim struct {
	a   *asyncExchange // nil: an Exchange's wait, which gets its result on ch
	id  uint16
	q   question
	own bool // the ExchangeAsync try's timer was stopped: the deliverer recycles w
}

// claimLocked is called, with pool.mu held, by whoever took w out of pending (the reader's
// dispatch or fail). It stops an asynchronous try's timer there, under the lock: if the timer
// fired first, its function (expire) waits for pool.mu, finds w gone and recycles w, so w may
// be reused by another query as soon as pool.mu is released, and nothing of it may be read
// after that but what the claim holds.
func (w *tcpWait) claimLocked() tcpClaim {
	if w.a == nil {
		return tcpClaim{}
	}
	return tcpClaim{a: w.a, id: w.id, q: w.q, own: w.timer.Stop()}
}

// deliver hands r to the query waiting on w, which the caller took out of pending and claimed.
func (c *tcpConn) deliver(w *tcpWait, cl tcpClaim, r tcpResult) {
	if cl.a == nil {
		w.ch <- r
		return
	}
	if cl.own {
		recycleTCPWait(w)
	} // else the timer's function recycles it
	if r.err == nil {
		if err := checkAnswer(r.msg, cl.id, cl.q); err != nil {
			r.msg, r.err = nil, fmt.Errorf("answer from %s: %w", c.pool.upstream, err)
		}
	}
	cl.a.tcpAnswer(r.msg, r.err)
}

// expire ends an asynchronous try at its timeout, unless its result was handed over first:
// as exchangeOnce's wait for a whole try, it may close a stalled connection.
func (w *tcpWait) expire() {
	c := w.c
	p := c.pool
	if !p.cancelWait(c, w.id, w, w.whole, w.frames) {
		recycleTCPWait(w) // taken out and claimed while this ran: left to us
		return
	}
	a := w.a
	recycleTCPWait(w)
	a.tcpAnswer(nil, fmt.Errorf("wait for answer from %s: %w", p.upstream, errTryTimeout))
}

// cancel gives up on a query whose caller stopped waiting. Its ID stays reserved (a tombstone)
// until the late answer arrives or the connection closes, so a late answer is told apart from
// an unsolicited one. When the query waited a whole try and c read no frame since it was sent
// (frames), c is closed: it may be stuck in a frame that never completes, and an idle
// connection would otherwise be preferred over dialling a new one.
func (p *tcpPool) cancel(c *tcpConn, id uint16, wholeTry bool, frames uint64) {
	p.cancelWait(c, id, nil, wholeTry, frames)
}

// cancelWait is cancel for the query waiting on want (nil: whichever waits under id). It reports
// whether the query still waited (it did not when its result was handed over first).
func (p *tcpPool) cancelWait(c *tcpConn, id uint16, want *tcpWait, wholeTry bool, frames uint64) bool {
	p.mu.Lock()
	retired, waited := false, false
	if w, ok := c.pending[id]; ok && w != nil && (want == nil || w == want) {
		c.pending[id] = nil
		c.outstanding--
		retired = p.settleLocked(c)
		waited = true
	}
	if want != nil && !waited {
		p.mu.Unlock()
		return false
	}
	stalled := wholeTry && c.frames == frames && !c.dead
	p.mu.Unlock()
	if retired {
		c.shut()
	}
	if stalled {
		p.log.Warn("closing upstream connection that delivered no answer for a whole try", "upstream", p.upstream, "try", p.try)
		c.closeWith(fmt.Errorf("%w (%s, %v)", errStalled, p.upstream, p.try))
	}
	return waited
}

// settleLocked runs after a query left c: it wakes waiters for the freed slot and retires c if
// it is draining and has nothing outstanding. If it reports true the caller must call c.shut.
func (p *tcpPool) settleLocked(c *tcpConn) bool {
	p.wake()
	return c.draining && c.outstanding == 0 && p.retireLocked(c)
}

// retireLocked takes c out of the pool. It reports true only the first time: the caller then
// owns the close (c.shut), so the socket is closed and counted exactly once.
func (p *tcpPool) retireLocked(c *tcpConn) bool {
	if c.dead {
		return false
	}
	c.dead = true
	for i, x := range p.conns {
		if x == c {
			p.conns = append(p.conns[:i], p.conns[i+1:]...)
			break
		}
	}
	p.wake()
	return true
}

// shut closes the socket of a retired connection and reports it. The reader then ends.
func (c *tcpConn) shut() {
	c.nc.Close()
	c.pool.obs.Conns(c.pool.group, c.pool.upstream, -1)
	c.pool.mu.Lock()
	c.pool.open--
	c.pool.mu.Unlock()
	c.pool.goneIfEmpty()
}

// errRetired: the upstream is an endpoint that is no longer followed; the walk moves on to the
// next server without counting it against the upstream's health.
var errRetired = errors.New("endpoint no longer followed")

// retire takes the pool out of use: no new query (acquire fails with errRetired, start
// declines), idle connections close now, busy ones as soon as their last query is answered or
// given up (at the latest after a try). gone runs once, when no connection is left.
func (p *tcpPool) retire(gone func()) {
	p.mu.Lock()
	if p.retiring || p.closed {
		p.mu.Unlock()
		return
	}
	p.retiring, p.gone = true, gone
	var idle []*tcpConn
	for _, c := range slices.Clone(p.conns) {
		c.draining = true
		if c.outstanding == 0 && p.retireLocked(c) {
			idle = append(idle, c)
		}
	}
	p.wake()
	p.mu.Unlock()
	for _, c := range idle {
		c.shut()
	}
	p.goneIfEmpty()
}

// goneIfEmpty runs a retiring pool's gone once no connection is left or being dialled.
func (p *tcpPool) goneIfEmpty() {
	p.mu.Lock()
	var gone func()
	if p.retiring && p.open == 0 && p.dialing == 0 {
		gone, p.gone = p.gone, nil
	}
	p.mu.Unlock()
	if gone != nil {
		gone()
	}
}

func (p *tcpPool) wake() {
	if p.waiters > 0 {
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// writeQuery queues query's frame (length prefix, the query with wire ID id), built in place
// in the connection's buffer. The writer goroutine writes it, or, inline, the caller itself
// when nobody is writing: as many bytes as the socket takes without blocking, the rest (a full
// send buffer: an upstream that stopped reading) handed to the writer goroutine, which waits
// with a deadline. An inline write costs no goroutine hand-off; the writer goroutine combines
// the frames of concurrent callers. A write error closes the connection, which fails every
// query pending on it, this one included.
func (c *tcpConn) writeQuery(query []byte, id uint16, inline bool) {
	if c.pool.tls != nil {
		inline = false // TLS records are written by the writer goroutine (nc.Write), never raw
	}
	c.wmu.Lock()
	start := len(c.wbuf)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, uint16(len(query)))
	c.wbuf = append(c.wbuf, query...)
	wire.SetID(c.wbuf[start+2:], id)
	if !inline || c.writing {
		// The owner of the write side takes it (it looks at wbuf before it lets go).
		c.wmu.Unlock()
		if !inline {
			c.wakeWriter()
		}
		return
	}
	c.writing = true
	for {
		out := c.wbuf
		c.wbuf = c.wspare[:0]
		c.wmu.Unlock()
		n, err := c.writeNow(out)
		c.wmu.Lock()
		if err != nil || n < len(out) {
			// Give the rest back, ahead of what others queued meanwhile, to the
			// writer goroutine: it waits for the socket, or fails the connection.
			rest := append(out[n:len(out):len(out)], c.wbuf...)
			c.wbuf, c.writing = rest, false
			c.wmu.Unlock()
			if err != nil {
				c.closeWith(fmt.Errorf("write to %s: %w", c.pool.upstream, err))
				return
			}
			c.wakeWriter()
			return
		}
		c.wspare = out[:0]
		if len(c.wbuf) == 0 {
			c.writing = false
			c.wmu.Unlock()
			return
		}
	}
}

// writeNow writes out without waiting: it returns how much the socket took.
func (c *tcpConn) writeNow(out []byte) (int, error) {
	c.wout, c.wn, c.werr = out, 0, nil
	err := c.rc.Write(c.writeFn)
	n, werr := c.wn, c.werr
	c.wout = nil
	if err == nil {
		err = werr
	}
	return n, err
}

// writeSome is writeNow's function for rc.Write: it writes c.wout from c.wn on until the
// socket takes no more.
func (c *tcpConn) writeSome(fd uintptr) bool {
	for c.wn < len(c.wout) {
		m, e := unix.Write(int(fd), c.wout[c.wn:])
		if e == unix.EINTR {
			continue
		}
		if e == unix.EAGAIN {
			break
		}
		if e != nil {
			c.werr = e
			break
		}
		c.wn += m
	}
	return true
}

func (c *tcpConn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default: // already woken; it will take this frame too
	}
}

// writeLoop writes what queries queued, one write(2) per wake-up.
func (c *tcpConn) writeLoop() {
	p := c.pool
	defer p.wg.Done()
	for {
		select {
		case <-c.wake:
		case <-c.wdone:
			return
		}
		// Let the queries that are runnable now queue their frames first.
		runtime.Gosched()
		c.wmu.Lock()
		if c.writing || len(c.wbuf) == 0 {
			c.wmu.Unlock() // an inline writer owns the write side: it takes them
			continue
		}
		c.writing = true
		for len(c.wbuf) > 0 {
			out := c.wbuf
			c.wbuf = c.wspare[:0]
			c.wmu.Unlock()
			err := c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err == nil {
				_, err = c.nc.Write(out)
			}
			if err == nil {
				// Cleared: an inline write (writeNow, through the raw conn) fails at
				// once on a deadline that has passed, and closed the connection 2 s
				// after any write of this goroutine.
				err = c.nc.SetWriteDeadline(time.Time{})
			}
			if err != nil {
				// The stream may hold half a frame: close it.
				c.closeWith(fmt.Errorf("write to %s: %w", p.upstream, err))
				return
			}
			c.wmu.Lock()
			c.wspare = out[:0]
		}
		c.writing = false
		c.wmu.Unlock()
	}
}

// closeWith closes c; cause, if not nil, is what its pending queries fail with (the reader
// delivers it when its read fails on the closed socket).
func (c *tcpConn) closeWith(cause error) {
	p := c.pool
	p.mu.Lock()
	if c.cause == nil {
		c.cause = cause
	}
	retired := p.retireLocked(c)
	p.mu.Unlock()
	if retired {
		c.shut()
	}
}

// readLoop reads length-prefixed answers and hands each to the query with its wire ID. It also
// closes the connection once it has been idle for the pool's idle timeout, before the upstream
// would (CoreDNS closes idle connections after 10 s).
func (c *tcpConn) readLoop() {
	p := c.pool
	defer p.wg.Done()
	defer close(c.wdone)
	defer recoverReader(c.fail)
	buf := make([]byte, readBufStart)
	n := 0
	for {
		deadline, ok := c.idleCheck()
		if !ok {
			c.fail(nil)
			return
		}
		if err := c.nc.SetReadDeadline(deadline); err != nil {
			c.fail(err)
			return
		}
		m, err := c.nc.Read(buf[n:])
		n += m
		for n >= 2 {
			size := 2 + int(binary.BigEndian.Uint16(buf))
			if n < size {
				break
			}
			c.dispatch(buf[2:size])
			n = copy(buf, buf[size:n])
		}
		if n == len(buf) && len(buf) < maxFrame {
			// Full with a frame still incomplete: grow with the data received.
			buf = append(buf, make([]byte, min(len(buf), maxFrame-len(buf)))...)
		}
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue // idleCheck decides; a partial frame stays in buf
			}
			c.fail(err)
			return
		}
	}
}

// idleCheck returns the next read deadline, or false when c is retired, retiring it if it has
// been idle for the pool's idle timeout.
func (c *tcpConn) idleCheck() (deadline time.Time, ok bool) {
	p := c.pool
	now := time.Now()
	p.mu.Lock()
	switch {
	case c.dead:
		p.mu.Unlock()
		return now, false
	case c.outstanding > 0:
		p.mu.Unlock()
		return now.Add(p.idle), true
	case now.Sub(c.lastUsed) >= p.idle:
		retired := p.retireLocked(c)
		p.mu.Unlock()
		if retired {
			c.shut()
		}
		return now, false
	}
	deadline = c.lastUsed.Add(p.idle)
	p.mu.Unlock()
	return deadline, true
}

// dispatch delivers one answer frame to its waiter.
func (c *tcpConn) dispatch(frame []byte) {
	p := c.pool
	if len(frame) < 2 {
		p.obs.Failure(p.group, p.upstream, KindMalformed)
		return
	}
	id := binary.BigEndian.Uint16(frame)
	p.mu.Lock()
	w, ok := c.pending[id]
	c.frames++
	retired := false
	var cl tcpClaim
	if ok {
		delete(c.pending, id)
		if w != nil {
			c.outstanding--
			c.lastUsed = time.Now()
			retired = p.settleLocked(c)
			cl = w.claimLocked()
		}
	}
	p.mu.Unlock()
	if retired {
		c.shut() // before the answer is delivered: the caller may dial the replacement at once
	}
	switch {
	case !ok:
		// Neither pending nor cancelled: an answer to a query never sent on this connection.
		p.obs.Failure(p.group, p.upstream, KindMismatch)
	case w != nil && cl.a != nil:
		c.deliver(w, cl, tcpResult{msg: frame}) // borrowed: the receiver runs before the next read
	case w != nil:
		c.deliver(w, cl, tcpResult{msg: append([]byte(nil), frame...)})
	}
}

// fail ends c after a read error (nil: retired by us) and fails its pending queries.
func (c *tcpConn) fail(readErr error) {
	p := c.pool
	p.mu.Lock()
	retired := p.retireLocked(c)
	pending := c.pending
	c.pending, c.outstanding = nil, 0
	claims := make(map[*tcpWait]tcpClaim, len(pending))
	for _, w := range pending {
		if w != nil {
			claims[w] = w.claimLocked()
		}
	}
	cause, closed := c.cause, p.closed
	p.mu.Unlock()
	if retired {
		c.shut()
	}

	var err error
	switch {
	case closed:
		err = ErrClosed
	case cause != nil && peerClosed(cause):
		err = fmt.Errorf("%w: %w", errPeerClosed, cause)
	case cause != nil:
		err = cause
	case readErr != nil && peerClosed(readErr):
		err = fmt.Errorf("%w: read from %s: %w", errPeerClosed, p.upstream, readErr)
	case readErr != nil:
		err = fmt.Errorf("read from %s: %w", p.upstream, readErr)
	default:
		err = fmt.Errorf("connection to %s retired", p.upstream)
	}
	for w, cl := range claims {
		c.deliver(w, cl, tcpResult{err: err})
	}
	if len(pending) > 0 && readErr != nil && !closed {
		p.log.Debug("upstream connection failed with queries pending", "upstream", p.upstream, "pending", len(pending), "err", err)
	}
}

// close closes every connection and waits for their readers.
func (p *tcpPool) close() {
	p.mu.Lock()
	p.closed = true
	conns := append([]*tcpConn(nil), p.conns...)
	p.wake()
	p.mu.Unlock()
	for _, c := range conns {
		c.closeWith(ErrClosed)
	}
	p.wg.Wait()
}
