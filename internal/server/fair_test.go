package server

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// udpFrom is a UDP client of s bound to the source address src.
func udpFrom(t *testing.T, s *Server, src string) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(src)}, net.UDPAddrFromAddrPort(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sendQ(t *testing.T, c *net.UDPConn, id uint16, name string) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	b, _ := m.Pack()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

func readRcode(t *testing.T, c *net.UDPConn) (uint16, int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 512)
	n, err := c.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	var m dns.Msg
	if err := m.Unpack(b[:n]); err != nil {
		t.Fatal(err)
	}
	return m.Id, m.Rcode
}

// TestOneClientCannotHoldTheFlightBound: a client asking many names the
// upstream never answers holds at most the flight bound less its reserve;
// past that it gets SERVFAIL at once (counted as a share reject), and
// another client's new question is still sent upstream.
func TestOneClientCannotHoldTheFlightBound(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	asked := make(chan string, 256)
	s, _ := startServer(t, nil, func(c *resolve.Config) {
		c.MaxFlights = 64 // reserve 16, share 2
		c.Fetch = func(ctx context.Context, name string, q []byte) ([]byte, error) {
			asked <- name
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, context.Canceled
		}
	})
	hog := udpFrom(t, s, "127.0.0.2")
	for i := range 60 {
		sendQ(t, hog, uint16(i), fmt.Sprintf("stuck%d.example.", i))
	}
	for range 60 - 48 {
		if _, rc := readRcode(t, hog); rc != dns.RcodeServerFailure {
			t.Fatalf("hog past its share: rcode %d, want SERVFAIL", rc)
		}
	}
	for deadline := time.Now().Add(3 * time.Second); len(asked) < 48; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d upstream questions, want 48", len(asked))
		}
	}
	good := udpFrom(t, s, "127.0.0.3")
	sendQ(t, good, 1, "fresh.example.")
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		if len(asked) == 49 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other client's question was not sent upstream (%d asked)", len(asked))
		}
	}
	if c := s.Snapshot(); c.ShareRejectsFlights != 12 || c.Rejected != 12 {
		t.Fatalf("share rejects %d rejected %d, want 12 and 12", c.ShareRejectsFlights, c.Rejected)
	}
}

// TestOneClientCannotHoldTheWaitingBound: a client sending many queries
// for a few names the upstream never answers (one flight each, so the
// flight bound does not stop it) holds at most the waiting bound less its
// reserve; another client's miss is still admitted.
func TestOneClientCannotHoldTheWaitingBound(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	asked := make(chan string, 16)
	s, _ := startServer(t, func(c *Config) { c.MaxWaiting = 64 }, func(c *resolve.Config) {
		c.Fetch = func(ctx context.Context, name string, q []byte) ([]byte, error) {
			asked <- name
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, context.Canceled
		}
	})
	hog := udpFrom(t, s, "127.0.0.2")
	for i := range 60 {
		sendQ(t, hog, uint16(i), fmt.Sprintf("stuck%d.example.", i%3))
	}
	for range 60 - 48 {
		if _, rc := readRcode(t, hog); rc != dns.RcodeServerFailure {
			t.Fatalf("hog past its share: rcode %d, want SERVFAIL", rc)
		}
	}
	good := udpFrom(t, s, "127.0.0.3")
	sendQ(t, good, 1, "fresh.example.")
	for deadline := time.Now().Add(3 * time.Second); len(asked) < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the other client's question was not sent upstream (%d asked)", len(asked))
		}
	}
	if c := s.Snapshot(); c.ShareRejectsWaiting != 12 {
		t.Fatalf("waiting share rejects %d, want 12", c.ShareRejectsWaiting)
	}
}
