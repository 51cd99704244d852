package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// loopGrace is how long a serving loop may spend on one batch (or one
// accept) before CheckLoops calls it wedged. A batch of 64 hits takes tens
// of microseconds and misses leave the loop at once; only a full send
// buffer or a stopped process takes longer, and both are worth a failed
// health check. 500 ms fits twice in kubelet's default 1 s probe timeout.
const loopGrace = 500 * time.Millisecond

// tcpDrainIdle is how long a draining TCP connection that has been
// answered waits for its client's next query before it is closed. A client
// that sent the next query before it saw our answers is read well within
// it; one that is done gets its FIN 100 ms later.
const tcpDrainIdle = 100 * time.Millisecond

// tcpListener is one TCP listening socket and the liveness of its accept
// loop.
type tcpListener struct {
	ln *net.TCPListener
	// beat is odd while the accept loop waits in Accept, even while it
	// handles a connection (see CheckLoops).
	beat   atomic.Uint64
	exited atomic.Bool
}

// Listen opens the sockets that were not adopted from a twin: UDPSockets
// UDP sockets and one TCP listener per address, all with SO_REUSEPORT. With
// port 0 every UDP socket of an address shares the port the first one got.
// On error nothing stays open.
func (s *Server) Listen() error {
	for i, a := range s.cfg.Addrs {
		ap := netip.AddrPortFrom(a, uint16(s.cfg.port(i)))
		tap := ap
		udp := s.adoptedUDP[sockKey(ap)]
		delete(s.adoptedUDP, sockKey(ap))
		s.udp = append(s.udp, udp...)
		for i := len(udp); i < s.cfg.UDPSockets; i++ {
			l, err := listenUDP(ap)
			if err != nil {
				s.closeListeners()
				return fmt.Errorf("listen udp %s: %w", ap, err)
			}
			s.udp = append(s.udp, l)
			ap = l.local
		}
		if l := s.adoptedTCP[sockKey(tap)]; l != nil {
			delete(s.adoptedTCP, sockKey(tap))
			s.tcp = append(s.tcp, l)
			continue
		}
		ln, err := listenTCP(tap)
		if err != nil {
			s.closeListeners()
			return fmt.Errorf("listen tcp %s: %w", ap, err)
		}
		s.tcp = append(s.tcp, &tcpListener{ln: ln})
	}
	// Adopted sockets for addresses we do not serve are not ours to keep
	// (the twin that handed them over still holds them).
	for _, ls := range s.adoptedUDP {
		for _, l := range ls {
			l.close()
		}
	}
	for _, l := range s.adoptedTCP {
		_ = l.ln.Close()
	}
	s.adoptedUDP, s.adoptedTCP = nil, nil
	return nil
}

// Serve starts the serving goroutines for the sockets Listen opened and
// returns at once.
func (s *Server) Serve() {
	s.reserveProcs(len(s.udp))
	for _, l := range s.udp {
		s.wg.Add(1)
		l.ref() // the loop's: the socket stays open until it returns
		go func() {
			defer s.wg.Done()
			defer l.unref()
			defer l.exited.Store(true)
			s.serveUDP(l)
		}()
	}
	for _, l := range s.tcp {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer l.exited.Store(true)
			s.serveTCP(l)
		}()
	}
	s.serving.Store(true)
}

// Addr returns the bound address of the first UDP socket (useful with
// port 0 in tests).
func (s *Server) Addr() netip.AddrPort {
	if len(s.udp) == 0 {
		return netip.AddrPort{}
	}
	return s.udp[0].addr()
}

// UDPAddrs returns the bound address of every listen address (one per
// address, in the order of Config.Addrs).
func (s *Server) UDPAddrs() []netip.AddrPort {
	var out []netip.AddrPort
	seen := make(map[netip.AddrPort]bool)
	for _, l := range s.udp {
		if ap := l.addr(); !seen[ap] {
			seen[ap] = true
			out = append(out, ap)
		}
	}
	return out
}

// TCPAddr returns the bound address of the first TCP listener.
func (s *Server) TCPAddr() netip.AddrPort {
	if len(s.tcp) == 0 {
		return netip.AddrPort{}
	}
	return s.tcp[0].ln.Addr().(*net.TCPAddr).AddrPort()
}

// Shutdown stops serving and closes the sockets, in the order that loses
// nothing a twin holding the same sockets (Files, Adopt) could still
// answer: the receive and accept loops stop first, leaving what is queued
// in the sockets to the twin; TCP connections drain (each is closed at its
// first idle moment after it was answered; one that has not sent its first
// query yet gets the read timeout to send it); the misses being resolved
// are answered; only then are the sockets closed. When ctx is done first,
// the remaining connections are closed and ctx's error returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	now := time.Now()
	// The receive loops return within rcvTimeout; a deadline in the past
	// wakes an accept loop. Neither closes the socket it shares with a
	// twin.
	for _, l := range s.udp {
		l.stop.Store(true)
	}
	for _, l := range s.tcp {
		_ = l.ln.SetDeadline(now)
	}
	for _, tc := range s.conns {
		tc.drain()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		s.stopOnce.Do(func() { close(s.missStop) }) // no more misses come: idle workers exit
		s.missWG.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
		s.reserveProcs(0)
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		err = ctx.Err()
	}
	s.closeListeners()
	return err
}

// procsMu serialises changes of GOMAXPROCS by the servers of a process.
var procsMu sync.Mutex

// reserveProcs sets how many Ps this server's receive loops hold (see
// serveUDP) and moves GOMAXPROCS by the difference, so everything else
// keeps the Ps it had.
func (s *Server) reserveProcs(n int) {
	procsMu.Lock()
	defer procsMu.Unlock()
	if d := n - s.procs; d != 0 {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + d)
		s.procs = n
	}
}

func (s *Server) closeListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A receive loop or a miss still running here (Shutdown's ctx ran out)
	// holds its own reference: the descriptor is closed when the last of
	// them is done, never under them.
	for _, l := range s.udp {
		l.close()
	}
	for _, l := range s.tcp {
		_ = l.ln.Close()
	}
}

// Files returns duplicates of the listening sockets' descriptors (UDP and
// TCP, every address), for handing them to a twin that will serve the same
// addresses: the sockets, and what is queued in them, then outlive this
// server's Shutdown. The caller closes the files. It fails once the
// sockets are closed.
//
// The duplicates are made with fcntl, not net's File methods: those return
// a file whose Fd method puts the descriptor in blocking mode, and the mode
// belongs to the socket, shared with our loops and the twin's. A blocking
// socket makes recvmmsg wait for a whole batch of 64 datagrams, and makes
// a loop that Shutdown wakes with a deadline sleep in the kernel instead.
func (s *Server) Files() ([]*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			_ = f.Close()
		}
		return nil, err
	}
	dup := func(c syscall.Conn, name string) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var nfd int
		var derr error
		if err := raw.Control(func(fd uintptr) {
			nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		}); err != nil {
			return err
		}
		if derr != nil {
			return fmt.Errorf("dup %s: %w", name, derr)
		}
		files = append(files, os.NewFile(uintptr(nfd), name))
		return nil
	}
	for _, l := range s.udp {
		if l.closed.Load() {
			return fail(fmt.Errorf("dup udp %s: %w", l.local, net.ErrClosed))
		}
		nfd, err := unix.FcntlInt(uintptr(l.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("dup udp %s: %w", l.local, err))
		}
		files = append(files, os.NewFile(uintptr(nfd), "udp "+l.local.String()))
	}
	for _, l := range s.tcp {
		if err := dup(l.ln, "tcp "+l.ln.Addr().String()); err != nil {
			return fail(err)
		}
	}
	return files, nil
}

// Adopt takes listening sockets handed over by a twin (its Files). Listen
// then serves them instead of opening new ones, and opens only what is
// missing. Adopt closes the files (the sockets are duplicated first). It
// returns how many UDP and TCP sockets were adopted; sockets that are not
// bound to one of our addresses and our port are closed when Listen runs.
func (s *Server) Adopt(files []*os.File) (udp, tcp int, err error) {
	if s.adoptedUDP == nil {
		s.adoptedUDP = make(map[netip.AddrPort][]*udpListener)
		s.adoptedTCP = make(map[netip.AddrPort]*tcpListener)
	}
	var errs []error
	for _, f := range files {
		// Through SyscallConn, not f.Fd(): Fd would put the socket, which
		// the twin still serves, in blocking mode.
		typ, nfd, derr := -1, -1, error(nil)
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				if typ, derr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE); derr == nil && typ == unix.SOCK_DGRAM {
					nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
				}
			})
		}
		if typ == unix.SOCK_DGRAM {
			if derr != nil {
				errs = append(errs, fmt.Errorf("adopt %s: %w", f.Name(), derr))
			} else if l, lerr := newUDPListener(nfd); lerr != nil {
				errs = append(errs, fmt.Errorf("adopt %s: %w", f.Name(), lerr))
			} else {
				k := sockKey(l.local)
				s.adoptedUDP[k] = append(s.adoptedUDP[k], l)
				udp++
			}
		} else if ln, lerr := net.FileListener(f); lerr == nil {
			tl, ok := ln.(*net.TCPListener)
			if !ok {
				_ = ln.Close()
				errs = append(errs, fmt.Errorf("adopt %s: not a TCP listener", f.Name()))
			} else {
				ap := sockKey(tl.Addr().(*net.TCPAddr).AddrPort())
				if old := s.adoptedTCP[ap]; old != nil {
					_ = old.ln.Close()
					tcp--
				}
				s.adoptedTCP[ap] = &tcpListener{ln: tl}
				tcp++
			}
		} else {
			errs = append(errs, fmt.Errorf("adopt %s: %w", f.Name(), lerr))
		}
		_ = f.Close()
	}
	return udp, tcp, errors.Join(errs...)
}

// CheckLoops reports an error when a serving loop is not doing its job: it
// has exited while the server serves, or it has been busy with one batch
// (or one accepted connection) for longer than loopGrace. A loop waiting
// in recvmmsg or Accept is alive: the kernel wakes it when a packet or a
// connection arrives. Together with a query answered through each address
// this proves every socket is read, whichever one the kernel steers the
// probe to.
func (s *Server) CheckLoops(ctx context.Context) error {
	if !s.serving.Load() {
		return errors.New("not serving")
	}
	if s.closing.Load() {
		return errors.New("shutting down")
	}
	type loop struct {
		name   string
		beat   *atomic.Uint64
		exited *atomic.Bool
		seen   uint64
	}
	var busy []loop
	for i, l := range s.udp {
		lp := loop{fmt.Sprintf("udp loop %d (%s)", i, l.addr()), &l.beat, &l.exited, l.beat.Load()}
		if lp.exited.Load() {
			return fmt.Errorf("%s exited", lp.name)
		}
		if lp.seen%2 == 0 {
			busy = append(busy, lp)
		}
	}
	for i, l := range s.tcp {
		lp := loop{fmt.Sprintf("tcp accept loop %d (%s)", i, l.ln.Addr()), &l.beat, &l.exited, l.beat.Load()}
		if lp.exited.Load() {
			return fmt.Errorf("%s exited", lp.name)
		}
		if lp.seen%2 == 0 {
			busy = append(busy, lp)
		}
	}
	deadline := time.Now().Add(loopGrace)
	for len(busy) > 0 {
		still := busy[:0]
		for _, lp := range busy {
			if lp.beat.Load() == lp.seen && !lp.exited.Load() {
				still = append(still, lp)
			}
		}
		busy = still
		if len(busy) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s wedged: busy with one batch for over %v", busy[0].name, loopGrace)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s busy: %w", busy[0].name, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// PauseUDP wedges the receive loop of UDP socket i (in Listen's order)
// until resume is called: a test hook for health checks. It returns once
// the loop is stuck (it stops when it next wakes, within rcvTimeout).
func (s *Server) PauseUDP(i int) (resume func()) {
	l := s.udp[i]
	ch := make(chan struct{})
	l.hold.Store(&ch)
	for deadline := time.Now().Add(2 * rcvTimeout); !l.held.Load() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return func() {
		l.hold.Store(nil)
		close(ch)
	}
}
