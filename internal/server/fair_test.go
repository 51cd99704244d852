package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
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

// tcpFrom is a TCP client of s from the source address src, closed at the
// test's end.
func tcpFrom(t *testing.T, s *Server, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitTCPConns waits until s has n client TCP connections open.
func waitTCPConns(t *testing.T, s *Server, n int64) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); s.Snapshot().TCPConns != n; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d conns, want %d", s.Snapshot().TCPConns, n)
		}
	}
}

// stuckServer serves with an upstream that never answers: it records each
// name asked in asked and waits until the test ends.
func stuckServer(t *testing.T, mutate func(*Config), rmut func(*resolve.Config)) (*Server, chan string) {
	t.Helper()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	asked := make(chan string, 256)
	s, _ := startServer(t, mutate, func(c *resolve.Config) {
		c.Fetch = func(ctx context.Context, name string, q []byte) ([]byte, error) {
			asked <- name
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, context.Canceled
		}
		if rmut != nil {
			rmut(c)
		}
	})
	return s, asked
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
// upstream never answers holds at most the flight bound's pods' pool less
// its reserve; past that it gets SERVFAIL at once (counted as a share
// reject), and another client's new question is still sent upstream.
func TestOneClientCannotHoldTheFlightBound(t *testing.T) {
	const max = 64
	sh := fair.New(max) // the node's pool 8; the pods' 56: reserve 14
	held := sh.Max() - sh.NodeMax() - sh.Reserve()
	s, asked := stuckServer(t, nil, func(c *resolve.Config) { c.MaxFlights = max })
	hog := udpFrom(t, s, "127.0.0.2")
	for i := range 60 {
		sendQ(t, hog, uint16(i), fmt.Sprintf("stuck%d.example.", i))
	}
	for range 60 - held {
		if _, rc := readRcode(t, hog); rc != dns.RcodeServerFailure {
			t.Fatalf("hog past its share: rcode %d, want SERVFAIL", rc)
		}
	}
	for deadline := time.Now().Add(3 * time.Second); len(asked) < held; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d upstream questions, want %d", len(asked), held)
		}
	}
	good := udpFrom(t, s, "127.0.0.3")
	sendQ(t, good, 1, "fresh.example.")
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		if len(asked) == held+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other client's question was not sent upstream (%d asked)", len(asked))
		}
	}
	if c := s.Snapshot(); c.ShareRejectsFlights != uint64(60-held) || c.Rejected != uint64(60-held) {
		t.Fatalf("share rejects %d rejected %d, want %d and %d", c.ShareRejectsFlights, c.Rejected, 60-held, 60-held)
	}
}

// TestOneClientCannotHoldTheWaitingBound: a client sending many queries
// for a few names the upstream never answers (one flight each, so the
// flight bound does not stop it) holds at most the waiting bound's pods'
// pool less its reserve; another client's miss is still admitted.
func TestOneClientCannotHoldTheWaitingBound(t *testing.T) {
	const max = 64
	sh := fair.New(max)
	held := sh.Max() - sh.NodeMax() - sh.Reserve()
	s, asked := stuckServer(t, func(c *Config) { c.MaxWaiting = max }, nil)
	hog := udpFrom(t, s, "127.0.0.2")
	for i := range 60 {
		sendQ(t, hog, uint16(i), fmt.Sprintf("stuck%d.example.", i%3))
	}
	for range 60 - held {
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
	if c := s.Snapshot(); c.ShareRejectsWaiting != uint64(60-held) {
		t.Fatalf("waiting share rejects %d, want %d", c.ShareRejectsWaiting, 60-held)
	}
}

// bigAnswer answers every question with ~60 KB of TXT records.
func bigAnswer(_ context.Context, _ string, query []byte) ([]byte, error) {
	m := new(dns.Msg)
	if err := m.Unpack(query); err != nil {
		return nil, err
	}
	r := new(dns.Msg)
	r.SetReply(m)
	txt := strings.Repeat("x", 250)
	for range 235 {
		r.Answer = append(r.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{txt}})
	}
	return r.Pack()
}

// TestTCPAnswersThatAreNotReadAreBounded: a client that pipelines misses
// with large answers on many connections and reads none holds at most the
// bound on answers being written (less the reserve): past it its answers
// are dropped and its connections closed, and another client still gets
// its large answer.
func TestTCPAnswersThatAreNotReadAreBounded(t *testing.T) {
	s, _ := startServer(t, func(c *Config) {
		c.TCPReadTimeout = 20 * time.Second // writes stay blocked
	}, func(c *resolve.Config) { c.Fetch = bigAnswer })
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	for i := range 24 {
		c, err := d.Dial("tcp", s.TCPAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.(*net.TCPConn).SetReadBuffer(4096) // read nothing, hold little in the kernel
		for j := range 32 {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("big%d-%d.example.", i, j), dns.TypeTXT)
			b, _ := m.Pack()
			if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
				break // closed for not reading
			}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); s.Snapshot().TCPAnswerDrops == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no answer dropped: 24 x 32 unread 60 KB answers are under the bound")
		}
	}
	s.tcpOutMu.Lock()
	held := s.tcpOut.Held(netip.MustParseAddr("127.0.0.2"))
	s.tcpOutMu.Unlock()
	if max := (MaxTCPAnswerBytes >> 10) * 7 / 8 * 3 / 4; held > max { // the pods' pool less its reserve
		t.Fatalf("the client holds %d KiB of answers, more than %d", held, max)
	}
	// Another client gets its large answer at once.
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("other.example.", dns.TypeTXT)
	b, _ := m.Pack()
	_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
	_ = c.SetReadDeadline(time.Now().Add(emulated(5 * time.Second)))
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		t.Fatalf("the other client's answer: %v", err)
	}
	resp := make([]byte, binary.BigEndian.Uint16(lb[:]))
	if _, err := io.ReadFull(c, resp); err != nil {
		t.Fatal(err)
	}
	var r dns.Msg
	if err := r.Unpack(resp); err != nil || len(r.Answer) < 200 {
		t.Fatalf("the other client's answer: %d records, %v", len(r.Answer), err)
	}
	t.Logf("dropped %d answers; the client held %d KiB", s.Snapshot().TCPAnswerDrops, held)
}
