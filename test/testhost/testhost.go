// Package testhost holds what the end-to-end tests under test/ share to run
// servers on this machine: a loopback address of their own, a port free for
// both UDP and TCP, and a log buffer a child process writes while the test
// reads it. Only tests import it.
package testhost

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// Loopback picks an address in 127.0.0.0/8 that no other test or process is
// likely to use, so SO_REUSEPORT never shares a test's port with a stranger.
func Loopback() string {
	return fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), rand.IntN(250)+1, rand.IntN(250)+1)
}

// FreePort returns a port on ip that was free for UDP and for TCP (a DNS
// server binds both); it fails the test after 50 tries.
func FreePort(t testing.TB, ip string) int {
	t.Helper()
	for range 50 {
		pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
		_ = pc.Close()
		if err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatalf("no port on %s free for both UDP and TCP", ip)
	return 0
}

// FreeWildcardPort returns a port that was free for UDP and for TCP on every
// address (the dual-stack wildcard, as a server bound to 0.0.0.0 or :: takes
// it); it fails the test after 50 tries. The port is drawn below the
// kernel's ephemeral range (ip_local_port_range), where no client socket of
// a test running beside it is given one: a port the kernel hands out with
// :0 is any test's next client port, and a wildcard bind collides with a
// socket on that port at any address.
func FreeWildcardPort(t testing.TB) int {
	t.Helper()
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		_, _ = fmt.Sscan(string(b), &lo)
	}
	const first = 20000
	if lo <= first+1000 {
		t.Fatalf("ip_local_port_range starts at %d: no room below it for a test's wildcard port", lo)
	}
	for range 50 {
		port := first + rand.IntN(lo-first)
		pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		if err != nil {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		_ = pc.Close()
		if err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatalf("no port below %d free for both UDP and TCP on every address", lo)
	return 0
}

// SyncBuffer is a bytes.Buffer a child process (or a serving goroutine)
// writes while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
