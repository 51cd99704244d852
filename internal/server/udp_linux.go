package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/panics"
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

// udpOutSize holds any UDP answer we send (MaxClientUDPSize is at most 65535,
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

// rcvTimeout bounds one blocking recvmmsg (SO_RCVTIMEO): how long an idle
// loop takes to notice Shutdown or a test pause. It also makes recvmmsg
// return EINTR instead of restarting when the Go runtime signals the
// thread to preempt it (signal(7)), so a garbage collection never waits
// for a packet.
const rcvTimeout = 100 * time.Millisecond

// udpListener is one UDP socket and its receive loop. The socket is in
// blocking mode and not registered with Go's netpoller: the loop sleeps in
// recvmmsg itself, which at low and moderate rates costs about half the
// CPU per query of a netpoller wake-up (epoll_wait twice, recvmmsg until
// EAGAIN, scheduler hand-offs). See serveUDP for what that asks of the
// runtime.
type udpListener struct {
	fd    int
	local netip.AddrPort
	// wild: the socket is the wildcard one (wildcard_linux.go): each
	// datagram's destination comes with it and is its answer's source.
	wild  bool
	stats Stats
	// cd: the loop's CoreDNS-named counters (stats.go), nil when not counted.
	cd atomic.Pointer[cdCounters]
	// beat is odd while the loop waits in recvmmsg and even while it
	// handles a batch: two uncontended atomic adds per batch let
	// CheckLoops tell a waiting loop from a wedged one.
	beat   atomic.Uint64
	exited atomic.Bool
	hold   atomic.Pointer[chan struct{}] // PauseUDP (tests)
	held   atomic.Bool
	// stop asks the loop to return after the batch in hand, leaving the
	// socket (shared with a twin, see Files) open.
	stop atomic.Bool
	// refs counts the users of fd: the owner (until close), the receive
	// loop while it runs, and every miss that will reply on it. The
	// descriptor is closed when the last one lets go, so no sendmmsg or
	// recvmmsg can ever reach a descriptor number the process has reused
	// for another file (a netlink socket, an iptables pipe, a metrics
	// connection), however Shutdown ends.
	refs      atomic.Int64
	closed    atomic.Bool
	closeOnce sync.Once
	// The queue of miss answers (reply): smu guards the queue and the
	// sending flag, never a syscall; shdr and siov belong to the one
	// caller that is sending. The receive loop sends its own batches
	// without it.
	smu     sync.Mutex
	sq      []*missReq
	sspare  []*missReq
	sending bool
	shdr    [batchSize]unix.Mmsghdr
	siov    [batchSize]unix.Iovec
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

// listenUDP opens a blocking SO_REUSEPORT UDP socket bound to ap (the
// unspecified address: the wildcard socket, wildcard_linux.go).
func listenUDP(ap netip.AddrPort) (*udpListener, error) {
	if isWildcard(ap.Addr()) {
		fd, sa, err := wildcardSocket(ap.Port())
		if err != nil {
			return nil, fmt.Errorf("socket: %w", err)
		}
		return bindUDP(fd, sa)
	}
	family, sa := unix.AF_INET, unix.Sockaddr(nil)
	if a := ap.Addr(); a.Is4() || a.Is4In6() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.Unmap().As4()}
	} else {
		family = unix.AF_INET6
		sa6 := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
		if z := a.Zone(); z != "" { // a link-local address (bind IFACE)
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				return nil, fmt.Errorf("zone of %s: %w", a, err)
			}
			sa6.ZoneId = uint32(ifi.Index)
		}
		sa = sa6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if family == unix.AF_INET6 {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	return bindUDP(fd, sa)
}

// bindUDP sets SO_REUSEPORT on fd and binds it to sa.
func bindUDP(fd int, sa unix.Sockaddr) (*udpListener, error) {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("SO_REUSEPORT: %w", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	return newUDPListener(fd)
}

// newUDPListener takes a bound UDP socket, ours or adopted from a twin,
// and sets it up for the receive loop.
func newUDPListener(fd int) (*udpListener, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_DGRAM {
		unix.Close(fd)
		return nil, fmt.Errorf("not a UDP socket (type %d, %v)", typ, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("getsockname: %w", err)
	}
	l := &udpListener{fd: fd}
	l.refs.Store(1)
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		l.local = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		a := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.ZoneId != 0 { // link-local: the zone names the interface, as in the listen address
			if ifi, err := net.InterfaceByIndex(int(sa.ZoneId)); err == nil {
				a = a.WithZone(ifi.Name)
			}
		}
		l.local = netip.AddrPortFrom(a, uint16(sa.Port))
	default:
		unix.Close(fd)
		return nil, fmt.Errorf("not an IP socket")
	}
	if l.local.Addr().IsUnspecified() {
		l.wild = true
		_, v6 := sa.(*unix.SockaddrInet6)
		if err := setPktinfo(fd, v6); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("wildcard socket %s: destination addresses (PKTINFO): %w", l.local, err)
		}
	}
	// The mode and the options belong to the socket, which a twin may share:
	// every instance sets them the same way.
	_ = unix.SetNonblock(fd, false)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, socketBuffer)
	tv := unix.NsecToTimeval(int64(rcvTimeout))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("SO_RCVTIMEO: %w", err)
	}
	return l, nil
}

func (l *udpListener) addr() netip.AddrPort { return l.local }

// close gives up the owner's reference: the socket is closed at once if
// nothing else uses it, else when the receive loop has returned and the
// last miss has sent its answer.
func (l *udpListener) close() {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.unref()
	})
}

// ref takes a reference on the descriptor. Only a holder of a reference
// (the owner, the loop) may take another, so it never revives a closed one.
func (l *udpListener) ref() { l.refs.Add(1) }

// unref drops a reference and closes the descriptor with the last one.
func (l *udpListener) unref() {
	if l.refs.Add(-1) == 0 {
		_ = unix.Close(l.fd)
	}
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
	req    request // the query being answered
	cur    int     // the index of the datagram in hand, for a panic's log line
	// The wildcard socket's (wildcard_linux.go): what recvmmsg says of
	// each datagram, and the source its answer is sent from.
	ctlIn  [batchSize][ctlInLen]byte
	ctlOut [batchSize][pktinfoLen]byte
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
// and errors in place, start misses (their upstream queries leave from
// here; startMiss), send the batch's answers with one sendmmsg.
//
// The loop waits in a raw blocking recvmmsg: the Go runtime sees the
// goroutine as running, so it keeps its P while it sleeps. Serve raises
// GOMAXPROCS by one per loop so the rest of the program (misses, TCP,
// HTTP, timers) always has Ps of its own, and the loop yields at every
// timeout or signal so garbage collection can stop it within rcvTimeout.
// Goroutines it makes runnable itself (miss workers, for what cannot be
// started without blocking) land on its own P, so it also yields after
// every batch that handed one a miss.
//
// A panic that escapes the per-query guard (guard.go) ends udpLoop, which
// starts again; the datagrams of the batch in hand are lost.
func (s *Server) serveUDP(l *udpListener) {
	b := newBatch()
	for !s.udpLoop(l, b) {
	}
}

// udpLoop is serveUDP's loop. It reports true when it was stopped, false
// after a panic it recovered.
func (s *Server) udpLoop(l *udpListener, b *batch) (stopped bool) {
	b.cur = -1
	defer b.recoverLoop()
	req := &b.req
	req.st = &l.stats
	req.cd = s.loopCounters(l)
	addrIdx := s.cdServerIndex(l.local)
	handed := false // a miss of the last batch readied a worker
	for !l.stop.Load() {
		if handed {
			// Run what this batch's misses made runnable before we sleep
			// in recvmmsg again. ready() put the miss workers on this P's
			// run queue, which the blocked loop keeps: only another P's
			// spinning M could take them, and it backs off first
			// (usleep(3) in runtime.runqgrab: 55 µs or more with the
			// default 50 µs timer slack). That hand-off was a miss's
			// largest latency at a moderate rate: 115 µs median, 550 µs
			// p99 at 10k misses/s on one core (a runtime trace). Yielding
			// runs them here, on this thread (3-13 µs median). One yield:
			// a second one (for the goroutines that yielded during the
			// first, e.g. the TCP forwarder's writer) cost more wake-ups
			// of idle Ms than it saved (bench/MISS-PROFILE.md, session 3).
			handed = false
			runtime.Gosched()
		}
		l.beat.Add(1) // odd: waiting
		n, err := l.recv(b)
		l.beat.Add(1) // even: busy
		if h := l.hold.Load(); h != nil {
			l.held.Store(true)
			<-*h
			l.held.Store(false)
		}
		if err != nil {
			if err != unix.EAGAIN && err != unix.EINTR {
				s.cfg.Logger.Warn("udp read failed", "addr", l.local, "err", err)
			}
			runtime.Gosched() // a preemption point for the runtime
			continue
		}
		if s.answerBatch(l, b, n, addrIdx) {
			handed = true
		}
	}
	return true
}

// loopCounters are the CoreDNS-named counters of l's loop (none without
// them), made once: a loop that starts again after a panic keeps them.
func (s *Server) loopCounters(l *udpListener) cdObserver {
	if s.cd == nil {
		return cdObserver{}
	}
	srv := s.cdServerIndex(l.local)
	cd := l.cd.Load()
	if cd == nil {
		cd = newCDCounters(len(s.cfg.Addrs), s.cdz.n, true)
		cd.srv = max(srv, 0)
		l.cd.Store(cd)
	}
	return cdObserver{c: cd, srv: srv}
}

// recoverLoop, deferred by udpLoop, reports a panic with the datagram in
// hand; udpLoop then returns false and starts again.
func (b *batch) recoverLoop() {
	if p := recover(); p != nil {
		var msg []byte
		if i := b.cur; i >= 0 && i < batchSize {
			msg = b.in[i][:min(int(b.hdrIn[i].Len), udpBufSize)]
		}
		panics.Recovered(panics.UDP, p, msg)
	}
}

// answerBatch answers the n datagrams of b read from l (its index in
// Config.Addrs: addrIdx): hits and errors in place into one buffer, sent
// with one sendmmsg; misses started (their upstream queries leave from
// here). It reports whether a miss made a goroutine runnable, which the
// loop must yield to (serveUDP).
func (s *Server) answerBatch(l *udpListener, b *batch, n, addrIdx int) (handed bool) {
	req := &b.req
	t := s.cfg.Clock.Now()
	now := t.UnixNano()
	askers := s.askers.Load()
	var from netip.Addr
	req.q.View = s.viewFor(addrIdx) // once per batch; kept by ParseQuery
	req.t, req.now = t, now
	b.out = b.out[:0]
	nout := 0
	for i := 0; i < n; i++ {
		b.cur = i
		h := &b.hdrIn[i]
		if h.Hdr.Flags&unix.MSG_TRUNC != 0 {
			// Larger than any real query: answer from the header alone.
			h.Len = wire.HeaderLen
		}
		raw := b.in[i][:h.Len]
		name := b.names[i][:h.Hdr.Namelen]
		if reflectorPort(name) {
			l.stats.RequestsUDP.Add(1)
			l.stats.Dropped.Add(1)
			l.stats.ReflectorDrops.Add(1)
			continue
		}
		var clen uint32
		req.local = l.local.Addr() // the wildcard's: each datagram's destination
		if l.wild {
			req.wild, req.v6 = true, isV6Sockaddr(name)
			var local netip.Addr
			if clen, local = pktDst(b.ctlIn[i][:h.Hdr.Controllen], &b.ctlOut[i]); clen > 0 {
				req.local = local
			}
		}
		start := len(b.out)
		src := sockaddrAddrPort(name).Addr()
		if askers {
			from = src
		}
		req.raw, req.from, req.owner, req.sa = raw, from, s.hitKey(src), name
		out, v := s.answerGuarded(req, b.out)
		switch v {
		case dropped:
			continue
		case miss:
			m := newMiss(req)
			m.l = l
			m.nlen = uint32(copy(m.name[:], name))
			m.clen = clen
			if clen > 0 {
				m.ctl = b.ctlOut[i]
			}
			l.ref() // released once the answer is sent (reply)
			if s.startMiss(m) {
				handed = true
			}
			continue
		}
		b.out = out
		o := &b.hdrOut[nout]
		o.Hdr.Name = &b.names[i][0]
		o.Hdr.Namelen = h.Hdr.Namelen
		if l.wild {
			o.Hdr.Control = nil
			o.Hdr.SetControllen(0)
			if clen > 0 {
				o.Hdr.Control = &b.ctlOut[i][0]
				o.Hdr.SetControllen(int(clen))
			}
		}
		b.iovOut[nout].SetLen(len(out) - start)
		// Base is set after the loop: b.out may still grow (and move).
		b.iovOut[nout].Base = nil
		o.Len = uint32(start) // remember the offset until then
		nout++
	}
	b.cur = -1
	if cd := req.cd.c; cd != nil {
		var elapsed int64
		if cd.hasPend {
			elapsed = s.cfg.Clock.Now().UnixNano() - now
		}
		cd.flush(s.cdz.n, elapsed)
	}
	if nout == 0 {
		return handed
	}
	for j := 0; j < nout; j++ {
		o := &b.hdrOut[j]
		b.iovOut[j].Base = &b.out[o.Len]
		o.Hdr.Iov = &b.iovOut[j]
		o.Hdr.SetIovlen(1)
		o.Len = 0
	}
	l.send(b.hdrOut[:nout])
	return handed
}

// recv reads up to batchSize datagrams, sleeping in the kernel until at
// least one is there or rcvTimeout passes (EAGAIN).
func (l *udpListener) recv(b *batch) (int, error) {
	for i := range b.hdrIn {
		h := &b.hdrIn[i]
		h.Hdr.Name = &b.names[i][0]
		h.Hdr.Namelen = unix.SizeofSockaddrAny
		h.Hdr.Flags = 0
		h.Len = 0
		if l.wild {
			h.Hdr.Control = &b.ctlIn[i][0]
			h.Hdr.SetControllen(ctlInLen)
		}
	}
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(l.fd), uintptr(unsafe.Pointer(&b.hdrIn[0])), batchSize, unix.MSG_WAITFORONE, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// send writes every message; a message the kernel refuses (e.g. an
// unreachable destination) is skipped. The receive loop and the goroutine
// sending the miss queue (reply) may send concurrently: the kernel
// serialises them. The caller holds a reference on the descriptor. A full send buffer
// blocks the caller (in a regular syscall, so its P is handed on).
func (l *udpListener) send(msgs []unix.Mmsghdr) {
	for len(msgs) > 0 {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(l.fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
		switch e {
		case 0:
			msgs = msgs[r:]
		case unix.EINTR, unix.EAGAIN:
		case unix.EBADF:
			return // closed
		default:
			msgs = msgs[1:] // the first message failed: drop it and go on
		}
	}
}

// reply queues a miss's answer and sends the queue with sendmmsg: the
// first caller to find no send in progress sends until the queue is empty,
// so answers that complete together (a burst of misses, a coalesced miss)
// leave in one syscall. It returns m to the pool once sent.
func (l *udpListener) reply(m *missReq) {
	l.smu.Lock()
	l.sq = append(l.sq, m)
	if l.sending {
		l.smu.Unlock()
		return
	}
	l.sending = true
	if !m.async {
		// Let the misses that are runnable now (answers that arrived
		// together) queue theirs first. Not on an upstream's reader
		// (Resolved): the answers it read after this one wait for it.
		l.smu.Unlock()
		runtime.Gosched()
		l.smu.Lock()
	}
	for len(l.sq) > 0 {
		q := l.sq
		l.sq = l.sspare[:0]
		l.smu.Unlock()
		for off := 0; off < len(q); off += batchSize {
			k := 0
			for _, m := range q[off:min(off+batchSize, len(q))] {
				if len(m.out) == 0 || m.nlen == 0 {
					continue
				}
				l.siov[k] = unix.Iovec{Base: &m.out[0]}
				l.siov[k].SetLen(len(m.out))
				h := &l.shdr[k].Hdr
				h.Name = &m.name[0]
				h.Namelen = m.nlen
				h.Iov = &l.siov[k]
				h.SetIovlen(1)
				h.Control = nil
				h.SetControllen(0)
				if m.clen > 0 { // the wildcard socket: the query's destination is the source
					h.Control = &m.ctl[0]
					h.SetControllen(int(m.clen))
				}
				k++
			}
			l.send(l.shdr[:k])
		}
		for i, m := range q {
			putMiss(m)
			q[i] = nil
			l.unref() // the miss's reference (serveUDP)
		}
		l.smu.Lock()
		l.sspare = q[:0]
	}
	l.sending = false
	l.smu.Unlock()
}

// reflectorPorts are UDP source ports no DNS client uses and whose
// services answer anything (echo 7, daytime 13, qotd 17, chargen 19, time
// 37; 0 is not a valid source): a query "from" one of them is a spoofed
// packet that would start a reflection loop, our answer provoking theirs.
var reflectorPorts = [...]uint16{0, 7, 13, 17, 19, 37}

// reflectorPort reports whether the raw sockaddr's port is a reflector's.
func reflectorPort(sa []byte) bool {
	if len(sa) < 4 {
		return false
	}
	p := uint16(sa[2])<<8 | uint16(sa[3])
	if p > 37 {
		return false
	}
	for _, r := range reflectorPorts {
		if p == r {
			return true
		}
	}
	return false
}
