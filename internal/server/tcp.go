package server

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
)

// serveTCP accepts connections until Shutdown (which wakes Accept with a
// past deadline and leaves the listener, and its accept queue, to a twin
// holding the same socket). Connections over MaxTCPConns, or over their
// client's share of it, are closed at once
// unless an idle one makes room (addConn).
func (s *Server) serveTCP(l *tcpListener) {
	var backoff time.Duration
	// The listener's index in Config.Addrs (its view, its metrics label):
	// a connection to the wildcard listener has the address the client
	// asked as its local address, which is no listen address.
	addrIdx := s.cdServerIndex(l.ln.Addr().(*net.TCPAddr).AddrPort())
	wild := l.ln.Addr().(*net.TCPAddr).IP.IsUnspecified()
	for {
		l.beat.Add(1) // odd: waiting
		c, err := l.ln.Accept()
		l.beat.Add(1) // even: busy
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: slow down, keep going.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.cfg.Logger.Warn("tcp accept failed", "err", err, "retry_in", backoff)
			t := s.cfg.Clock.NewTimer(backoff)
			<-t.C()
			continue
		}
		backoff = 0
		if tcp, ok := c.(*net.TCPConn); ok {
			// The kernel's buffers of a client connection are the pod's
			// memory too (cgroup v2 charges them); autotuned, a client
			// that neither reads its answers nor stops sending could make
			// each hold megabytes (tcpSndBuf).
			_ = tcp.SetWriteBuffer(tcpSndBuf)
			_ = tcp.SetReadBuffer(tcpRcvBuf)
		}
		// Accepted during Shutdown: the client has sent, or is sending, its
		// query; it is answered (the connection drains like the others).
		client := remoteAddrPort(c).Addr()
		tc := &tcpConn{c: c, client: client, key: s.cfg.Clients.Key(client, 0), addrIdx: addrIdx, wild: wild, slots: make(chan struct{}, s.cfg.MaxTCPPipeline), timeout: s.cfg.TCPReadTimeout, wtimeout: s.cfg.TCPWriteTimeout}
		tc.idleSince.Store(time.Now().UnixNano())
		if !s.addConn(tc) {
			_ = c.Close()
			continue
		}
		go func() {
			defer s.wg.Done()
			s.serveConn(tc)
			s.removeConn(tc)
		}()
	}
}

// addConn admits a new connection: within its client's share of
// MaxTCPConns (package fair) it is taken. Otherwise a connection that is
// idle, or has sat on a partial query for tcpStuckAfter, makes room
// (closed, counted in TCPEvicted): the client's own longest-waiting one
// when the client holds its share, else the longest-waiting one of the
// heaviest client, else the longest-waiting one of all in its pool. With
// none it is refused (TCPShareRejects when it was its client's share,
// TCPRefused when the table was full): a client then retries or uses UDP,
// and the server keeps its memory.
func (s *Server) addConn(tc *tcpConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.tcpShares.Take(tc.key); v != fair.Taken {
		prefer, anyone := s.tcpShares.MakeRoom(tc.key, v)
		now := time.Now().UnixNano()
		victim := s.longestIdle(now, func(o *tcpConn) bool { return o.key == prefer })
		if victim == nil && anyone {
			victim = s.longestIdle(now, func(o *tcpConn) bool { return s.tcpShares.SamePool(o.key, tc.key) })
		}
		if victim == nil {
			if v == fair.OverShare {
				s.stats.TCPShareRejects.Add(1)
			} else {
				s.stats.TCPRefused.Add(1)
			}
			return false
		}
		s.evict(victim)
		s.tcpShares.Replace(victim.key, tc.key)
	}
	s.stats.TCPConns.Add(1)
	s.conns[tc.c] = tc
	s.wg.Add(1)
	return true
}

// longestIdle is the connection, among those ok accepts and none of whose
// misses are outstanding, that has waited the longest: for a query
// (idle), or on the rest of one that began tcpStuckAfter ago or more
// (stuck: a client that sends a byte of a query and no more holds its
// place only that long when others need it). nil when there is none. s.mu
// is held; a walk over the connections, for a full table.
func (s *Server) longestIdle(now int64, ok func(*tcpConn) bool) *tcpConn {
	var best *tcpConn
	var since int64
	for _, o := range s.conns {
		if o.evicted || len(o.slots) > 0 || !ok(o) {
			continue
		}
		t := o.idleSince.Load()
		if o.state.Load() == connBusy {
			if t = o.busySince.Load(); now-t < int64(tcpStuckAfter) {
				continue
			}
		}
		if best == nil || t < since {
			best, since = o, t
		}
	}
	return best
}

// tcpStuckAfter is how long a connection may sit on a partial query before
// it may be closed to make room for another client's: a query is one
// segment, or a few sent at once; a client whose query has not all
// arrived within half a second is not sending it.
const tcpStuckAfter = 500 * time.Millisecond

// evict closes an idle connection to make room; its place is given up at
// once (s.mu is held; its unit goes to the new connection: Replace), its
// goroutine ends on the closed socket.
func (s *Server) evict(tc *tcpConn) {
	tc.evicted = true
	delete(s.conns, tc.c)
	s.stats.TCPConns.Add(-1)
	s.stats.TCPEvicted.Add(1)
	_ = tc.c.Close()
}

// removeConn gives up a connection's place when its goroutine ends.
func (s *Server) removeConn(tc *tcpConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tc.evicted {
		return
	}
	delete(s.conns, tc.c)
	s.tcpShares.Put(tc.key)
	s.stats.TCPConns.Add(-1)
}

// tcpConn is one client connection: queries are read in order and
// answered as they complete (RFC 7766 §6.2.1.1), hits at once, misses when
// their upstream answers.
type tcpConn struct {
	c      net.Conn
	client netip.Addr // the remote address
	// key is the client's key (package fair): the remote address, or the
	// node's for loopback and the node's addresses; its share is taken.
	key netip.Addr
	// addrIdx: its listener's index in Config.Addrs; wild: the listener
	// is the wildcard one.
	addrIdx int
	wild    bool
	// idleSince: when it last began waiting for a query, busySince: when
	// the query it is reading began (unix ns), for choosing the
	// connection to close (longestIdle); evicted (under Server.mu):
	// closed to make room, its place already given up.
	idleSince atomic.Int64
	busySince atomic.Int64
	evicted   bool
	wmu       sync.Mutex
	// The answers to misses waiting to be written, in order, and whether
	// a writer drains them (under qmu; tcpanswers.go).
	qmu      sync.Mutex
	queue    []*missReq
	writing  bool
	broken   bool // a write failed: the rest are dropped
	pending  sync.WaitGroup
	slots    chan struct{}
	timeout  time.Duration // reading a query
	wtimeout time.Duration // writing answers
	state    atomic.Int32  // connFirst, connIdle or connBusy
}

// States of a TCP connection, for draining.
const (
	connFirst int32 = iota // waiting for the first query
	connIdle               // answered, waiting for the next query
	connBusy               // reading a query
)

// drain makes an idle connection close within tcpDrainIdle (Shutdown).
// Connections that are reading a query or waiting for their first one
// finish that first; serveConn checks for draining on every wait.
func (tc *tcpConn) drain() {
	if tc.state.Load() == connIdle {
		_ = tc.c.SetReadDeadline(time.Now().Add(tcpDrainIdle))
	}
}

// waitTimeout is how long a connection in the given state waits for the
// first byte of a query: the idle timeout, or while the server drains,
// tcpDrainIdle once it has been answered and the read timeout for its first
// query (a client that connected has a query on the way).
func (s *Server) waitTimeout(state int32) time.Duration {
	switch {
	case !s.closing.Load():
		return s.cfg.TCPIdleTimeout
	case state == connFirst:
		return s.cfg.TCPReadTimeout
	default:
		return tcpDrainIdle
	}
}

func (s *Server) serveConn(tc *tcpConn) {
	c := tc.c
	defer func() {
		// Let outstanding misses write their answers, then close.
		tc.pending.Wait()
		_ = c.Close()
	}()
	r := bufio.NewReaderSize(c, 4096)
	req := &request{tcp: true, st: &s.stats}
	defer func() {
		// What escapes the per-query guard (guard.go) closes the
		// connection: its client asks again.
		if p := recover(); p != nil {
			panics.Recovered(panics.TCP, p, req.raw)
		}
	}()
	// pend collects the answers given without an upstream (hits, errors)
	// while more queries are already buffered: a client that pipelines
	// gets them in one write(2) instead of one per query.
	pend := make([]byte, 0, 4096)
	var buf []byte
	state := connFirst
	addrIdx := tc.addrIdx
	req.wild, req.v6 = tc.wild, tc.client.Is6()
	req.client, req.local, req.owner = remoteAddrPort(c), localAddr(c), fair.Owner(tc.key)
	if s.cd != nil {
		req.cd = cdObserver{c: s.cd, srv: addrIdx}
	}
	maxQueries, queries := s.cfg.TCPMaxQueries, 0
	for {
		if maxQueries > 0 && queries >= maxQueries {
			tc.flush(&pend) // the deferred close waits for the misses' answers
			return
		}
		if !buffered(r) {
			if !tc.flush(&pend) || !s.waitQuery(tc, r, state) {
				return
			}
			state = connIdle
		}
		var err error
		if buf, err = readMsg(r, buf); err != nil {
			if errors.Is(err, errOversized) {
				s.stats.TCPOversized.Add(1)
			}
			return
		}
		queries++
		t := s.cfg.Clock.Now()
		start := len(pend)
		req.q.View = s.viewFor(addrIdx) // kept by ParseQuery
		req.raw, req.t, req.now, req.from = buf, t, t.UnixNano(), netip.Addr{}
		if s.askers.Load() {
			req.from = tc.client
		}
		resp, v := s.answerGuarded(req, append(pend, 0, 0))
		switch v {
		case dropped:
			continue
		case answered:
			if len(resp)-start-2 > 0xFFFF {
				return
			}
			binary.BigEndian.PutUint16(resp[start:], uint16(len(resp)-start-2))
			pend = resp
			if len(pend) >= 16<<10 && !tc.flush(&pend) {
				return
			}
			continue
		}
		// A miss: resolve it concurrently, bounded per connection.
		if !s.takeSlot(tc, &pend) {
			return
		}
		m := newMiss(req)
		m.q.From, m.q.Client = tc.client, tc.key
		m.tc = tc
		tc.pending.Add(1)
		s.startMiss(m)
	}
}

// waitQuery waits for the first byte of the next query no longer than the
// idle timeout (less while draining); once it is there, the rest must
// follow within the read timeout (a slow-loris client cannot hold a
// connection for long). Socket deadlines are the kernel's: real time.
func (s *Server) waitQuery(tc *tcpConn, r *bufio.Reader, state int32) bool {
	c := tc.c
	if state == connIdle { // a new connection is idle since it was accepted
		tc.idleSince.Store(time.Now().UnixNano())
	}
	tc.state.Store(state)
	wait := s.waitTimeout(state)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	if w := s.waitTimeout(state); w != wait {
		// Shutdown began between the two looks: its drain() may have
		// come before our deadline and been overwritten.
		_ = c.SetReadDeadline(time.Now().Add(w))
	}
	if _, err := r.Peek(1); err != nil {
		return false
	}
	tc.busySince.Store(time.Now().UnixNano())
	tc.state.Store(connBusy)
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.TCPReadTimeout))
	return true
}

// takeSlot takes one of the connection's pipeline slots. When none is free
// it sends the pending answers and waits at most the read timeout for one
// (false: the client does not read its answers).
func (s *Server) takeSlot(tc *tcpConn, pend *[]byte) bool {
	select {
	case tc.slots <- struct{}{}:
		return true
	default:
	}
	if !tc.flush(pend) {
		return false
	}
	t := s.cfg.Clock.NewTimer(s.cfg.TCPReadTimeout)
	defer t.Stop()
	select {
	case tc.slots <- struct{}{}:
		return true
	case <-t.C():
		return false
	}
}

// The kernel buffers of a client TCP connection (the kernel doubles what is
// set: 16 KiB to send, 8 KiB to receive, 24 KiB in all, 23 MiB for 1,000
// connections). A larger answer is written as the client reads it (on a
// pod's veth, microseconds per 16 KiB); a pipeline of queries waits in the
// client's socket. Autotuning would let each grow to tcp_wmem's and
// tcp_rmem's maxima (4 and 6 MiB), which 1,000 connections make gigabytes
// of the pod's memory (cgroup v2 charges socket buffers to it).
const (
	tcpSndBuf = 8 << 10
	tcpRcvBuf = 4 << 10
)

// tcpMsgChunk is how much a message buffer grows by at first: the buffer
// follows the data that has arrived, not the length the client announced,
// so a client announcing 65,535 bytes and sending none costs nothing.
const tcpMsgChunk = 512

// MaxTCPQuery is the longest query a client may send over TCP; a longer
// announced length closes the connection before any of its bytes are
// buffered (counted). A query is a header (12 bytes), one question (a name
// of at most 255 bytes, type and class) and an OPT record (11 bytes and its
// options: a client subnet, a cookie, padding to a multiple of 128 bytes,
// RFC 8467); a TSIG adds a name and a MAC. Real queries stay well under
// 1 KiB; 2 KiB leaves room, and bounds what 1,000 connections can make us
// hold to 2 MiB where the 16-bit length would allow 64 MiB.
const MaxTCPQuery = 2048

// errOversized: a TCP message announced more than MaxTCPQuery bytes.
var errOversized = errors.New("tcp query longer than MaxTCPQuery")

// readMsg reads one length-prefixed message into buf (reused), growing it
// only as the bytes arrive, and refuses one announced longer than
// MaxTCPQuery.
func readMsg(r *bufio.Reader, buf []byte) ([]byte, error) {
	var lb [2]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return buf, err
	}
	n := int(binary.BigEndian.Uint16(lb[:]))
	if n > MaxTCPQuery {
		return buf, errOversized
	}
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(n, max(2*cap(buf), tcpMsgChunk)))
			copy(nb, buf)
			buf = nb
		}
		k, err := r.Read(buf[len(buf):min(n, cap(buf))])
		buf = buf[:len(buf)+k]
		if err != nil && len(buf) < n {
			return buf, err
		}
	}
	return buf, nil
}

// flush writes the pending answers, if any.
func (tc *tcpConn) flush(pend *[]byte) bool {
	if len(*pend) == 0 {
		return true
	}
	ok := tc.writeRaw(*pend)
	*pend = (*pend)[:0]
	return ok
}

// remoteAddrPort is the client's address of a TCP connection.
// localAddr is the address a connection arrived on.
func localAddr(c net.Conn) netip.Addr {
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

func remoteAddrPort(c net.Conn) netip.AddrPort {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// buffered reports whether r holds a whole length-prefixed message, so it
// can be read without waiting.
func buffered(r *bufio.Reader) bool {
	if r.Buffered() < 2 {
		return false
	}
	lb, _ := r.Peek(2)
	return r.Buffered() >= 2+int(binary.BigEndian.Uint16(lb))
}

// writeRaw sends length-prefixed answers under the connection's write lock.
func (tc *tcpConn) writeRaw(out []byte) bool {
	tc.wmu.Lock()
	defer tc.wmu.Unlock()
	_ = tc.c.SetWriteDeadline(time.Now().Add(tc.wtimeout))
	_, err := tc.c.Write(out)
	return err == nil
}
