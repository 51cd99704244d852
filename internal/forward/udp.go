package forward

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// udpBufSize is the receive buffer of one datagram for a query advertising 1232 bytes (what the
// server advertises upstream by default, -max-udp-size), plus one: an answer that fills the
// buffer is larger than we asked for, so it is treated as truncated and asked over TCP. A
// socket opened for a query advertising more (a larger -max-udp-size or bufsize) gets buffers
// of that size + 1. The buffers belong to a socket's reader (udpRecvBatch of them), not to the
// queries waiting: 1000 misses in flight hold no receive buffer at all.
const udpBufSize = 1232 + 1

// errOversized: a UDP answer with our ID filled the receive buffer, so it is larger than the
// size the query advertised. It is asked again over TCP, as a truncated one.
var errOversized = errors.New("UDP answer larger than the advertised size")

// The UDP transport of one upstream: a few connected sockets shared by every query, one reader
// goroutine each that takes the datagrams in batches (recvmmsg through the netpoller) and hands
// each answer to the query waiting for its ID and question; queries leave in bursts (sendmmsg of
// whatever queued while a send was in progress), and a waiting query parks on a recycled
// channel with a timer, not on a socket of its own.
//
// The spoofing defence of RFC 5452 stays: every query has a random ID, unique among the IDs in
// use on its socket (the ones in flight and the ones given up on, until the socket closes), so
// two queries in flight on one socket never share an ID; an answer must match the ID and the
// question; source ports are kernel-chosen random ephemeral ports, and a socket is replaced
// after udpSocketQueries queries or udpSocketLife. Against an off-path attacker the odds of
// one forged packet are what they were with a socket per query: it must hit one of the ports
// in use and one of the IDs in flight on it, so (queries in flight) / (ports × 65536) either
// way.
const (
	// udpActiveSockets: sockets taking new queries per upstream. More than one, so a
	// resolver that spreads its work by 4-tuple (SO_REUSEPORT in Unbound, CoreDNS, dnsmasq
	// alike) spreads ours over its threads, and so two readers can run on two cores; few,
	// because every socket has its own reader, and the fewer there are, the more answers
	// each wake-up of a reader takes. A new one opens only when every open one has
	// queries waiting, so one-at-a-time misses use one socket.
	udpActiveSockets = 4
	// udpSocketQueries: queries one socket carries before it is replaced (it takes no more,
	// and closes once its last query is answered or given up on). It also bounds the IDs a
	// socket uses (in flight or given up on) far below 65536, so a free random ID is found
	// at once. Opening a socket (socket, connect, getsockname, epoll registration, a reader;
	// closing it: about ten syscalls) costs 0.04 syscalls a query at 256.
	udpSocketQueries = 256
	// udpSocketLife: how long a socket takes new queries, however few it carried: a source
	// port known to an attacker (an ICMP rate-limit scan like SAD DNS takes tens of seconds
	// per port range) is stale within seconds, as CoreDNS's forward expires its sockets
	// after 10 s.
	udpSocketLife = 5 * time.Second
	// udpRecvBatch: datagrams one recvmmsg takes. Answers to a burst of misses arrive
	// together; 32 of them is one wake-up of the reader instead of 32, with 39 KB of buffers
	// per socket.
	udpRecvBatch = 32
	// udpSendBatch: datagrams one sendmmsg sends (a longer queue takes several).
	udpSendBatch = 64
)

// udpMux is one upstream's UDP sockets.
type udpMux struct {
	group    string
	upstream string
	try      time.Duration
	life     time.Duration // udpSocketLife (tests shorten it)
	clk      clock.Clock
	obs      Observer
	log      *slog.Logger

	mu      sync.Mutex
	bufSize int        // a new socket's datagram buffer: the largest size advertised + 1
	socks   []*udpSock // open: active ones take queries, draining ones wait for theirs
	active  int        // open and not draining
	closed  bool
	wg      sync.WaitGroup // readers

	// timers recycles the try timers (on clk): a waiting query is bounded by one of them.
	timers timerPool
}

// udpSock is one connected socket and its reader.
type udpSock struct {
	mux     *udpMux
	nc      *net.UDPConn
	rc      syscall.RawConn
	bufSize int // each datagram's receive buffer; an answer that fills it is oversized

	// Guarded by mux.mu.
	pending     map[uint16]*udpWait // wire ID → waiter; nil: given up on, a late answer may come
	outstanding int                 // non-nil entries of pending
	sent        int
	draining    bool // takes no new queries; closes when outstanding is 0
	dead        bool

	// The send queue: queries append their datagram to sbuf; the first one to find no send
	// in progress sends the queue until it is empty (flat combining), so queries that leave
	// together leave in one sendmmsg. smu never covers a syscall.
	smu     sync.Mutex
	sbuf    []byte
	sq      []udpOut
	sending bool
	spare   []byte
	spareQ  []udpOut
	// The sender's, outside smu (one sender at a time): the datagrams and the sendmmsg
	// call given to RawConn.Write (made once: a closure per call would cost two allocations
	// a miss), its arguments and results.
	shdr   [udpSendBatch]unix.Mmsghdr
	siov   [udpSendBatch]unix.Iovec
	sendFn func(fd uintptr) bool
	sn     int
	sdone  int
	serr   syscall.Errno
}

// sendmmsg sends s.shdr[:s.sn] once (never waiting: a full send buffer fails the first
// datagram with EAGAIN) and leaves the count sent and the error in s.sdone and s.serr.
func (s *udpSock) sendmmsg(fd uintptr) bool {
	for {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.shdr[0])), uintptr(s.sn), unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		s.sdone, s.serr = int(r), e
		return true
	}
}

// udpOut is one queued datagram: its wire ID and where it is in sbuf.
type udpOut struct {
	id       uint16
	off, end int
}

// udpWait is a query waiting for its answer; recycled once its result is taken.
type udpWait struct {
	q  question
	ch chan udpResult // capacity 1: exactly one send (an answer or a failure)
	// An ExchangeAsync try (a non-nil): the result goes to a.udpAnswer instead of ch, and
	// timer (on clk, recycled with the wait) ends the try. s and id locate it for the timer.
	a     *asyncExchange
	timer clock.Timer
	clk   clock.Clock
	s     *udpSock
	id    uint16
}

type udpResult struct {
	msg []byte
	err error
}

var udpWaits = sync.Pool{New: func() any { return &udpWait{ch: make(chan udpResult, 1)} }}

func newUDPMux(cfg *GroupConfig, upstream string, clk clock.Clock, obs Observer, log *slog.Logger) *udpMux {
	return &udpMux{group: cfg.Name, upstream: upstream, try: cfg.TryTimeout, life: udpSocketLife, clk: clk, obs: obs, log: log, bufSize: udpBufSize}
}

// timerPool recycles the try timers of a transport's exchanges.
type timerPool struct{ sync.Pool }

// get is a timer of d on clk, started.
func (p *timerPool) get(clk clock.Clock, d time.Duration) clock.Timer {
	t, _ := p.Get().(clock.Timer)
	if t == nil {
		return clk.NewTimer(d)
	}
	t.Reset(d) // no stale value after Reset (Go 1.23 timers; clock.Fake alike)
	return t
}

// put stops t and keeps it for the next exchange.
func (p *timerPool) put(t clock.Timer) {
	t.Stop()
	p.Put(t)
}

// exchange sends query (whose parsed question is q) and returns its answer with the wire ID
// still in it, matched (ID and question) but not yet checked inside. The try ends at ctx's end
// or after the try timeout, whichever comes first.
func (m *udpMux) exchange(ctx context.Context, query []byte, q question) ([]byte, error) {
	t := m.timers.get(m.clk, m.try)
	defer m.timers.put(t)
	s, id, w, err := m.acquire(ctx, q, nil)
	if err != nil {
		return nil, err
	}
	s.send(query, id)
	var cause error
	select {
	case r := <-w.ch:
		return m.done(w, r)
	case <-t.C():
		cause = errTryTimeout // the try's own bound
	case <-ctx.Done():
		cause = context.Cause(ctx)
	}
	if !m.giveUp(s, id, w) {
		// The answer (or a failure) was handed over as the wait ended: take it.
		return m.done(w, <-w.ch)
	}
	return nil, fmt.Errorf("read from %s: %w", m.upstream, cause)
}

// start sends query as ExchangeAsync's try: the answer, a failure or the end of the try goes
// to a.udpAnswer from the socket's reader or the try's timer. An error (the mux closed, a socket
// that cannot be opened) is returned instead, and a.udpAnswer is not called.
func (m *udpMux) start(query []byte, q question, a *asyncExchange) error {
	s, id, _, err := m.acquire(context.Background(), q, a)
	if err != nil {
		return err
	}
	s.send(query, id)
	return nil
}

// udpClaim is what deliver needs of a wait, taken under m.mu (claimLocked).
type udpClaim struct {
	a   *asyncExchange // nil: an Exchange's wait, which gets its result on ch
	own bool           // the ExchangeAsync try's timer was stopped: the deliverer recycles w
}

// claimLocked is called, with m.mu held, by whoever took w out of pending (its reader, a
// failed send, the socket's end). It stops an asynchronous try's timer there, under the lock:
// if the timer fired first, its function (expire) waits for m.mu, finds w gone and recycles
// w, so w may be reused by another query as soon as m.mu is released, and nothing of it may
// be read after that but what the claim holds.
func (w *udpWait) claimLocked() udpClaim {
	if w.a == nil {
		return udpClaim{}
	}
	return udpClaim{a: w.a, own: w.timer.Stop()}
}

// deliver hands r to the query waiting on w, which the caller took out of pending and claimed.
func (m *udpMux) deliver(w *udpWait, c udpClaim, r udpResult) {
	if c.a == nil {
		w.ch <- r
		return
	}
	if c.own {
		recycleWait(w)
	} // else the timer's function recycles it
	c.a.udpAnswer(r.msg, r.err)
}

// expire ends an asynchronous try at its timeout, unless its result was handed over first.
func (w *udpWait) expire() {
	s := w.s
	m := s.mux
	m.mu.Lock()
	if s.pending[w.id] != w {
		m.mu.Unlock()
		recycleWait(w) // taken out and claimed while this ran: left to us
		return
	}
	s.pending[w.id] = nil // a tombstone, as giveUp
	s.outstanding--
	retire := s.settleLocked()
	m.mu.Unlock()
	if retire {
		s.nc.Close()
	}
	a := w.a
	recycleWait(w)
	a.udpAnswer(nil, fmt.Errorf("read from %s: %w", m.upstream, errTryTimeout))
}

func recycleWait(w *udpWait) {
	w.q, w.a, w.s = question{}, nil, nil
	udpWaits.Put(w)
}

// done recycles w, whose result r was taken.
func (m *udpMux) done(w *udpWait, r udpResult) ([]byte, error) {
	recycleWait(w)
	return r.msg, r.err
}

// acquire reserves a random free wire ID for a query on an active socket, opening one when
// fewer than udpActiveSockets are active and each has queries waiting (or none is open).
// Opening a UDP socket sends nothing and never blocks, so it is done under the lock: a burst
// of queries finding no socket opens one, not one each.
// With a (ExchangeAsync) the wait's timer is armed before the query can be answered.
func (m *udpMux) acquire(ctx context.Context, q question, a *asyncExchange) (*udpSock, uint16, *udpWait, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, 0, nil, ErrClosed
	}
	var best *udpSock
	for _, s := range m.socks {
		if !s.draining && (best == nil || s.outstanding < best.outstanding) {
			best = s
		}
	}
	if q.size+1 > m.bufSize {
		// Sockets opened from now on take the larger answers over UDP; the open ones send
		// them to TCP as oversized until they are replaced.
		m.bufSize = q.size + 1
	}
	reused := true
	if best == nil || best.outstanding > 0 && m.active < udpActiveSockets {
		reused = false
		s, err := m.openLocked(ctx)
		if err != nil {
			m.mu.Unlock()
			m.obs.SocketUse(m.group, m.upstream, "udp", false)
			return nil, 0, nil, err
		}
		best = s
	}
	id := best.reserveLocked()
	w := udpWaits.Get().(*udpWait)
	w.q = q
	if a != nil {
		w.a, w.s, w.id = a, best, id
		if w.timer == nil || w.clk != m.clk {
			w.clk = m.clk
			w.timer = m.clk.AfterFunc(a.try, w.expire)
		} else {
			w.timer.Reset(a.try)
		}
	}
	best.pending[id] = w
	m.mu.Unlock()
	m.obs.SocketUse(m.group, m.upstream, "udp", reused)
	return best, id, w, nil
}

// openLocked opens a socket (a connected one: the kernel picks a random source port) and
// starts its reader. m.mu is held.
func (m *udpMux) openLocked(ctx context.Context) (*udpSock, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "udp", m.upstream)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", m.upstream, err)
	}
	uc := nc.(*net.UDPConn)
	rc, err := uc.SyscallConn()
	if err == nil {
		err = uc.SetReadDeadline(time.Now().Add(m.life))
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("dial %s: %w", m.upstream, err)
	}
	s := &udpSock{mux: m, nc: uc, rc: rc, bufSize: m.bufSize, pending: make(map[uint16]*udpWait)}
	s.sendFn = s.sendmmsg
	m.socks = append(m.socks, s)
	m.active++
	m.wg.Add(1)
	go s.readLoop()
	return s, nil
}

// reserveLocked picks a random ID not in use on s (in flight or given up on) and counts the
// query. With at most udpSocketQueries IDs ever used on a socket, the first pick is free with
// probability ≥ 99.6%.
func (s *udpSock) reserveLocked() uint16 {
	id := uint16(rand.Uint32())
	for {
		if _, used := s.pending[id]; !used {
			break
		}
		id = uint16(rand.Uint32())
	}
	s.outstanding++
	s.sent++
	if s.sent >= udpSocketQueries {
		s.drainLocked()
	}
	return id
}

// drainLocked stops s from taking new queries.
func (s *udpSock) drainLocked() {
	if !s.draining && !s.dead {
		s.draining = true
		s.mux.active--
	}
}

// giveUp withdraws a query that stopped waiting. Its ID stays taken on the socket (a
// tombstone), so its late answer is told apart from a forged one and the ID is not given to
// another query. It reports false when the query's result was already handed over.
func (m *udpMux) giveUp(s *udpSock, id uint16, w *udpWait) bool {
	m.mu.Lock()
	if s.pending[id] != w {
		m.mu.Unlock()
		return false
	}
	s.pending[id] = nil
	s.outstanding--
	retire := s.settleLocked()
	m.mu.Unlock()
	if retire {
		s.nc.Close()
	}
	// Nothing sends on w's channel any more: every sender takes w out of pending first.
	recycleWait(w)
	return true
}

// settleLocked runs after a query left s: a draining socket with nothing outstanding is
// retired, and the caller must then close it (reported true).
func (s *udpSock) settleLocked() bool {
	return s.draining && s.outstanding == 0 && s.retireLocked()
}

// retireLocked takes s out of the mux; true the first time only (the caller closes it).
func (s *udpSock) retireLocked() bool {
	if s.dead {
		return false
	}
	if !s.draining {
		s.mux.active--
	}
	s.dead, s.draining = true, true
	m := s.mux
	for i, x := range m.socks {
		if x == s {
			m.socks = append(m.socks[:i], m.socks[i+1:]...)
			break
		}
	}
	return true
}

// send queues the query's datagram with wire ID id and sends the queue unless a send is in
// progress, in which case that sender takes it.
func (s *udpSock) send(query []byte, id uint16) {
	s.smu.Lock()
	off := len(s.sbuf)
	s.sbuf = append(s.sbuf, query...)
	wire.SetID(s.sbuf[off:], id)
	s.sq = append(s.sq, udpOut{id: id, off: off, end: len(s.sbuf)})
	if s.sending {
		s.smu.Unlock()
		return
	}
	s.sending = true
	for len(s.sq) > 0 {
		buf, q := s.sbuf, s.sq
		s.sbuf, s.sq = s.spare[:0], s.spareQ[:0]
		s.smu.Unlock()
		s.sendQueue(buf, q)
		s.smu.Lock()
		s.spare, s.spareQ = buf[:0], q[:0]
	}
	s.sending = false
	s.smu.Unlock()
}

// sendQueue sends the queued datagrams, udpSendBatch per sendmmsg. A datagram the kernel
// refuses fails its query at once (a pending ICMP error: ECONNREFUSED; a full send buffer:
// EAGAIN, as a lost packet would, without waiting for the try to end).
func (s *udpSock) sendQueue(buf []byte, q []udpOut) {
	for len(q) > 0 {
		n := min(len(q), udpSendBatch)
		for i := range n {
			s.siov[i].Base = &buf[q[i].off]
			s.siov[i].SetLen(q[i].end - q[i].off)
			s.shdr[i] = unix.Mmsghdr{}
			s.shdr[i].Hdr.Iov = &s.siov[i]
			s.shdr[i].Hdr.SetIovlen(1)
		}
		s.sn = n
		err := s.rc.Write(s.sendFn)
		sent, errno := s.sdone, s.serr
		if err == nil && errno != 0 {
			err = errno
		}
		if err != nil {
			// The first datagram was not sent: it fails; the next call goes on after it.
			s.fail(q[0].id, fmt.Errorf("send to %s: %w", s.mux.upstream, err))
			sent = 1
		}
		q = q[sent:]
	}
}

// fail ends the query with wire ID id, if it still waits, with err.
func (s *udpSock) fail(id uint16, err error) {
	m := s.mux
	m.mu.Lock()
	w := s.pending[id]
	if w == nil {
		m.mu.Unlock()
		return
	}
	delete(s.pending, id)
	s.outstanding--
	retire := s.settleLocked()
	c := w.claimLocked()
	m.mu.Unlock()
	if retire {
		s.nc.Close()
	}
	m.deliver(w, c, udpResult{err: err})
}

// readLoop reads datagrams in batches and hands each answer to its query, until the socket
// closes. Its read deadline is the end of the socket's life: the socket then drains.
//
// The whole loop runs inside one RawConn.Read while it can: after a recvmmsg that took fewer
// datagrams than it could (the socket was empty at that moment) it waits for the netpoller
// instead of asking the kernel for an EAGAIN. The poller is edge-triggered, and a datagram
// queued since that empty moment has marked the poll descriptor ready, which only a new Read
// call would clear. That saves a recvmmsg per wake-up, most of them at moderate rates.
func (s *udpSock) readLoop() {
	m := s.mux
	defer m.wg.Done()
	defer recoverReader(s.end)
	size := s.bufSize
	buf := getRecvBuf(udpRecvBatch * size)
	defer putRecvBuf(buf)
	var (
		iov [udpRecvBatch]unix.Iovec
		hdr [udpRecvBatch]unix.Mmsghdr
	)
	for i := range hdr {
		iov[i].Base = &buf[i*size]
		iov[i].SetLen(size)
		hdr[i].Hdr.Iov = &iov[i]
		hdr[i].Hdr.SetIovlen(1)
	}
	// One closure for every Read: a new one per call would be an allocation per wake-up.
	var errno syscall.Errno
	retire := false
	recv := func(fd uintptr) bool {
		for {
			for i := range hdr {
				hdr[i].Hdr.Flags, hdr[i].Len = 0, 0
			}
			r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&hdr[0])), udpRecvBatch, unix.MSG_DONTWAIT, 0, 0)
			switch e {
			case 0:
			case unix.EAGAIN:
				return false // wait in the netpoller
			case unix.EINTR:
				continue
			default:
				errno = e
				return true
			}
			n := int(r)
			for i := range n {
				n, full := int(hdr[i].Len), hdr[i].Hdr.Flags&unix.MSG_TRUNC != 0 || int(hdr[i].Len) >= size
				retire = s.dispatch(buf[i*size:i*size+n], full) || retire
			}
			if retire {
				return true // closed outside Read: Close waits for the Read to end
			}
			if n < udpRecvBatch {
				return false // empty a moment ago: wait for the poller
			}
		}
	}
	for {
		errno, retire = 0, false
		err := s.rc.Read(recv)
		if retire {
			s.nc.Close() // the next read fails and the loop ends
			continue
		}
		if err == nil && errno != 0 {
			err = errno
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && s.expire() {
				continue
			}
			s.end(err)
			return
		}
	}
}

// recvBufs recycles the readers' datagram buffers: a socket lives for 256 queries, and a new
// 39 KB buffer per socket would be 150 bytes of garbage per query.
var recvBufs sync.Pool

func getRecvBuf(n int) []byte {
	if b, ok := recvBufs.Get().(*[]byte); ok && len(*b) == n {
		return *b
	}
	return make([]byte, n)
}

func putRecvBuf(b []byte) { recvBufs.Put(&b) }

// expire ends the socket's life: it drains (closing now if nothing is outstanding). It reports
// whether the reader goes on reading for the queries still waiting.
func (s *udpSock) expire() bool {
	m := s.mux
	m.mu.Lock()
	s.drainLocked()
	retire := s.settleLocked()
	dead := s.dead
	m.mu.Unlock()
	if retire {
		s.nc.Close()
	}
	if dead {
		return true // the next read fails on the closed socket, and end sees a retired socket
	}
	return s.nc.SetReadDeadline(time.Time{}) == nil
}

// dispatch hands a datagram to the query waiting for it, or counts it and drops it. full: it
// filled the buffer or the kernel cut it. It reports true when the socket was retired (its
// last query done while draining): the caller closes it.
func (s *udpSock) dispatch(msg []byte, full bool) bool {
	m := s.mux
	if len(msg) < wire.HeaderLen {
		m.obs.Failure(m.group, m.upstream, KindMalformed)
		return false
	}
	id := wire.ID(msg)
	m.mu.Lock()
	w, ok := s.pending[id]
	if !ok || w == nil {
		m.mu.Unlock()
		if !ok {
			// Neither waiting nor given up on: not an answer to anything we sent on it.
			m.obs.Failure(m.group, m.upstream, KindMismatch)
		}
		return false // a late answer to a query given up on
	}
	var r udpResult
	switch {
	case full && wire.Flags(msg)&wire.FlagQR != 0:
		r.err = fmt.Errorf("answer from %s: %w (%d)", m.upstream, errOversized, w.q.size)
	default:
		if err := matchAnswer(msg, id, w.q); err != nil && !truncatedWithoutQuestion(msg, id) {
			m.mu.Unlock()
			// Not the answer to this query (forged, stray or garbage): count it; the
			// query keeps waiting for the real one.
			m.obs.Failure(m.group, m.upstream, failureKind(err))
			return false
		}
		r.msg = msg
		if w.a == nil {
			r.msg = append([]byte(nil), msg...) // the buffer is the reader's
		} // an asynchronous try borrows it: its receiver runs before the next recvmmsg
	}
	delete(s.pending, id)
	s.outstanding--
	retire := s.settleLocked()
	c := w.claimLocked()
	m.mu.Unlock()
	m.deliver(w, c, r)
	return retire
}

// end fails the queries waiting on s after its read failed (a pending ICMP error such as
// ECONNREFUSED, or the socket closed) and retires s.
func (s *udpSock) end(readErr error) {
	m := s.mux
	m.mu.Lock()
	retire := s.retireLocked()
	pending := s.pending
	s.pending, s.outstanding = nil, 0
	claims := make(map[*udpWait]udpClaim, len(pending))
	for _, w := range pending {
		if w != nil {
			claims[w] = w.claimLocked()
		}
	}
	closed := m.closed
	m.mu.Unlock()
	if retire {
		s.nc.Close()
	}
	err := fmt.Errorf("read from %s: %w", m.upstream, readErr)
	if closed {
		err = ErrClosed
	}
	for w, c := range claims {
		m.deliver(w, c, udpResult{err: err})
	}
}

// close closes every socket and waits for the readers; queries waiting fail with ErrClosed.
func (m *udpMux) close() {
	m.mu.Lock()
	m.closed = true
	socks := append([]*udpSock(nil), m.socks...)
	for _, s := range socks {
		s.retireLocked()
	}
	m.mu.Unlock()
	for _, s := range socks {
		s.nc.Close()
	}
	m.wg.Wait()
}

// exchangeUDP is one UDP try on u: the answer, matched to the query and checked inside (a
// malformed one fails the try and the next server is asked), or truncated as it came.
func (g *Group) exchangeUDP(ctx context.Context, u *upstream, query []byte, q question) ([]byte, error) {
	ans, err := u.udp.exchange(ctx, query, q)
	return checkedUDP(u, ans, err)
}

// checkedUDP checks a UDP try's answer inside (CheckMessage), unless it is truncated (asked
// again over TCP; it may omit the question).
func checkedUDP(u *upstream, ans []byte, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	if truncated(ans) {
		return ans, nil
	}
	if err := wire.CheckMessage(ans); err != nil {
		return nil, fmt.Errorf("answer from %s: %w: %w", u.name, errMalformed, err)
	}
	return ans, nil
}

// reaskOverTCP reports whether a UDP try's result (checkedUDP's) is asked again over TCP: a
// truncated answer, or one larger than the size the query advertised.
func reaskOverTCP(ans []byte, err error) bool {
	return err == nil && truncated(ans) || errors.Is(err, errOversized)
}

// exchangeTCPOnce sends one query over a fresh TCP connection and reads its answer: the re-ask
// after a truncated UDP answer, rare enough not to need a pool.
func exchangeTCPOnce(ctx context.Context, addr string, tc *tls.Config, query []byte, q question) ([]byte, error) {
	var d net.Dialer
	var nc net.Conn
	var err error
	if tc != nil { // a DNS-over-TLS server: the handshake within ctx
		nc, err = (&tls.Dialer{NetDialer: &d, Config: tc}).DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := nc.SetDeadline(dl); err != nil {
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()

	id := uint16(rand.Uint32())
	frame := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(frame, uint16(len(query)))
	copy(frame[2:], query)
	wire.SetID(frame[2:], id)
	if _, err := nc.Write(frame); err != nil {
		return nil, tcpOnceErr(ctx, "send to", addr, err)
	}
	var size [2]byte
	if _, err := io.ReadFull(nc, size[:]); err != nil {
		return nil, tcpOnceErr(ctx, "read from", addr, err)
	}
	ans, err := readGrowing(nc, int(binary.BigEndian.Uint16(size[:])))
	if err != nil {
		return nil, tcpOnceErr(ctx, "read from", addr, err)
	}
	if err := checkAnswer(ans, id, q); err != nil {
		return nil, fmt.Errorf("answer from %s over TCP: %w", addr, err)
	}
	return ans, nil
}

// readGrowing reads exactly size bytes from r into a buffer that grows with the bytes received,
// not with the length the peer announced: a lying length prefix costs nothing until the data
// arrives.
func readGrowing(r io.Reader, size int) ([]byte, error) {
	buf := make([]byte, min(size, readBufStart))
	n := 0
	for n < size {
		if n == len(buf) {
			buf = append(buf, make([]byte, min(len(buf), size-len(buf)))...)
		}
		m, err := r.Read(buf[n:])
		n += m
		if err != nil && n < size {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return buf, nil
}

func tcpOnceErr(ctx context.Context, op, addr string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s %s over TCP: %w", op, addr, context.Cause(ctx))
	case peerClosed(err):
		return fmt.Errorf("%w: %s %s over TCP: %w", errPeerClosed, op, addr, err)
	}
	return fmt.Errorf("%s %s over TCP: %w", op, addr, err)
}
