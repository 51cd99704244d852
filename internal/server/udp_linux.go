package server

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// batchSize is how many datagrams one recvmmsg/sendmmsg call moves. At
// 250k queries/s a batch of 64 is a quarter millisecond of traffic: large
// enough to amortise the syscalls, small enough to add no visible latency.
const batchSize = 64

// udpBufSize holds any query: EDNS clients may send up to their own
// advertised size, and queries larger than 4 KiB do not exist in practice
// (a longer one is flagged MSG_TRUNC and answered FORMERR).
const udpBufSize = 4096

// udpOutSize holds any UDP answer we send (MaxUDPSize is at most 65535,
// but answers above the client's size are truncated before they are sent).
const udpOutSize = 65535

// socketBuffer is the SO_RCVBUF/SO_SNDBUF we ask for: a burst of a few
// thousand queries must queue rather than be dropped while the reader is
// descheduled. The kernel caps it at net.core.rmem_max.
const socketBuffer = 4 << 20

// Address families as raw sockaddrs carry them (querylog.go).
const (
	afInet  = unix.AF_INET
	afInet6 = unix.AF_INET6
)

type udpListener struct {
	conn  *net.UDPConn
	raw   syscall.RawConn
	stats Stats
	// beat is odd while the loop waits in recvmmsg and even while it
	// handles a batch: two uncontended atomic adds per batch let
	// CheckLoops tell a waiting loop from a wedged one.
	beat   atomic.Uint64
	exited atomic.Bool
	hold   atomic.Pointer[chan struct{}] // PauseUDP (tests)
}

func reusePort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

func listenUDP(ap netip.AddrPort) (*udpListener, error) {
	lc := net.ListenConfig{Control: reusePort}
	pc, err := lc.ListenPacket(context.Background(), "udp", ap.String())
	if err != nil {
		return nil, err
	}
	return newUDPListener(pc.(*net.UDPConn))
}

// newUDPListener wraps a bound UDP socket, ours or adopted from a twin.
func newUDPListener(conn *net.UDPConn) (*udpListener, error) {
	_ = conn.SetReadBuffer(socketBuffer)
	_ = conn.SetWriteBuffer(socketBuffer)
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &udpListener{conn: conn, raw: raw}, nil
}

func listenTCP(ap netip.AddrPort) (*net.TCPListener, error) {
	lc := net.ListenConfig{Control: reusePort}
	ln, err := lc.Listen(context.Background(), "tcp", ap.String())
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}

// batch is the per-socket state of the receive loop: buffers and message
// headers reused for every recvmmsg/sendmmsg call, so the loop allocates
// nothing.
type batch struct {
	in     [batchSize][udpBufSize]byte
	names  [batchSize][unix.SizeofSockaddrAny]byte
	iovIn  [batchSize]unix.Iovec
	hdrIn  [batchSize]unix.Mmsghdr
	out    []byte // all answers of a batch, back to back
	iovOut [batchSize]unix.Iovec
	hdrOut [batchSize]unix.Mmsghdr
	q      wire.Query
}

func newBatch() *batch {
	b := &batch{out: make([]byte, 0, batchSize*1232)}
	for i := range b.hdrIn {
		b.iovIn[i].Base = &b.in[i][0]
		b.iovIn[i].SetLen(udpBufSize)
		b.hdrIn[i].Hdr.Iov = &b.iovIn[i]
		b.hdrIn[i].Hdr.SetIovlen(1)
	}
	return b
}

// serveUDP is the receive loop of one socket: read a batch, answer hits
// and errors in place, hand misses to goroutines, send the batch's answers
// with one sendmmsg.
func (s *Server) serveUDP(l *udpListener) {
	b := newBatch()
	for {
		l.beat.Add(1) // odd: waiting
		n, err := l.recv(b)
		l.beat.Add(1) // even: busy
		if h := l.hold.Load(); h != nil {
			<-*h
		}
		if err != nil {
			// Shutdown wakes the loop with a past read deadline: it stops
			// reading and leaves the socket, and what is queued in it, to a
			// twin that holds it too.
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				s.cfg.Logger.Warn("udp read failed", "addr", l.conn.LocalAddr(), "err", err)
			}
			continue
		}
		now := s.cfg.Now().UnixNano()
		var t0 time.Time
		qlog := s.cfg.QueryLog != nil
		if qlog {
			t0 = time.Now()
		}
		b.out = b.out[:0]
		nout := 0
		for i := 0; i < n; i++ {
			h := &b.hdrIn[i]
			if h.Hdr.Flags&unix.MSG_TRUNC != 0 {
				// Larger than any real query: answer from the header alone.
				h.Len = wire.HeaderLen
			}
			raw := b.in[i][:h.Len]
			start := len(b.out)
			out, v := s.answerLocal(raw, &b.q, b.out, false, now, &l.stats)
			switch v {
			case dropped:
				continue
			case miss:
				s.startMiss(l, raw, &b.q, b.names[i][:h.Hdr.Namelen], t0)
				continue
			}
			if qlog {
				s.logQuery(sockaddrAddrPort(b.names[i][:h.Hdr.Namelen]), false, &b.q, out[start:], fromCache, t0)
			}
			b.out = out
			o := &b.hdrOut[nout]
			o.Hdr.Name = &b.names[i][0]
			o.Hdr.Namelen = h.Hdr.Namelen
			b.iovOut[nout].SetLen(len(out) - start)
			// Base is set after the loop: b.out may still grow (and move).
			b.iovOut[nout].Base = nil
			o.Len = uint32(start) // remember the offset until then
			nout++
		}
		if nout == 0 {
			continue
		}
		for j := 0; j < nout; j++ {
			o := &b.hdrOut[j]
			b.iovOut[j].Base = &b.out[o.Len]
			o.Hdr.Iov = &b.iovOut[j]
			o.Hdr.SetIovlen(1)
			o.Len = 0
		}
		l.send(b.hdrOut[:nout])
	}
}

// recv reads up to batchSize datagrams, blocking (in the netpoller) until
// at least one is there.
func (l *udpListener) recv(b *batch) (int, error) {
	for i := range b.hdrIn {
		h := &b.hdrIn[i]
		h.Hdr.Name = &b.names[i][0]
		h.Hdr.Namelen = unix.SizeofSockaddrAny
		h.Hdr.Flags = 0
		h.Len = 0
	}
	var n int
	var serr error
	err := l.raw.Read(func(fd uintptr) bool {
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrIn[0])), batchSize, 0, 0, 0)
		if e == unix.EAGAIN {
			return false
		}
		if e == unix.EINTR {
			return false
		}
		if e != 0 {
			serr = e
			return true
		}
		n = int(r)
		return true
	})
	if err != nil {
		return 0, err
	}
	return n, serr
}

// send writes every message, waiting for buffer space when the socket is
// full; a message the kernel refuses (e.g. an unreachable destination) is
// skipped. RawConn.Write holds the socket's write lock, so the receive loop
// and miss goroutines may call it concurrently.
func (l *udpListener) send(msgs []unix.Mmsghdr) {
	for len(msgs) > 0 {
		var n int
		err := l.raw.Write(func(fd uintptr) bool {
			r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
			switch e {
			case 0:
				n = int(r)
			case unix.EAGAIN, unix.EINTR:
				return false
			default:
				n = 1 // the first message failed: drop it and go on
			}
			return true
		})
		if err != nil {
			return // socket closed
		}
		msgs = msgs[n:]
	}
}

// missReq carries one miss off the receive loop: copies of the query and
// the client's address, because the batch buffers are reused at once.
type missReq struct {
	raw  []byte
	name [unix.SizeofSockaddrAny]byte
	nlen uint32
	q    wire.Query
	out  []byte
	t0   time.Time // for the query log
}

var missPool = sync.Pool{New: func() any {
	return &missReq{raw: make([]byte, 0, 512), out: make([]byte, 0, 1232)}
}}

func (s *Server) startMiss(l *udpListener, raw []byte, q *wire.Query, name []byte, t0 time.Time) {
	if !s.admit() {
		out := s.overloaded(raw, q, nil, false)
		if s.cfg.QueryLog != nil {
			s.logQuery(sockaddrAddrPort(name), false, q, out, fromOverload, t0)
		}
		l.sendOne(out, name)
		return
	}
	m := missPool.Get().(*missReq)
	m.raw = append(m.raw[:0], raw...)
	m.nlen = uint32(copy(m.name[:], name))
	m.t0 = t0
	// Re-parse on the copy so the query's slices point into m.raw.
	_ = wire.ParseQuery(m.raw, &m.q)
	s.missWG.Add(1)
	go func() {
		defer s.missWG.Done()
		defer s.release()
		m.out = s.resolve(m.raw, &m.q, m.out[:0], false)
		if s.cfg.QueryLog != nil {
			s.logQuery(sockaddrAddrPort(m.name[:m.nlen]), false, &m.q, m.out, fromUpstream, m.t0)
		}
		l.sendOne(m.out, m.name[:m.nlen])
		if cap(m.out) <= udpOutSize {
			missPool.Put(m)
		}
	}()
}

// sendOne sends one datagram to the raw socket address name.
func (l *udpListener) sendOne(b []byte, name []byte) {
	if len(b) == 0 || len(name) == 0 {
		return
	}
	var h [1]unix.Mmsghdr
	iov := unix.Iovec{Base: &b[0]}
	iov.SetLen(len(b))
	h[0].Hdr.Name = &name[0]
	h[0].Hdr.Namelen = uint32(len(name))
	h[0].Hdr.Iov = &iov
	h[0].Hdr.SetIovlen(1)
	l.send(h[:])
}
