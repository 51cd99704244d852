package server

import (
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// TestStuckPartialQueryMakesRoom: issue 37's TCP row. Clients that each
// hold one connection with one byte of a query on it fill the table; a
// newcomer is refused only while those have sat on their partial query
// less than tcpStuckAfter, then it takes the longest-stuck one's place.
func TestStuckPartialQueryMakesRoom(t *testing.T) {
	const max = 40
	pods := max - fair.New(max).NodeMax()
	s, _ := startServer(t, func(c *Config) {
		c.MaxTCPConns = max
		c.TCPReadTimeout = 20 * time.Second // the partial queries stay
	})
	var stuck []net.Conn
	for i := range pods {
		c := tcpFrom(t, s, fmt.Sprintf("127.0.3.%d", i+1))
		if _, err := c.Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
		stuck = append(stuck, c)
	}
	waitTCPConns(t, s, int64(pods))
	time.Sleep(50 * time.Millisecond) // their bytes read: every one busy on a partial query
	early := tcpFrom(t, s, "127.0.4.1")
	_ = early.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := early.Read(make([]byte, 1)); err == nil {
		t.Fatal("a newcomer got in before the partial queries were stuck")
	}
	if c := s.Snapshot(); c.TCPRefused != 1 || c.TCPEvicted != 0 {
		t.Fatalf("refused %d evicted %d, want 1 and 0", c.TCPRefused, c.TCPEvicted)
	}
	time.Sleep(tcpStuckAfter)
	late := tcpFrom(t, s, "127.0.4.2")
	if !askOn(late, "late.example.") {
		t.Fatal("the newcomer after tcpStuckAfter got no answer")
	}
	if c := s.Snapshot(); c.TCPEvicted != 1 {
		t.Fatalf("evicted %d, want 1", c.TCPEvicted)
	}
	closed := 0
	for _, c := range stuck {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("%d stuck connections closed, want the longest-stuck one", closed)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// askOn asks name on c and reports whether an answer came.
func askOn(c net.Conn, name string) bool {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, _ := m.Pack()
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	var lb [2]byte
	if _, err := c.Read(lb[:]); err != nil {
		return false
	}
	return true
}

// TestUnreadTCPAnswersHaveNoGoroutineEach: issue 37's unread-TCP row. A
// client pipelining misses on a few connections and reading none leaves
// its answers queued on their connections, with one writer each, not a
// goroutine per answer; what they hold is counted against the bound on
// TCP answers and given back when the connections go.
func TestUnreadTCPAnswersHaveNoGoroutineEach(t *testing.T) {
	s, _ := startServer(t, func(c *Config) {
		c.TCPReadTimeout = 20 * time.Second // writes stay blocked
	}, func(c *resolve.Config) { c.Fetch = bigAnswer })
	base := runtime.NumGoroutine()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var conns []net.Conn
	for i := range 4 {
		c, err := d.Dial("tcp", s.TCPAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		for j := range 32 {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("unread%d-%d.example.", i, j), dns.TypeTXT)
			b, _ := m.Pack()
			_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
		}
	}
	queued := func() int {
		s.tcpOutMu.Lock()
		defer s.tcpOutMu.Unlock()
		return s.tcpOut.Used()
	}
	// 128 answers of ~60 KB: most wait in the queues (the kernel takes a
	// little of each connection's).
	for deadline := time.Now().Add(10 * time.Second); queued() < 1000; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d KiB of answers queued", queued())
		}
	}
	// The misses were resolved on miss workers (the test's upstream is a
	// blocking fetch); they are gone once idle for missWorkerIdle.
	time.Sleep(missWorkerIdle + 500*time.Millisecond)
	if n := runtime.NumGoroutine() - base; n > 4*2+4 {
		t.Fatalf("%d more goroutines for 4 connections with 128 answers pending, want a reader and a writer each", n)
	}
	t.Logf("%d KiB of answers queued, %d goroutines more", queued(), runtime.NumGoroutine()-base)
	closeAll(conns)
	for deadline := time.Now().Add(25 * time.Second); queued() != 0 || s.Snapshot().TCPConns != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d KiB still counted, %d connections, after the client left", queued(), s.Snapshot().TCPConns)
		}
	}
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// TestNodeSocketsShareTheNodesPool: with the node's addresses mapped
// (Config.Clients), every loopback socket is the node, keyed by its port:
// one socket flooding never-answered names holds at most three quarters
// of the node's pool of the flight bound, and another socket of the node
// still gets its question upstream.
func TestNodeSocketsShareTheNodesPool(t *testing.T) {
	const max = 64
	node := fair.New(max).NodeMax() // 8: reserve 2
	s, asked := stuckServer(t, func(c *Config) { c.Clients = fair.NewClients(nil) }, func(c *resolve.Config) { c.MaxFlights = max })
	flood := udpFrom(t, s, "127.0.0.2")
	for i := range 20 {
		sendQ(t, flood, uint16(i), fmt.Sprintf("flood%d.example.", i))
	}
	held := node - node/4
	for range 20 - held {
		if _, rc := readRcode(t, flood); rc != dns.RcodeServerFailure {
			t.Fatalf("the flooding socket past its share: rcode %d", rc)
		}
	}
	other := udpFrom(t, s, "127.0.0.3")
	sendQ(t, other, 1, "other.example.")
	for deadline := time.Now().Add(3 * time.Second); len(asked) < held+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d asked upstream, want %d and the other socket's", len(asked), held)
		}
	}
	if c := s.Snapshot(); c.ShareRejectsFlights != uint64(20-held) {
		t.Fatalf("share rejects %d, want %d", c.ShareRejectsFlights, 20-held)
	}
}
