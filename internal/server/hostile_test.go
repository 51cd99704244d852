package server

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/miekg/dns"
)

// TestReflectorSourcePortsDropped: a query from a UDP port whose service
// answers anything (echo, daytime, qotd, chargen, time) is dropped and
// counted, so a spoofed source cannot start a packet loop between us and
// a reflector. Real sockets bound to those ports (the test runs as root;
// port 0 cannot be bound, so it is checked on the parsing path below).
func TestReflectorSourcePortsDropped(t *testing.T) {
	s, z := startServer(t, nil)
	m := new(dns.Msg)
	m.SetQuestion("reflect.example.", dns.TypeA)
	q, _ := m.Pack()
	ports := []int{7, 13, 17, 19, 37}
	for _, p := range ports {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p})
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EADDRINUSE) {
			t.Skipf("cannot bind port %d: %v", p, err)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.WriteToUDPAddrPort(q, s.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	// A query from an ordinary port after them is answered; by then the
	// reflector ones have been read (one socket, read in order).
	c, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(q)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 512)); err != nil {
		t.Fatalf("ordinary client: %v", err)
	}
	snap := s.Snapshot()
	if snap.ReflectorDrops != uint64(len(ports)) || snap.Dropped != uint64(len(ports)) {
		t.Fatalf("reflector drops %d, dropped %d; want %d", snap.ReflectorDrops, snap.Dropped, len(ports))
	}
	if n := z.n.Load(); n != 1 {
		t.Fatalf("%d upstream queries, want 1 (the ordinary client's)", n)
	}
	if snap.CacheMisses != 1 {
		t.Fatalf("%d misses counted, want 1", snap.CacheMisses)
	}
}

func TestReflectorPort(t *testing.T) {
	sa := func(port uint16) []byte {
		b := make([]byte, 16)
		binary.NativeEndian.PutUint16(b, afInet)
		binary.BigEndian.PutUint16(b[2:], port)
		return b
	}
	for port, want := range map[uint16]bool{0: true, 7: true, 13: true, 17: true, 19: true, 37: true,
		53: false, 1: false, 36: false, 38: false, 1024: false, 0x0700: false, 65535: false} {
		if got := reflectorPort(sa(port)); got != want {
			t.Errorf("port %d: %v, want %v", port, got, want)
		}
	}
	if reflectorPort(nil) {
		t.Error("an empty sockaddr is a reflector")
	}
}

// TestTCPBufferGrowsWithData: clients that announce the longest query we
// take (MaxTCPQuery) and send only a few bytes of it cost what they sent,
// not the announced length; a client announcing more is closed before
// anything is buffered, and counted.
func TestTCPBufferGrowsWithData(t *testing.T) {
	const clients = 300
	s, _ := startServer(t, func(c *Config) {
		c.MaxTCPConns = 1000
		c.TCPReadTimeout = 30 * time.Second
		c.TCPIdleTimeout = 30 * time.Second
	})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < clients; i++ {
		// One source address per 30 clients: ten clients, each within
		// its share of the connection bound.
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3, byte(1+i/30))}}
		c, err := d.Dial("tcp", s.TCPAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte{MaxTCPQuery >> 8, MaxTCPQuery & 0xFF, 0, 1, 2, 3}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); s.Snapshot().TCPConns < clients; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections open", s.Snapshot().TCPConns, clients)
		}
	}
	// Every connection reads its length and its bytes and waits for the
	// rest: poll until the heap has stopped growing for three looks.
	var after runtime.MemStats
	prev, still := uint64(0), 0
	for deadline := time.Now().Add(5 * time.Second); still < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if after.HeapAlloc <= prev+1<<10 {
			still++
		} else {
			still = 0
		}
		prev = after.HeapAlloc
	}
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	per := grown / clients
	// A connection holds its bufio reader (4 KiB), its pending-answer
	// buffer (4 KiB), a 512-byte message buffer and the net.Conn and
	// goroutine bookkeeping.
	const budget = 16 << 10
	t.Logf("heap +%d KiB for %d clients: %d bytes each", grown>>10, clients, per)
	if per > budget {
		t.Fatalf("%d bytes per client announcing %d bytes, want under %d", per, MaxTCPQuery, budget)
	}

	// Announcing more than MaxTCPQuery closes the connection at once.
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0xFF, 0xFF, 0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a 65,535-byte query: %v, want the connection closed", err)
	}
	if n := s.Snapshot().TCPOversized; n != 1 {
		t.Fatalf("oversized %d, want 1", n)
	}
}

// TestReadMsgInPieces: a message that arrives a byte at a time is read
// whole, whatever its length, and the buffer is reused.
func TestReadMsgInPieces(t *testing.T) {
	for _, n := range []int{0, 1, 511, 512, 513, MaxTCPQuery} {
		msg := make([]byte, 2+n)
		binary.BigEndian.PutUint16(msg, uint16(n))
		for i := range n {
			msg[2+i] = byte(i)
		}
		r := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(append(msg, msg...))), 16)
		var buf []byte
		for k := 0; k < 2; k++ {
			var err error
			if buf, err = readMsg(r, buf); err != nil || !bytes.Equal(buf, msg[2:]) {
				t.Fatalf("len %d, read %d: %d bytes, %v", n, k, len(buf), err)
			}
		}
	}
	// Longer than MaxTCPQuery: refused before its bytes are read.
	for _, n := range []int{MaxTCPQuery + 1, 65535} {
		r := bufio.NewReader(bytes.NewReader(binary.BigEndian.AppendUint16(nil, uint16(n))))
		if _, err := readMsg(r, nil); !errors.Is(err, errOversized) {
			t.Fatalf("len %d: %v, want errOversized", n, err)
		}
	}
	// A message cut short is an error.
	r := bufio.NewReader(bytes.NewReader([]byte{0, 10, 1, 2, 3}))
	if _, err := readMsg(r, nil); err == nil {
		t.Fatal("short message read without error")
	}
}
