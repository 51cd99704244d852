package forward

import (
	"context"
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
