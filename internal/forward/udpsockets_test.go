package forward

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// Sequential queries share one socket (one source port) for udpSocketQueries queries, then
// move to a new random port; the connection-cache counts say so: a miss per socket opened, a
// hit per query sent over an open one.
func TestUDPSocketsSharedAndRotated(t *testing.T) {
	srv := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP}, rec)
	g.u0().udp.life = time.Hour // rotation by count only, however slow the machine
	const n = 2*udpSocketQueries + 1
	for i := range n {
		name := fmt.Sprintf("n%d.example.", i)
		ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	ports := srv.ports()
	if len(ports) != 3 {
		t.Fatalf("source ports %v: want one socket per %d queries", ports, udpSocketQueries)
	}
	for p, k := range ports {
		if k != udpSocketQueries && k != 1 {
			t.Errorf("port %d carried %d queries, want %d (or 1, the last)", p, k, udpSocketQueries)
		}
	}
	if hits, misses := rec.socketUses(srv.addr.String(), "udp"); hits != n-3 || misses != 3 {
		t.Errorf("socket uses: %d hits, %d misses; want %d and 3", hits, misses, n-3)
	}
	waitFor(t, 5*time.Second, "the full sockets to close", func() bool {
		m := g.ups[0].udp
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.socks) == 1 && m.active == 1
	})
}

// Concurrent queries share at most udpActiveSockets sockets; the answers, sent back in reverse
// order once every query arrived, each reach their own query; no two queries in flight on a
// socket have the same ID.
func TestUDPConcurrentQueriesShareSockets(t *testing.T) {
	const n = 200
	var mu sync.Mutex
	var held [][]byte
	var replies []func([]byte)
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		mu.Lock()
		defer mu.Unlock()
		held = append(held, q)
		replies = append(replies, reply)
		if len(held) == n {
			for i := n - 1; i >= 0; i-- {
				replies[i](answerFor(held[i]))
			}
		}
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP, TryTimeout: 30 * time.Second, MaxInflight: n}, rec)
	g.u0().udp.life = time.Hour
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("c%d.example.", i)
			ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
			if err == nil {
				err = checkTXT(ans, name, uint16(i))
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
	ports := srv.ports()
	if len(ports) > udpActiveSockets {
		t.Errorf("%d source ports %v, want at most %d", len(ports), ports, udpActiveSockets)
	}
	seen := map[[2]uint16]bool{}
	mu.Lock()
	defer mu.Unlock()
	srv.mu.Lock()
	for i, q := range held {
		k := [2]uint16{srv.sources[i].Port(), binary.BigEndian.Uint16(q)}
		if seen[k] {
			t.Errorf("ID %d twice in flight on port %d", k[1], k[0])
		}
		seen[k] = true
	}
	srv.mu.Unlock()
	if hits, misses := rec.socketUses(srv.addr.String(), "udp"); hits+misses != n || misses != len(ports) {
		t.Errorf("socket uses: %d hits, %d misses; want %d in all, a miss per port (%d)", hits, misses, n, len(ports))
	}
	if f := rec.failuresOf("", KindMismatch); f != 0 {
		t.Errorf("%d mismatches counted", f)
	}
}

// A query that timed out leaves its ID taken on the shared socket: its late answer is dropped
// without being counted as forged, and the socket goes on serving other queries.
func TestUDPLateAnswerDroppedSocketKept(t *testing.T) {
	const try = 200 * time.Millisecond
	var mu sync.Mutex
	var late func()
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		mu.Lock()
		defer mu.Unlock()
		if late == nil {
			late = func() { reply(answerFor(q)) } // the first query's answer, sent later
			return
		}
		reply(answerFor(q))
	})
	rec := newRecorder()
	clk := newFake()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP, TryTimeout: try, Clock: clk}, rec)
	g.u0().udp.life = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := g.u0().udp.exchange(ctx, query(t, "slow.example.", 1), mustParse(t, query(t, "slow.example.", 1)))
		done <- err
	}()
	waitFor(t, 5*time.Second, "the first query at the upstream", func() bool { return srv.queries.Load() == 1 })
	advanceWhen(t, clk, 1, try)
	if err := <-done; err == nil {
		t.Fatal("an answer to a query the upstream kept")
	}
	mu.Lock()
	late()
	mu.Unlock()
	for i := range 5 {
		name := fmt.Sprintf("after%d.example.", i)
		ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(srv.ports()) != 1 {
		t.Errorf("source ports %v: the socket of a timed-out query was replaced", srv.ports())
	}
	if f := rec.failuresOf("", KindMismatch); f != 0 {
		t.Errorf("the late answer was counted as %d mismatches", f)
	}
}

// A socket stops taking queries at the end of its life and closes once its queries are done:
// the next query opens one on a new port.
func TestUDPSocketLife(t *testing.T) {
	srv := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP}, nil)
	m := g.u0().udp
	m.life = 50 * time.Millisecond
	if _, err := g.Exchange(context.Background(), query(t, "a.example.", 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the socket to reach its end of life", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.socks) == 0
	})
	if _, err := g.Exchange(context.Background(), query(t, "b.example.", 2)); err != nil {
		t.Fatal(err)
	}
	if len(srv.ports()) != 2 {
		t.Errorf("source ports %v, want a new one after the socket's life", srv.ports())
	}
}

func (g *Group) u0() *upstream { return g.ups[0] }

func mustParse(t testing.TB, msg []byte) question {
	t.Helper()
	q, err := parseQuery(msg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
