package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// How the old instance leaves the shared address in a handover run.
type handover int

const (
	// closeOwn: the new instance opens its own SO_REUSEPORT sockets; the old
	// one stops reading and closes its sockets (what is queued is lost).
	closeOwn handover = iota
	// detachFirst: as closeOwn, but the old instance first connect()s its
	// UDP sockets to an unused peer, which takes them out of the kernel's
	// SO_REUSEPORT selection, reads what was already queued, then closes.
	detachFirst
	// passFiles: the new instance adopts the old one's sockets (Files,
	// Adopt: what SCM_RIGHTS does between processes) and opens none; the
	// old one stops reading and closes its copies.
	passFiles
)

func (h handover) String() string {
	return [...]string{"reuseport+close", "reuseport+connect-detach+close", "fd handover"}[h]
}

func newAt(t testing.TB, ap netip.AddrPort, sockets int) *Server {
	t.Helper()
	s, err := New(Config{
		Addrs:      []netip.Addr{ap.Addr()},
		Port:       int(ap.Port()),
		UDPSockets: sockets,
		Resolver:   newResolver(t, (&zoneForward{}).forward),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// loadResult counts a load run: queries sent, answered NOERROR, answered
// otherwise, and never answered within the client's timeout.
type loadResult struct{ sent, ok, bad, lost atomic.Int64 }

func (r *loadResult) String() string {
	return fmt.Sprintf("sent %d, answered %d, bad rcode %d, lost %d", r.sent.Load(), r.ok.Load(), r.bad.Load(), r.lost.Load())
}

// runLoad sends queries until stop is closed: udpClients sequential UDP
// clients (each moves to a new source port, so to another SO_REUSEPORT
// socket, every 20 queries) and tcpClients clients that open one
// connection per query, as glibc does. A query unanswered after a second
// is lost.
func runLoad(addr string, udpClients, tcpClients int, pause time.Duration, stop <-chan struct{}) (*loadResult, *loadResult, func()) {
	udp, tcp := &loadResult{}, &loadResult{}
	var wg sync.WaitGroup
	q := func(id uint16, i int) []byte {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.example.", i%50), dns.TypeA)
		m.Id = id
		b, _ := m.Pack()
		return b
	}
	check := func(r *loadResult, b []byte, id uint16) {
		if len(b) < 12 || binary.BigEndian.Uint16(b) != id {
			r.bad.Add(1)
		} else if b[3]&0x0F != 0 {
			r.bad.Add(1)
		} else {
			r.ok.Add(1)
		}
	}
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for c := 0; c < udpClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1500)
			var conn net.Conn
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for i := 0; !stopped(); i++ {
				if i%20 == 0 {
					if conn != nil {
						conn.Close()
					}
					var err error
					if conn, err = net.Dial("udp", addr); err != nil {
						panic(err)
					}
				}
				id := uint16(i)
				udp.sent.Add(1)
				_, _ = conn.Write(q(id, i))
				_ = conn.SetReadDeadline(time.Now().Add(time.Second))
				for {
					n, err := conn.Read(buf)
					if err != nil {
						udp.lost.Add(1)
						break
					}
					if n >= 2 && binary.BigEndian.Uint16(buf) != id {
						continue // a late answer to an earlier query
					}
					check(udp, buf[:n], id)
					break
				}
				time.Sleep(pause)
			}
		}()
	}
	for c := 0; c < tcpClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stopped(); i++ {
				tcp.sent.Add(1)
				id := uint16(i)
				if b, err := tcpExchange(addr, q(id, i)); err != nil {
					tcp.lost.Add(1)
				} else {
					check(tcp, b, id)
				}
				time.Sleep(pause)
			}
		}()
	}
	return udp, tcp, wg.Wait
}

func tcpExchange(addr string, query []byte) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(query))), query...)); err != nil {
		return nil, err
	}
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(lb[:]))
	_, err = io.ReadFull(c, b)
	return b, err
}

// detach connects every UDP socket of s to an unused peer: the kernel then
// steers no more client datagrams to it (a connected socket only matches
// its peer, and SO_REUSEPORT selection skips connected sockets), while what
// is queued stays readable.
func detach(t testing.TB, s *Server) {
	t.Helper()
	for _, l := range s.udp {
		if err := unix.Connect(l.fd, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 254}}); err != nil {
			t.Fatalf("connect: %v", err)
		}
	}
}

// handoverRun starts instance A on addr, puts load on it, starts B on the
// same address the given way, shuts A down while the load goes on, and
// returns what the clients saw.
func handoverRun(t testing.TB, how handover, addr netip.AddrPort, udpClients, tcpClients int, pause time.Duration) (udp, tcp *loadResult) {
	return handoverRunOn(t, how, addr, addr, udpClients, tcpClients, pause)
}

// handoverRunOn is handoverRun with both instances listening on listen
// and the clients asking addr (a wildcard listen address: any of the
// host's).
func handoverRunOn(t testing.TB, how handover, listen, addr netip.AddrPort, udpClients, tcpClients int, pause time.Duration) (udp, tcp *loadResult) {
	t.Helper()
	a := newAt(t, listen, 2)
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	a.Serve()
	stop := make(chan struct{})
	udp, tcp, wait := runLoad(addr.String(), udpClients, tcpClients, pause, stop)
	time.Sleep(300 * time.Millisecond)

	b := newAt(t, listen, 2)
	if how == passFiles {
		files, err := a.Files()
		if err != nil {
			t.Fatal(err)
		}
		if nu, nt, err := b.Adopt(files); err != nil || nu != 2 || nt != 1 {
			t.Fatalf("adopted %d udp %d tcp: %v", nu, nt, err)
		}
	}
	if err := b.Listen(); err != nil {
		t.Fatal(err)
	}
	b.Serve()
	time.Sleep(300 * time.Millisecond) // both serve

	if how == detachFirst {
		detach(t, a)
		time.Sleep(20 * time.Millisecond) // A's loops read what was queued
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := a.Shutdown(ctx); err != nil {
		t.Errorf("shutdown A: %v", err)
	}
	cancel()
	time.Sleep(500 * time.Millisecond) // B alone
	close(stop)
	wait()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.Shutdown(ctx)
	return udp, tcp
}

func freeAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		pc.Close()
		if err == nil {
			ln.Close()
			return pc.LocalAddr().(*net.UDPAddr).AddrPort()
		}
	}
	t.Fatal("no port free for both udp and tcp")
	return netip.AddrPort{}
}

// TestFileHandoverLosesNothing: a twin that adopts the sockets (as the
// daemon does over SCM_RIGHTS) takes over without one lost query, over UDP
// and TCP, while the old server shuts down under load.
func TestFileHandoverLosesNothing(t *testing.T) {
	udp, tcp := handoverRun(t, passFiles, freeAddr(t), 4, 2, time.Millisecond)
	t.Logf("udp: %v; tcp: %v", udp, tcp)
	if udp.lost.Load() != 0 || udp.bad.Load() != 0 || tcp.lost.Load() != 0 || tcp.bad.Load() != 0 {
		t.Fatalf("handover lost queries: udp: %v; tcp: %v", udp, tcp)
	}
	if udp.ok.Load() < 100 || tcp.ok.Load() < 20 {
		t.Fatalf("too little load to prove anything: udp: %v; tcp: %v", udp, tcp)
	}
}

// TestFileHandoverWildcardLosesNothing: the wildcard sockets (listen
// address 0.0.0.0) are handed over as well, the twin's answers to a query
// sent to 127.0.0.2 still leaving from 127.0.0.2 (the clients' connected
// sockets drop any other source, which would count as lost).
func TestFileHandoverWildcardLosesNothing(t *testing.T) {
	port := freeWildPort(t)
	listen := netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port))
	udp, tcp := handoverRunOn(t, passFiles, listen, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port)), 4, 2, time.Millisecond)
	t.Logf("udp: %v; tcp: %v", udp, tcp)
	if udp.lost.Load() != 0 || udp.bad.Load() != 0 || tcp.lost.Load() != 0 || tcp.bad.Load() != 0 {
		t.Fatalf("handover lost queries: udp: %v; tcp: %v", udp, tcp)
	}
	if udp.ok.Load() < 100 || tcp.ok.Load() < 20 {
		t.Fatalf("too little load to prove anything: udp: %v; tcp: %v", udp, tcp)
	}
}

// TestMeasureHandoverStrategies compares the ways to hand a shared address
// over (docs/design.md, "Restarts and upgrades"). It is a measurement, not
// a check: NLD_MEASURE=1 go test -run MeasureHandover -v ./internal/server
func TestMeasureHandoverStrategies(t *testing.T) {
	if os.Getenv("NLD_MEASURE") == "" {
		t.Skip("a measurement; set NLD_MEASURE=1")
	}
	const rounds = 10
	for _, how := range []handover{closeOwn, detachFirst, passFiles} {
		var sent, lost, tsent, tlost, bad int64
		for range rounds {
			udp, tcp := handoverRun(t, how, freeAddr(t), 8, 2, 200*time.Microsecond)
			sent += udp.sent.Load()
			lost += udp.lost.Load()
			tsent += tcp.sent.Load()
			tlost += tcp.lost.Load()
			bad += udp.bad.Load() + tcp.bad.Load()
		}
		t.Logf("%-32s %d rounds: udp %6d sent %4d lost; tcp %5d sent %3d lost; bad rcode %d", how, rounds, sent, lost, tsent, tlost, bad)
	}
}

// TestFilesKeepSocketModes: handing the sockets over must not change their
// mode (it is the socket's, shared with the serving loops of both twins):
// the UDP sockets stay blocking with SO_RCVTIMEO set (serveUDP sleeps in
// recvmmsg), the TCP listener stays non-blocking (net's accept loop
// relies on it), also once the descriptor is read with Fd, as SCM_RIGHTS
// sending does.
func TestFilesKeepSocketModes(t *testing.T) {
	s, _ := startServer(t, nil)
	files, err := s.Files()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("%d files, want 1 udp + 1 tcp", len(files))
	}
	for _, f := range files {
		fd := f.Fd()
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err != nil {
			t.Fatal(err)
		}
		typ, _ := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE)
		switch typ {
		case unix.SOCK_DGRAM:
			tv, err := unix.GetsockoptTimeval(int(fd), unix.SOL_SOCKET, unix.SO_RCVTIMEO)
			if fl&unix.O_NONBLOCK != 0 || err != nil || tv.Nano() != int64(rcvTimeout) {
				t.Errorf("%s: nonblock %v, SO_RCVTIMEO %v %v", f.Name(), fl&unix.O_NONBLOCK != 0, tv, err)
			}
		case unix.SOCK_STREAM:
			if fl&unix.O_NONBLOCK == 0 {
				t.Errorf("%s is blocking after Files and Fd", f.Name())
			}
		}
		f.Close()
	}
}
