// Package check tests bench/limit/limit.c, the canned-answer C responder:
// it builds it with gcc and asks it over real UDP and TCP on loopback.
package check

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// freePort is a port of 127.0.0.1 free for UDP and for TCP (the responder
// binds both: a port free for UDP alone may be some connection's TCP port,
// and the responder then exits with "tcp listen: Address already in use").
func freePort(t *testing.T) int {
	t.Helper()
	for range 50 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		_ = pc.Close()
		if err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatal("no port of 127.0.0.1 free for both UDP and TCP")
	return 0
}

// startLimit builds and starts the responder on a free loopback port.
func startLimit(t *testing.T) *net.UDPConn {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	bin := filepath.Join(t.TempDir(), "limit")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", bin, "../limit.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	port := freePort(t)
	cmd := exec.Command(bin, "127.0.0.1", strconv.Itoa(port))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Ready once it answers (it binds right after start).
	q := query(t, 1, "ready.example.", true)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := exchange(t, c, q, 100*time.Millisecond); ok {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("limit does not answer")
		}
	}
}

func query(t *testing.T, id uint16, name string, edns bool) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.EnableCompression()
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	if edns {
		_ = b.StartAdditionals()
		var h dnsmessage.ResourceHeader
		_ = h.SetEDNS0(1232, dnsmessage.RCodeSuccess, false)
		if err := b.OPTResource(h, dnsmessage.OPTResource{}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// exchange sends p and waits up to wait for one answer.
func exchange(t *testing.T, c *net.UDPConn, p []byte, wait time.Duration) ([]byte, bool) {
	t.Helper()
	if _, err := c.Write(p); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return nil, false
	}
	return buf[:n], true
}

func TestCannedAnswer(t *testing.T) {
	c := startLimit(t)
	for i, name := range []string{"a.example.", "www.site-7.example.com.", "u1.default.svc.cluster.local."} {
		for _, edns := range []bool{false, true} {
			id := uint16(1000 + i)
			b, ok := exchange(t, c, query(t, id, name, edns), 5*time.Second)
			if !ok {
				t.Fatalf("%s: no answer", name)
			}
			var m dnsmessage.Message
			if err := m.Unpack(b); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if m.ID != id || !m.Response || !m.RecursionDesired || !m.RecursionAvailable || m.RCode != dnsmessage.RCodeSuccess {
				t.Errorf("%s: header %+v", name, m.Header)
			}
			if len(m.Questions) != 1 || m.Questions[0].Name.String() != name || m.Questions[0].Type != dnsmessage.TypeA {
				t.Errorf("%s: question %+v", name, m.Questions)
			}
			if len(m.Answers) != 1 || len(m.Additionals) != 0 {
				t.Fatalf("%s: %d answers, %d additionals", name, len(m.Answers), len(m.Additionals))
			}
			a, okA := m.Answers[0].Body.(*dnsmessage.AResource)
			if h := m.Answers[0].Header; !okA || h.Name.String() != name || h.TTL != 30 || a.A != [4]byte{192, 0, 2, 1} {
				t.Errorf("%s: answer %+v %+v", name, h, m.Answers[0].Body)
			}
		}
	}
}

func TestMalformedQueries(t *testing.T) {
	c := startLimit(t)
	// Too short for a header, or an answer: dropped. The next good query
	// still gets its own answer (not a late one for the bad packet).
	for _, p := range [][]byte{{1, 2, 3}, func() []byte { q := query(t, 7, "x.example.", false); q[2] |= 0x80; return q }()} {
		if b, ok := exchange(t, c, p, 200*time.Millisecond); ok {
			t.Errorf("answer %x to %x", b, p)
		}
	}
	// Two questions, or a name running past the end: FORMERR, header only.
	two := query(t, 9, "x.example.", false)
	two[5] = 2
	cut := query(t, 10, "long-name.example.", false)[:20]
	for _, p := range [][]byte{two, cut} {
		b, ok := exchange(t, c, p, 5*time.Second)
		if !ok {
			t.Fatalf("no FORMERR for %x", p)
		}
		var h dnsmessage.Parser
		hdr, err := h.Start(b)
		if err != nil || hdr.RCode != dnsmessage.RCodeFormatError || len(b) != 12 || hdr.ID != uint16(p[0])<<8|uint16(p[1]) {
			t.Errorf("answer %x to %x: %+v %v", b, p, hdr, err)
		}
	}
}

// tcpMessages frames each message with its two-byte length.
func tcpMessages(ms ...[]byte) []byte {
	var b []byte
	for _, m := range ms {
		b = append(b, byte(len(m)>>8), byte(len(m)))
		b = append(b, m...)
	}
	return b
}

// readTCPAnswer reads one length-prefixed answer.
func readTCPAnswer(t *testing.T, c net.Conn) dnsmessage.Message {
	t.Helper()
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, int(lb[0])<<8|int(lb[1]))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatal(err)
	}
	return m
}

// Over TCP the answers to pipelined queries come back in order, whatever
// way the stream is cut: many queries in one write, one query across two
// writes, more answers than one connection buffer holds with the client not
// reading until it has sent everything. A dropped query (an answer) gets
// nothing and a zero length ends the connection.
func TestTCP(t *testing.T) {
	addr := startLimit(t).RemoteAddr().String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	check := func(m dnsmessage.Message, id uint16, name string) {
		t.Helper()
		if m.ID != id || !m.Response || m.RCode != dnsmessage.RCodeSuccess || len(m.Questions) != 1 || m.Questions[0].Name.String() != name || len(m.Answers) != 1 {
			t.Fatalf("answer %+v, want id %d for %s", m, id, name)
		}
	}

	// One query in two writes, then 50 in one write with an answer (dropped)
	// among them.
	q := tcpMessages(query(t, 1, "split.example.", true))
	if _, err := c.Write(q[:7]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Write(q[7:]); err != nil {
		t.Fatal(err)
	}
	check(readTCPAnswer(t, c), 1, "split.example.")
	var batch [][]byte
	for i := range 50 {
		m := query(t, uint16(100+i), fmt.Sprintf("q%d.example.", i), i%2 == 0)
		if i == 10 {
			m[2] |= 0x80
		}
		batch = append(batch, m)
	}
	if _, err := c.Write(tcpMessages(batch...)); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if i != 10 {
			check(readTCPAnswer(t, c), uint16(100+i), fmt.Sprintf("q%d.example.", i))
		}
	}

	// 200,000 queries sent before reading any: about 9 MiB of answers, more
	// than the socket buffers hold, so the responder's writes fall short.
	const n = 200000
	batch = batch[:0]
	for i := range n {
		batch = append(batch, query(t, uint16(i), fmt.Sprintf("n%d.example.", i%1000), false))
	}
	sent := make(chan error, 1)
	go func() { _, err := c.Write(tcpMessages(batch...)); sent <- err }()
	time.Sleep(300 * time.Millisecond) // the socket buffers fill: short writes
	for i := range n {
		check(readTCPAnswer(t, c), uint16(i), fmt.Sprintf("n%d.example.", i%1000))
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}

	// A zero length: the connection is closed.
	if _, err := c.Write([]byte{0, 0}); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes after a zero-length message", n)
	}
}
