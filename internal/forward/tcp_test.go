package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/miekg/dns"
)

// exchangeMany sends n distinct queries concurrently and checks every answer against its qname.
func exchangeMany(t *testing.T, g *Group, n int, name func(i int) string, check func(ans []byte, name string, id uint16) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint16(i)
			ans, err := g.Exchange(ctx, query(t, name(i), id))
			if err == nil {
				err = check(ans, name(i), id)
			}
			if err != nil {
				errs <- fmt.Errorf("query %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// 500 concurrent distinct queries travel over no more than PoolSize connections, each answer
// comes back to its own query, and both connections are used.
func TestTCPPoolManyQueriesFewConns(t *testing.T) {
	srv := startTCP(t, servePipelined)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 2}, rec)
	exchangeMany(t, g, 500, func(i int) string { return fmt.Sprintf("q%d.svc.cluster.local.", i) }, checkTXT)
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("server accepted %d connections, want PoolSize 2", n)
	}
	if maxOpen, opened := rec.connStats(); maxOpen > 2 || opened != 2 {
		t.Errorf("observer: %d connections open at most, %d opened; want 2, 2", maxOpen, opened)
	}
	if got := srv.queries.Load(); got != 500 {
		t.Errorf("server saw %d queries, want 500", got)
	}
	if rec.inflightNow() != 0 {
		t.Errorf("in-flight gauge %d after all returned", rec.inflightNow())
	}
}

// Two queries are outstanding on one connection at once (the server reads both before answering)
// and are answered in reverse order.
func TestTCPPipelinedOnOneConn(t *testing.T) {
	srv := startTCP(t, func(s *tcpServer, c net.Conn, _ int) {
		for {
			q1, err := s.read(c)
			if err != nil {
				return
			}
			q2, err := s.read(c)
			if err != nil {
				return
			}
			writeFrame(c, answerFor(q2))
			writeFrame(c, answerFor(q1))
		}
	})
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1}, nil)
	exchangeMany(t, g, 2, func(i int) string { return fmt.Sprintf("p%d.example.", i) }, checkTXT)
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("accepted %d connections, want 1", n)
	}
}

// Against a miekg/dns server (one query at a time per connection, as CoreDNS), concurrent
// queries are spread over the pool and complete in about one answer's time, not four.
func TestTCPSpreadsOverInOrderUpstream(t *testing.T) {
	const delay = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	remotes := map[string]bool{}
	srv := &dns.Server{Listener: ln, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		mu.Lock()
		remotes[w.RemoteAddr().String()] = true
		mu.Unlock()
		time.Sleep(delay)
		q, _ := r.Pack()
		w.Write(answerFor(q))
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })

	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{ln.Addr().(*net.TCPAddr).AddrPort()}, Proto: TCP, PoolSize: 4}, nil)
	start := time.Now()
	exchangeMany(t, g, 4, func(i int) string { return fmt.Sprintf("s%d.example.", i) }, checkTXT)
	if d := time.Since(start); d > 3*delay {
		t.Errorf("4 queries took %v against an in-order upstream with a %v answer time: not spread", d, delay)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(remotes) != 4 {
		t.Errorf("queries arrived on %d connections, want 4", len(remotes))
	}
}

// A connection the peer closes before answering is retried once, transparently, on another.
func TestTCPRetryOnPeerClose(t *testing.T) {
	srv := startTCP(t, func(s *tcpServer, c net.Conn, conn int) {
		if conn == 0 {
			s.read(c) // read the query, then close without answering
			return
		}
		servePipelined(s, c, conn)
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP}, rec)
	ans, err := g.Exchange(context.Background(), query(t, "retry.example.", 5))
	if err != nil {
		t.Fatalf("Exchange: %v", err)
	}
	if err := checkTXT(ans, "retry.example.", 5); err != nil {
		t.Fatal(err)
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("accepted %d connections, want 2 (original and retry)", n)
	}
	if n := rec.failuresOf("", KindClosed); n != 1 {
		t.Errorf("closed failures %d, want 1", n)
	}
	if n := rec.exchangesAt(srv.addr.String()); n != 1 {
		t.Errorf("answers reported %d, want 1", n)
	}
}

// An idle connection is closed after IdleTimeout, and the next query dials again.
func TestTCPIdleExpiry(t *testing.T) {
	closed := make(chan int, 4)
	srv := startTCP(t, func(s *tcpServer, c net.Conn, conn int) {
		serveInOrder(0)(s, c, conn)
		closed <- conn
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, IdleTimeout: 100 * time.Millisecond}, rec)
	if _, err := g.Exchange(context.Background(), query(t, "idle.example.", 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-closed:
		if n != 0 {
			t.Fatalf("connection %d closed", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("idle connection not closed")
	}
	waitFor(t, time.Second, "conns gauge back to 0", func() bool { return rec.openConns() == 0 })
	ans, err := g.Exchange(context.Background(), query(t, "idle2.example.", 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "idle2.example.", 2); err != nil {
		t.Fatal(err)
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("accepted %d, want 2", n)
	}
}

// After MaxQueriesPerConn queries a connection is drained and replaced.
func TestTCPRecycleAfterMaxQueries(t *testing.T) {
	srv := startTCP(t, servePipelined)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1, MaxQueriesPerConn: 3}, rec)
	for i := range 10 {
		name := fmt.Sprintf("r%d.example.", i)
		ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
	}
	if n := srv.accepted.Load(); n != 4 {
		t.Errorf("accepted %d connections for 10 queries at 3 per connection, want 4", n)
	}
	if maxOpen, _ := rec.connStats(); maxOpen != 1 {
		t.Errorf("%d connections open at once, want 1", maxOpen)
	}
	if n := rec.failuresOf("", KindClosed); n != 0 {
		t.Errorf("recycling caused %d closed failures", n)
	}
}

// A slow upstream makes the try time out (on the group's clock); the error comes back, and the
// late answers arriving afterwards are dropped without disturbing the connection.
func TestTCPSlowUpstreamTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := startTCP(t, func(s *tcpServer, c net.Conn, _ int) {
		for {
			q, err := s.read(c)
			if err != nil {
				return
			}
			<-release
			if writeFrame(c, answerFor(q)) != nil {
				return
			}
		}
	})
	rec := newRecorder()
	clk := newFake()
	const try = 100 * time.Millisecond
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1, TryTimeout: try, Clock: clk}, rec)
	errc := make(chan error, 1)
	go func() {
		_, err := g.Exchange(context.Background(), query(t, "slow.example.", 1))
		errc <- err
	}()
	for pass := range 2 {
		waitFor(t, 5*time.Second, "query at the upstream", func() bool { return srv.queries.Load() == int32(pass+1) })
		advanceWhen(t, clk, 1, try)
	}
	err := <-errc
	if !errors.Is(err, ErrNoAnswer) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exchange error %v, want ErrNoAnswer wrapping a deadline", err)
	}
	if n := rec.failuresOf(srv.addr.String(), KindTimeout); n != 2 {
		t.Errorf("timeouts %d, want 2 (two passes)", n)
	}
	// The upstream read both queries on the connection before the tries ended, but it
	// answers none: the connection read no frame for a whole try, so it was closed.
	pool := g.ups[0].tcp
	waitFor(t, 5*time.Second, "the stalled connection to close", func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return len(pool.conns) == 0
	})
	close(release)
	if n := rec.failuresOf("", KindMismatch); n != 0 {
		t.Errorf("late answers counted as %d mismatches", n)
	}
}

// A try that times out on a connection that answers other queries meanwhile keeps the
// connection: only one that delivered nothing for a whole try is closed. The late answer is
// dropped as late (a tombstone), not counted as a mismatch.
func TestTCPLateAnswerKeepsLiveConnection(t *testing.T) {
	release := make(chan struct{})
	srv := startTCP(t, holdingTCP("slow", release))
	rec := newRecorder()
	clk := newFake()
	const try = 100 * time.Millisecond
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1, TryTimeout: try, Clock: clk}, rec)
	errc := make(chan error, 1)
	go func() {
		_, err := g.Exchange(context.Background(), query(t, "slow.example.", 1))
		errc <- err
	}()
	waitFor(t, 5*time.Second, "slow query at the upstream", func() bool { return srv.queries.Load() == 1 })
	if _, err := g.Exchange(context.Background(), query(t, "fast.example.", 2)); err != nil {
		t.Fatal(err)
	}
	advanceWhen(t, clk, 1, try) // first pass of the slow query
	waitFor(t, 5*time.Second, "second try of the slow query", func() bool { return srv.queries.Load() == 3 })
	if _, err := g.Exchange(context.Background(), query(t, "fast2.example.", 4)); err != nil {
		t.Fatal(err)
	}
	advanceWhen(t, clk, 1, try)
	if err := <-errc; !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("slow query: %v", err)
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want the one (it answered the fast query)", n)
	}
	close(release)
	pool := g.ups[0].tcp
	waitFor(t, 5*time.Second, "both late answers read", func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return len(pool.conns) == 1 && len(pool.conns[0].pending) == 0
	})
	if n := rec.failuresOf("", KindMismatch); n != 0 {
		t.Errorf("late answers counted as %d mismatches", n)
	}
}

// Dialing a dead upstream fails with "refused"; redials wait for the backoff (on the group's
// clock), and once the upstream listens again the pool reconnects.
func TestTCPReconnectsAfterDialFailure(t *testing.T) {
	addr := deadAddr(t)
	rec := newRecorder()
	clk := newFake()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{addr}, Proto: TCP, Clock: clk}, rec)
	_, err := g.Exchange(context.Background(), query(t, "down.example.", 1))
	if err == nil {
		t.Fatal("Exchange to a dead upstream succeeded")
	}
	if n := rec.failuresOf(addr.String(), KindRefused); n == 0 {
		t.Error("no refused failure counted")
	}
	startTCPOn(t, addr.String(), servePipelined)
	if _, err := g.Exchange(context.Background(), query(t, "held.example.", 2)); err == nil || !strings.Contains(err.Error(), "held back") {
		t.Fatalf("dial during the backoff: %v", err)
	}
	clk.Advance(dialBackoffMax)
	ans, err := g.Exchange(context.Background(), query(t, "up.example.", 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "up.example.", 3); err != nil {
		t.Fatal(err)
	}
}

// Close fails queries in flight at once and leaves no goroutine behind.
func TestCloseNoGoroutineLeak(t *testing.T) {
	srv := startTCP(t, serveWith(func([]byte) []byte { return nil })) // never answers
	rec := newRecorder()
	g, err := NewGroup(GroupConfig{Name: "close", Servers: []netip.AddrPort{srv.addr, deadAddr(t)}, Proto: TCP, TryTimeout: 5 * time.Second}, rec)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			_, err := g.Exchange(context.Background(), query(t, fmt.Sprintf("c%d.example.", i), 1))
			errs <- err
		}()
	}
	waitFor(t, 2*time.Second, "20 queries in flight", func() bool { return rec.inflightNow() == 20 })
	start := time.Now()
	g.Close()
	for range 20 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("in-flight query ended with %v, want ErrClosed", err)
			}
		case <-time.After(time.Second):
			t.Fatal("query still blocked a second after Close")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	if _, err := g.Exchange(context.Background(), query(t, "after.example.", 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Exchange after Close: %v", err)
	}
	if leaks := waitNoLeaks(time.Second); len(leaks) > 0 {
		t.Errorf("goroutines left after Close:\n%v", leaks)
	}
	if n := rec.openConns(); n != 0 {
		t.Errorf("conns gauge %d after Close", n)
	}
}

// BenchmarkTCPPoolExchange measures a query through the pipelined pool against an upstream that
// echoes the query as a NODATA answer (cheap, so the client side dominates).
func BenchmarkTCPPoolExchange(b *testing.B) {
	addr := echoTCP(b)
	g := newGroup(b, GroupConfig{Name: "bench", Servers: []netip.AddrPort{addr}, Proto: TCP}, nil)
	q := query(b, "kubernetes.default.svc.cluster.local.", 1)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := g.Exchange(ctx, q); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A large answer (16 KB) arrives whole through the pool's reader, whose buffer starts at 4 KiB
// and grows with the bytes received; readGrowing does the same for one-shot reads, and a length
// that lies ends in an error, not a 64 KiB buffer waiting.
func TestTCPLargeAnswerGrowsBuffer(t *testing.T) {
	big := func(q []byte) []byte {
		m := new(dns.Msg)
		if err := m.Unpack(q); err != nil {
			return nil
		}
		r := new(dns.Msg)
		r.SetReply(m)
		for range 64 {
			r.Answer = append(r.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30}, Txt: []string{strings.Repeat("y", 250)}})
		}
		b, _ := r.Pack()
		return b
	}
	srv := startTCP(t, serveWith(big))
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP}, nil)
	ans, err := g.Exchange(context.Background(), query(t, "big.example.", 5))
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(ans); err != nil || len(m.Answer) != 64 || len(ans) < 16000 {
		t.Fatalf("answer of %d bytes, %d records: %v", len(ans), len(m.Answer), err)
	}

	msg := bytes.Repeat([]byte{7}, 10000)
	got, err := readGrowing(iotest.HalfReader(bytes.NewReader(msg)), len(msg))
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("readGrowing: %d bytes, %v", len(got), err)
	}
	if got, err := readGrowing(bytes.NewReader([]byte{1, 2, 3}), 65535); err != io.ErrUnexpectedEOF || got != nil {
		t.Fatalf("lying length: %d bytes, %v", len(got), err)
	}
}

// A pooled connection the writer goroutine wrote on keeps working past
// writeTimeout: its write deadline is cleared after each write, else the
// next inline write (through the raw conn) failed at once with an i/o
// timeout, closing the connection and failing a try (found by the dnstap
// parity test: a FORWARDER_QUERY of its own for the failed try).
func TestTCPPoolInlineWriteAfterWriterDeadline(t *testing.T) {
	srv := startTCP(t, servePipelined)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1}, rec)
	// The first query dials, and its frame is the writer goroutine's; many
	// at once then: while one writes inline the others queue for the writer.
	exchangeMany(t, g, 1, func(i int) string { return "first.svc.cluster.local." }, checkTXT)
	exchangeMany(t, g, 200, func(i int) string { return fmt.Sprintf("w%d.svc.cluster.local.", i) }, checkTXT)
	time.Sleep(writeTimeout + 300*time.Millisecond)
	for i := range 3 {
		// ExchangeAsync writes its frame inline (writeNow).
		name := fmt.Sprintf("after%d.svc.cluster.local.", i)
		_, ans, err := exchangeAsync(t, g, query(t, name, uint16(i+1)), 3*time.Second)
		if err != nil || checkTXT(ans, name, uint16(i+1)) != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	rec.mu.Lock()
	failures := maps.Clone(rec.failures)
	rec.mu.Unlock()
	if len(failures) != 0 || srv.accepted.Load() != 1 {
		t.Errorf("failures %v, %d connections accepted (want none, 1)", failures, srv.accepted.Load())
	}
}
