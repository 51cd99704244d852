package forward

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestUDPSocketsAreReusedAndRotated: sequential queries reuse one socket
// (one source port) for udpSocketUses queries, then move to a new random
// port; a query that failed never leaves its socket for the next one.
func TestUDPSocketsAreReusedAndRotated(t *testing.T) {
	var mu sync.Mutex
	ports := map[int]int{}
	silent := false
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		mu.Lock()
		quiet := silent
		mu.Unlock()
		if !quiet {
			reply(answerFor(q))
		}
	})
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: UDP, TryTimeout: 300 * time.Millisecond}, nil)
	u := g.ups[0]
	local := func() int {
		u.udp.mu.Lock()
		defer u.udp.mu.Unlock()
		if len(u.udp.idle) != 1 {
			t.Fatalf("%d idle sockets, want 1", len(u.udp.idle))
		}
		return u.udp.idle[0].nc.LocalAddr().(*net.UDPAddr).Port
	}
	for i := 0; i < 2*udpSocketUses; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := g.Exchange(ctx, query(t, fmt.Sprintf("n%d.example.", i), uint16(i))); err != nil {
			t.Fatal(err)
		}
		cancel()
		if (i+1)%udpSocketUses != 0 { // a socket that reached its limit was closed
			ports[local()]++
		}
	}
	if len(ports) != 2 {
		t.Fatalf("source ports used %v: want one socket per %d queries", ports, udpSocketUses)
	}
	// A failed query closes its socket.
	ctx0, cancel0 := context.WithTimeout(context.Background(), time.Second)
	defer cancel0()
	if _, err := g.Exchange(ctx0, query(t, "one-more.example.", 7)); err != nil {
		t.Fatal(err)
	}
	before := local()
	mu.Lock()
	silent = true
	mu.Unlock()
	u.fails.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := g.Exchange(ctx, query(t, "timeout.example.", 1)); err == nil {
		t.Fatal("no error from a silent upstream")
	}
	u.udp.mu.Lock()
	for _, s := range u.udp.idle {
		if s.nc.LocalAddr().(*net.UDPAddr).Port == before {
			t.Error("the socket of a failed query was kept")
		}
	}
	u.udp.mu.Unlock()
}
