package server

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// sockFd is the descriptor number of a socket.
func sockFd(t *testing.T, c syscall.Conn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// TestDeadlineShutdownNeverWritesToAReusedFd: Shutdown's deadline runs out
// while misses are pending; the process then opens sockets (which get the
// lowest free descriptor numbers); the misses' answers must never be sent
// through one of those. The UDP descriptor stays ours until the last miss
// has sent its answer, and is closed then.
func TestDeadlineShutdownNeverWritesToAReusedFd(t *testing.T) {
	release := make(chan struct{})
	s, _ := startServer(t, nil, func(c *resolve.Config) {
		c.Fetch = func(ctx context.Context, _ string, q []byte) ([]byte, error) {
			<-release
			return (&zoneForward{}).forward(ctx, "", q)
		}
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	serverAddr := s.Addr()
	oldFd := s.udp[0].fd
	client, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const n = 20
	for i := 0; i < n; i++ {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("pending%d.example.", i), dns.TypeA)
		m.Id = uint16(i)
		b, _ := m.Pack()
		if _, err := client.WriteToUDPAddrPort(b, serverAddr); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); s.res.InFlight() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d misses pending, want %d", s.res.InFlight(), n)
		}
	}
	// The deadline path: ctx is already done.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown with a done context returned nil")
	}
	// Let the receive loop notice stop, then take every low descriptor
	// number there is with sockets of our own.
	for deadline := time.Now().Add(5 * time.Second); !s.udp[0].exited.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("receive loop did not exit")
		}
	}
	var victims []*net.UDPConn
	defer func() {
		for _, v := range victims {
			v.Close()
		}
	}()
	for i := 0; i < 64; i++ {
		v, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		victims = append(victims, v)
		if sockFd(t, v) == oldFd {
			t.Errorf("descriptor %d reused while %d misses still answer through it", oldFd, n)
		}
	}
	close(release)
	// Every answer must come from the server's socket, none from a victim.
	got := 0
	buf := make([]byte, 1500)
	for got < n {
		_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
		k, from, err := client.ReadFromUDPAddrPort(buf)
		if err != nil {
			break // answers may be lost on the deadline path; misdirected ones may not
		}
		if from != serverAddr {
			t.Fatalf("answer from %v, not the server's %v: sent through a reused descriptor", from, serverAddr)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:k]); err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != n {
		t.Errorf("%d of %d pending misses answered", got, n)
	}
	// The last sender closed the descriptor.
	for deadline := time.Now().Add(5 * time.Second); s.udp[0].refs.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("descriptor still held: %d references", s.udp[0].refs.Load())
		}
	}
}
