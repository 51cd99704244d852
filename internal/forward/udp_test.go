package forward

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A truncated UDP answer is asked again over TCP to the same server; the full answer is returned.
func TestUDPTruncatedRetriedOverTCP(t *testing.T) {
	var tcp *tcpServer
	var udp *udpServer
	for range 10 { // find a port free for both TCP and UDP
		tcp = startTCP(t, serveInOrder(0))
		pc, err := net.ListenPacket("udp", tcp.addr.String())
		if err != nil {
			continue
		}
		pc.Close()
		udp = startUDPOn(t, tcp.addr.String(), func(q []byte, reply func([]byte)) {
			m := new(dns.Msg)
			m.Unpack(q)
			r := new(dns.Msg)
			r.SetReply(m)
			r.Truncated = true
			b, _ := r.Pack()
			reply(b)
		})
		break
	}
	if udp == nil {
		t.Fatal("no port free for both TCP and UDP")
	}
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{udp.addr}, Proto: UDP}, rec)
	ans, err := g.Exchange(context.Background(), query(t, "big.example.com.", 31))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "big.example.com.", 31); err != nil {
		t.Fatal(err)
	}
	if u, c := udp.queries.Load(), tcp.queries.Load(); u != 1 || c != 1 {
		t.Errorf("UDP saw %d queries, TCP %d; want 1 and 1", u, c)
	}
}

// Garbage, other IDs and other questions arriving on the query's socket are counted and
// ignored; the real answer that follows is the one returned.
func TestUDPIgnoresSpoofedPackets(t *testing.T) {
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		reply([]byte{0xde, 0xad})    // garbage
		wrongID := answerFor(q)      //
		wrongID[0] ^= 0xFF           //
		reply(wrongID)               // another ID
		m := new(dns.Msg)            //
		m.Unpack(q)                  //
		m.Question[0].Name = "evil." //
		b, _ := m.Pack()             //
		reply(answerFor(b))          // our ID, another question
		reply(answerFor(q))          // the answer
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}}, rec)
	ans, err := g.Exchange(context.Background(), query(t, "victim.example.", 5))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "victim.example.", 5); err != nil {
		t.Fatal(err)
	}
	up := srv.addr.String()
	if m, mm := rec.failuresOf(up, KindMalformed), rec.failuresOf(up, KindMismatch); m != 1 || mm != 2 {
		t.Errorf("counted %d malformed and %d mismatched, want 1 and 2", m, mm)
	}
}

// A server that only ever sends wrong packets yields a timeout, never one of its packets.
func TestUDPOnlyGarbageTimesOut(t *testing.T) {
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		a := answerFor(q)
		a[1]++
		reply(a)
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, TryTimeout: 100 * time.Millisecond}, rec)
	ans, err := g.Exchange(context.Background(), query(t, "x.example.", 1))
	if err == nil {
		t.Fatalf("returned a mismatched answer: %x", ans)
	}
	up := srv.addr.String()
	if rec.failuresOf(up, KindMismatch) != 2 || rec.failuresOf(up, KindTimeout) != 2 {
		t.Errorf("mismatch %d, timeout %d; want 2 and 2", rec.failuresOf(up, KindMismatch), rec.failuresOf(up, KindTimeout))
	}
}

// ICMP port unreachable on the connected UDP socket is reported as "refused".
func TestUDPRefused(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{addr}}, rec)
	start := time.Now()
	if _, err := g.Exchange(context.Background(), query(t, "x.example.", 1)); err == nil {
		t.Fatal("answer from nowhere")
	}
	if rec.failuresOf(addr.String(), KindRefused) == 0 {
		t.Error("no refused failure")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("refusal took %v: not detected", d)
	}
}

// An answer larger than the size the query advertised (an upstream ignoring EDNS's payload
// size) fills the receive buffer: it is asked again over TCP, as if truncated.
func TestUDPOversizedRetriedOverTCP(t *testing.T) {
	var tcp *tcpServer
	var udp *udpServer
	for range 10 { // find a port free for both TCP and UDP
		tcp = startTCP(t, serveInOrder(0))
		pc, err := net.ListenPacket("udp", tcp.addr.String())
		if err != nil {
			continue
		}
		pc.Close()
		udp = startUDPOn(t, tcp.addr.String(), oversizedUDP) // about 2 KB, no TC bit
		break
	}
	if udp == nil {
		t.Fatal("no port free for both TCP and UDP")
	}
	m := new(dns.Msg)
	m.SetQuestion("big.example.com.", dns.TypeTXT)
	m.Id = 32
	m.SetEdns0(1232, false)
	q, _ := m.Pack()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{udp.addr}, Proto: UDP}, newRecorder())
	ans, err := g.Exchange(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "big.example.com.", 32); err != nil {
		t.Fatalf("not the TCP answer: %v", err)
	}
	if u, c := udp.queries.Load(), tcp.queries.Load(); u != 1 || c != 1 {
		t.Errorf("UDP saw %d queries, TCP %d; want 1 and 1", u, c)
	}
}

// A query advertising more than 1232 bytes (a larger -max-udp-size) gets its larger answer over
// UDP: the socket it opens has receive buffers of the advertised size + 1.
func TestUDPLargerAdvertisedSizeStaysOnUDP(t *testing.T) {
	udp := startUDP(t, oversizedUDP) // about 2 KB
	m := new(dns.Msg)
	m.SetQuestion("big.example.com.", dns.TypeTXT)
	m.Id = 33
	m.SetEdns0(4096, false)
	q, _ := m.Pack()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{udp.addr}, Proto: UDP}, newRecorder())
	ans, err := g.Exchange(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(ans); err != nil {
		t.Fatal(err)
	}
	if len(ans) < 2000 || r.Id != 33 || r.Truncated || len(r.Answer) != 1 {
		t.Fatalf("answer of %d bytes, ID %d, TC %v, %d records: want the whole 2 KB one", len(ans), r.Id, r.Truncated, len(r.Answer))
	}
	if n := udp.queries.Load(); n != 1 {
		t.Errorf("UDP saw %d queries, want 1", n)
	}
}
