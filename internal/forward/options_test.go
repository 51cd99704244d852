package forward

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// Spread (a Corefile's policy round_robin or random) starts queries at each
// server in turn; without it the first healthy server takes them all.
func TestSpreadTakesTurns(t *testing.T) {
	for _, spread := range []bool{false, true} {
		a := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
		b := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
		g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{a.addr, b.addr}, Spread: spread}, nil)
		for i := range 10 {
			name := fmt.Sprintf("s%d.example.", i)
			ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkTXT(ans, name, uint16(i)); err != nil {
				t.Fatal(err)
			}
		}
		na, nb := a.queries.Load(), b.queries.Load()
		if spread && (na != 5 || nb != 5) || !spread && (na != 10 || nb != 0) {
			t.Errorf("spread %v: first server %d queries, second %d", spread, na, nb)
		}
	}
}

// With a Spread group, a SERVFAIL from the server whose turn it is is
// still retried on the other.
func TestSpreadServfailTriesOther(t *testing.T) {
	bad := startUDP(t, func(q []byte, reply func([]byte)) { reply(replyWith(q, 2)) })
	good := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{bad.addr, good.addr}, Spread: true}, nil)
	for i := range 4 {
		name := fmt.Sprintf("f%d.example.", i)
		ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
	}
}

// MaxFails: 1 marks a server down at its first failure; negative (CoreDNS's
// max_fails 0) never does.
func TestMaxFails(t *testing.T) {
	for _, tc := range []struct {
		maxFails int
		down     bool
	}{{1, true}, {-1, false}} {
		dead := deadAddr(t)
		good := startTCP(t, servePipelined)
		rec := newRecorder()
		g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{dead, good.addr}, Proto: TCP, MaxFails: tc.maxFails, ProbeInterval: time.Hour}, rec)
		for i := range 5 {
			if _, err := g.Exchange(context.Background(), query(t, fmt.Sprintf("m%d.example.", i), uint16(i))); err != nil {
				t.Fatal(err)
			}
		}
		if got := rec.hasHealth(dead.String() + " down"); got != tc.down {
			t.Errorf("max fails %d: down %v, want %v", tc.maxFails, got, tc.down)
		}
		if tc.down && rec.failuresOf(dead.String(), KindRefused) != 1 {
			t.Errorf("max fails 1: %d failures before down", rec.failuresOf(dead.String(), KindRefused))
		}
	}
}

// FailFast (failfast_all_unhealthy_upstreams): with every server down, a
// query fails at once with ErrAllDown and nothing is sent; without it one
// server is still tried (TestAllDownFailsFast).
func TestFailFastAllUnhealthy(t *testing.T) {
	dead := deadAddr(t)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{dead}, Proto: TCP, FailFast: true}, rec)
	for range 2 {
		g.Exchange(context.Background(), query(t, "a.example.", 1))
	}
	if !g.ups[0].down.Load() {
		t.Fatal("not down")
	}
	tried := rec.failuresOf(dead.String(), KindRefused)
	_, err := g.Exchange(context.Background(), query(t, "b.example.", 2))
	if !errors.Is(err, ErrNoAnswer) || !errors.Is(err, ErrAllDown) {
		t.Fatalf("err %v, want ErrNoAnswer and ErrAllDown", err)
	}
	done := make(doneChan, 1)
	g.ExchangeAsync(query(t, "c.example.", 3), time.Second, done)
	if err := <-done; !errors.Is(err, ErrAllDown) {
		t.Fatalf("async: err %v, want ErrAllDown", err)
	}
	if n := rec.failuresOf(dead.String(), KindRefused); n != tried {
		t.Errorf("%d tries while all down with FailFast, want 0", n-tried)
	}
}

// doneChan is a Done that sends the error.
type doneChan chan error

func (d doneChan) ExchangeDone(_ []byte, err error) { d <- err }
