package server

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// TestWaitingClientMemory: what a client waiting on a miss costs (heap and
// goroutine stack), the figure behind server.DefaultMaxWaiting and the
// manifest's memory arithmetic.
func TestWaitingClientMemory(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	// One client, so a bound its share lets it fill: it may borrow all
	// but the reserve (package fair).
	s, _ := startServer(t, func(c *Config) { c.MaxWaiting = 4096 }, func(c *resolve.Config) {
		c.MaxWaiters = 4096
		c.Fetch = func(ctx context.Context, _ string, q []byte) ([]byte, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, context.Canceled
		}
	})
	conn, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion("waiting.example.", dns.TypeA)
	q, _ := m.Pack()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 2000
	for i := 0; i < n; i++ {
		_, _ = conn.Write(q)
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // let the socket buffer drain
		}
	}
	for deadline := time.Now().Add(5 * time.Second); s.Snapshot().RequestsUDP < n || s.Snapshot().Coalesced < n-1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests, %d waiting", s.Snapshot().RequestsUDP, s.Snapshot().Coalesced)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	stack := int64(after.StackInuse) - int64(before.StackInuse)
	per := (heap + stack) / n
	t.Logf("%d waiting clients: heap +%d KiB, stacks +%d KiB: %d bytes each", n, heap>>10, stack>>10, per)
	// server.DefaultMaxWaiting's comment and the manifest count ~7 KiB;
	// fail past 10 KiB.
	if per > 10<<10 {
		t.Fatalf("%d bytes per waiting client, budget 10 KiB", per)
	}
}
