package forward

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Hostile upstreams (issue 18): each test reproduces an outage the daemon had, on real loopback
// sockets, with the upstream's misbehaviour written here.

// A kube-dns that sends one lying length prefix (65,535 bytes announced, 3 sent) on its first
// connection and then nothing on it, while new connections are answered. The connection that
// delivered no frame for a whole try is closed and the query's second try dials a fresh one:
// cluster DNS is back within one try timeout, and stays back.
func TestTCPLyingLengthPrefixRecovers(t *testing.T) {
	const try = 300 * time.Millisecond
	var lies atomic.Int32
	srv := startTCP(t, func(s *tcpServer, c net.Conn, conn int) {
		if conn == 0 {
			if _, err := s.read(c); err != nil {
				return
			}
			c.Write([]byte{0xFF, 0xFF, 1, 2, 3})
			lies.Add(1)
			for {
				if _, err := s.read(c); err != nil { // swallow whatever comes next
					return
				}
			}
		}
		serveWith(answerFor)(s, c, conn)
	})
	rec := newRecorder()
	clk := newFake()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, TryTimeout: try, Clock: clk}, rec)
	type result struct {
		ans []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		ans, err := g.Exchange(context.Background(), query(t, "first.cluster.local.", 1))
		done <- result{ans, err}
	}()
	waitFor(t, 5*time.Second, "the lie", func() bool { return lies.Load() == 1 })
	advanceWhen(t, clk, 1, try) // one try timeout: the only time the clock moves
	r := <-done
	if r.err != nil {
		t.Fatalf("first query after the lie: %v", r.err)
	}
	if err := checkTXT(r.ans, "first.cluster.local.", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprintf("n%d.cluster.local.", i)
		ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
		if err != nil {
			t.Fatalf("query %d after recovery: %v", i, err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	if rec.hasHealth(srv.addr.String() + " down") {
		t.Errorf("marked down: %v", rec.healthEvents())
	}
}

// A health probe of a down TCP upstream uses a connection of its own: a pooled connection that
// stopped delivering frames cannot keep the upstream down.
func TestTCPProbeUsesFreshConnection(t *testing.T) {
	var conns atomic.Int32
	srv := startTCP(t, func(s *tcpServer, c net.Conn, conn int) {
		conns.Add(1)
		serveWith(answerFor)(s, c, conn)
	})
	rec := newRecorder()
	clk := newFake()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, Clock: clk}, rec)
	if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
		t.Fatal(err)
	}
	before := conns.Load()
	u := g.ups[0]
	u.down.Store(true)
	g.startProbe(u)
	advanceWhen(t, clk, 1, probeInterval)
	waitFor(t, 5*time.Second, "probe to mark the upstream up", func() bool { return !u.down.Load() })
	if conns.Load() == before {
		t.Errorf("probe went through a pooled connection (%d connections before and after)", before)
	}
}

// Three names the upstream never answers, asked again and again, must not make other names
// fail: their timeouts do not count towards "down" while the upstream answers other queries.
// The group's clock moves only to time the silent names out (all three at once, as when they
// are asked together every 2 s), so other names never time out on a loaded machine.
func TestSilentNamesDoNotFailOthers(t *testing.T) {
	const try = 100 * time.Millisecond
	var silentSeen atomic.Int32
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		if strings.Contains(strings.ToLower(string(q)), "silent") {
			silentSeen.Add(1)
			return
		}
		reply(answerFor(q))
	})
	rec := newRecorder()
	clk := newFake()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP, TryTimeout: try, Clock: clk}, rec)

	stop := make(chan struct{})
	var asked, answered, failed atomic.Int32
	var firstErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("other%d.example.", i)
			asked.Add(1)
			ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
			if err == nil {
				err = checkTXT(ans, name, uint16(i))
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			} else {
				answered.Add(1)
			}
		}
	}()
	for round := range 5 {
		var silent sync.WaitGroup
		for n := range 3 {
			silent.Add(1)
			go func() {
				defer silent.Done()
				g.Exchange(context.Background(), query(t, fmt.Sprintf("silent%d.example.", n), uint16(round)))
			}()
		}
		for pass := range maxPasses {
			seen := int32(3 * (maxPasses*round + pass + 1))
			waitFor(t, 5*time.Second, "silent queries at the upstream", func() bool { return silentSeen.Load() == seen })
			others := answered.Load()
			waitFor(t, 5*time.Second, "other names answered meanwhile", func() bool { return answered.Load() > others })
			advanceWhen(t, clk, 3, try)
		}
		silent.Wait()
	}
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d other names failed (first: %v); health %v", n, asked.Load(), firstErr.Load(), rec.healthEvents())
	}
	if rec.hasHealth(srv.addr.String() + " down") {
		t.Errorf("marked down: %v", rec.healthEvents())
	}
}

// When every server is marked down, a query is still tried on one of them instead of failing
// with nothing sent.
func TestAllDownStillTriesOne(t *testing.T) {
	srv := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP}, rec)
	g.ups[0].down.Store(true) // as if marked down just before; no probe running
	ans, err := g.Exchange(context.Background(), query(t, "x.example.", 7))
	if err != nil {
		t.Fatalf("all down: %v", err)
	}
	if err := checkTXT(ans, "x.example.", 7); err != nil {
		t.Fatal(err)
	}
	if g.ups[0].down.Load() {
		t.Error("an upstream that answered is still marked down")
	}
}

// heapObjects reads the bytes of heap objects, live or not yet swept: what a query in flight
// holds shows here before any GC could hide it.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// udpInflightHeapBound is the heap that 1000 UDP misses waiting on a silent resolver may hold,
// peak: 5 KiB per miss (measured: about 1.7 KiB, the query, its waiter, its timer, the caller's
// context and goroutine; the shared sockets' receive buffers are per socket, not per try; the
// rest is room for the test's own garbage). With a 1233-byte buffer per try it was 2.7 KiB,
// with a 64 KiB buffer per try 64 MiB in all.
const udpInflightHeapBound = 5 << 20

// 1000 misses in flight to a UDP resolver that never answers stay under udpInflightHeapBound of
// heap, measured as the peak while they all wait (sampled, not after a GC).
func TestUDPInflightHeapBound(t *testing.T) {
	const n = 1000
	srv := startUDP(t, func([]byte, func([]byte)) {})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP, TryTimeout: time.Minute, MaxInflight: n}, rec)
	q := new(dns.Msg)
	q.SetQuestion("silent.example.", dns.TypeA)
	q.SetEdns0(1232, false)
	raw, _ := q.Pack()

	runtime.GC()
	base := heapObjects()
	var peak atomic.Uint64
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			peak.Store(max(peak.Load(), heapObjects()))
			select {
			case <-sampling:
				return
			case <-tick.C:
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// In batches small enough for the resolver's socket buffer: a dropped query would never
	// show at the resolver.
	const batch = 50
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Exchange(ctx, raw)
		}()
		if (i+1)%batch == 0 {
			waitFor(t, 30*time.Second, "a batch of queries at the resolver", func() bool { return srv.queries.Load() == int32(i+1) })
		}
	}
	for range 20 { // sample while every query waits
		peak.Store(max(peak.Load(), heapObjects()))
		time.Sleep(time.Millisecond)
	}
	close(sampling)
	<-sampled
	cancel()
	wg.Wait()
	held := int64(peak.Load()) - int64(base)
	t.Logf("%d UDP misses in flight: peak heap +%.1f MiB (%.0f B each), bound %d MiB", n, float64(held)/(1<<20), float64(held)/n, udpInflightHeapBound>>20)
	if held > udpInflightHeapBound {
		t.Errorf("peak heap +%d bytes with %d misses in flight, bound %d", held, n, udpInflightHeapBound)
	}
}

// loopAnswer answers q with a CNAME whose target is a compression pointer to itself.
func loopAnswer(q []byte) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q); err != nil || len(m.Question) != 1 {
		return nil
	}
	r := new(dns.Msg)
	r.SetReply(m)
	b, _ := r.Pack()
	binary.BigEndian.PutUint16(b[6:], 1) // ANCOUNT
	rd := len(b) + 12
	return append(b, 0xC0, 12, 0, 5, 0, 1, 0, 0, 0, 30, 0, 2, 0xC0|byte(rd>>8), byte(rd))
}

// An answer whose names loop or point outside the message is not relayed (nor cached by the
// caller): the try fails as malformed, counted, and the next server is asked.
func TestInvalidAnswerNotRelayed(t *testing.T) {
	for _, proto := range []Proto{UDP, TCP} {
		t.Run(proto.String(), func(t *testing.T) {
			var bad, good netip.AddrPort
			if proto == UDP {
				bad = startUDP(t, func(q []byte, reply func([]byte)) { reply(loopAnswer(q)) }).addr
				good = startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) }).addr
			} else {
				bad = startTCP(t, serveWith(loopAnswer)).addr
				good = startTCP(t, serveWith(answerFor)).addr
			}
			rec := newRecorder()
			g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{bad}, Proto: proto, TryTimeout: 200 * time.Millisecond}, rec)
			_, err := g.Exchange(context.Background(), query(t, "loop.example.", 3))
			if !errors.Is(err, ErrNoAnswer) {
				t.Fatalf("pointer loop relayed: err %v", err)
			}
			if rec.failuresOf(bad.String(), KindMalformed) == 0 {
				t.Error("not counted as malformed")
			}
			g2 := newGroup(t, GroupConfig{Servers: []netip.AddrPort{bad, good}, Proto: proto}, rec)
			ans, err := g2.Exchange(context.Background(), query(t, "loop.example.", 4))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkTXT(ans, "loop.example.", 4); err != nil {
				t.Fatal(err)
			}
		})
	}
}
