package daemon

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// hugeRecords answers names starting with "huge" with TXT records of about
// 60 KB (a frame only TCP carries), everything else as records does.
func hugeRecords(r *dns.Msg) *dns.Msg {
	if !strings.HasPrefix(strings.ToLower(r.Question[0].Name), "huge") {
		return records(r)
	}
	m := new(dns.Msg)
	m.SetReply(r)
	chunk := strings.Repeat("x", 250)
	for i := 0; i < 200; i++ { // 59 KB uncompressed
		m.Answer = append(m.Answer, &dns.TXT{
			Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30},
			Txt: []string{chunk},
		})
	}
	return m
}

// A TCP client that sends queries and never reads its answers must not hold
// up anyone else's misses. Answers to misses are written by the goroutine
// that reads the upstream's answers (no goroutine waits for a miss): the
// write to a client whose buffers are full would block it, and every other
// answer from that upstream connection behind it (here kube-dns's, for the
// UDP clients' cluster names).
func TestTCPClientThatNeverReadsDoesNotBlockOthers(t *testing.T) {
	// One kube-dns connection, so the stuck client's answers and the
	// others' share it (with two, both carry some of each).
	e := startWith(t, hugeRecords, func(c *config.Config) { c.TCPPoolSize = 1 })
	// A small receive buffer from the start (the window is advertised
	// at the handshake).
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", e.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Pipelined queries for ~60 KB answers, never read: the server's writes
	// to this connection block once the socket buffers are full.
	const n = 300 // 18 MB of answers: more than any socket buffers hold
	var out []byte
	for i := 0; i < n; i++ {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("huge%d.default.svc.cluster.local.", i), dns.TypeTXT)
		m.SetEdns0(4096, false)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	// Wait until the server's writes to it block: it stops reading the
	// client's queries (every pipeline slot holds an answer it cannot
	// write), so kube-dns sees no more of them for a while.
	deadline := time.Now().Add(20 * time.Second)
	last, since := int64(-1), time.Now()
	for {
		n := e.kube.tcpN.Load()
		if n != last {
			last, since = n, time.Now()
		} else if n >= 32 && time.Since(since) > 300*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never stopped taking the stuck client's queries (%d)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Meanwhile cluster names over UDP, through the same kube-dns
	// connections, are answered at once (a blocked write would hold them
	// for the write timeout, -tcp-read-timeout, 2 s).
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("svc%d.default.svc.cluster.local.", i)
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Net: "udp", Timeout: time.Second}).Exchange(m, e.udp)
		if err != nil {
			t.Fatalf("%s while a TCP client does not read: %v", name, err)
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != wantA(name) {
			t.Fatalf("%s: %v", name, r.Answer)
		}
	}
}
