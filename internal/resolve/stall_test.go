package resolve

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// TestPrefetchesTakeTheirShare: prefetches hold at most the prefetch
// key's share of the flights (package fair), whoever's hits start them;
// past it they are skipped and counted, and clients' misses still get in.
func TestPrefetchesTakeTheirShare(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFlights = 1024 })
	e.c = cache.New(cache.Config{PrefetchHits: 2})
	e.r.cfg.Cache = e.c
	share := fair.New(1024).Share()
	const names = 40
	qs := make([]*wire.Query, names)
	for i := range qs {
		qs[i] = question(t, fmt.Sprintf("p%d.example.", i))
		if _, _, err := e.r.Resolve(context.Background(), qs[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	release := e.up.block()
	defer release()
	e.clk.Advance(28 * time.Second) // the last tenth of 30 s
	for _, q := range qs {
		for range 2 {
			e.r.Hit(q, nil, e.clk.Now().UnixNano())
		}
	}
	waitFor(t, "the prefetches", func() bool { return e.up.calls.Load() == int64(names+share) })
	if got := e.r.Stats().PrefetchSkipped.Load(); got != uint64(names-share) {
		t.Fatalf("%d prefetches skipped, want %d", got, names-share)
	}
	if e.r.InFlight() != share {
		t.Fatalf("%d in flight, want the prefetches' share %d", e.r.InFlight(), share)
	}
	// A client's new question is admitted beside them.
	q := question(t, "client.example.")
	q.Client = fair.NodeKey(1)
	ch := e.resolveAsync(q)
	waitFor(t, "the client's flight", func() bool { return e.r.InFlight() == share+1 })
	release()
	if r := <-ch; r.err != nil {
		t.Fatal(r.err)
	}
}

// TestStalledPrefetchIsNotStartedAgain: a prefetch that fails after the
// client timeout stalls its question: no prefetch of it starts until a
// fetch of it answers, a client's miss here.
func TestStalledPrefetchIsNotStartedAgain(t *testing.T) {
	e := newEnv(t, nil)
	q := question(t, "stall.example.")
	if _, _, err := e.r.Resolve(context.Background(), q, nil); err != nil {
		t.Fatal(err)
	}
	b := e.r.Block(q.Name)
	release := e.up.block()
	e.up.set(dns.RcodeSuccess, "", errors.New("timed out"))
	e.r.prefetch(q, b)
	waitFor(t, "the prefetch", func() bool { return e.up.calls.Load() == 2 })
	e.clk.Advance(testPolicy.StaleClientTimeout + time.Millisecond)
	release()
	waitFor(t, "the prefetch to fail", func() bool { return e.r.InFlight() == 0 })
	e.r.prefetch(q, b)
	if e.r.InFlight() != 0 || e.up.calls.Load() != 2 || e.r.Stats().PrefetchSkipped.Load() != 1 {
		t.Fatalf("a stalled question prefetched again: in flight %d, calls %d, skipped %d", e.r.InFlight(), e.up.calls.Load(), e.r.Stats().PrefetchSkipped.Load())
	}
	// A refresh that fails fast is no stall.
	fast := question(t, "fast.example.")
	e.r.prefetch(fast, b)
	waitFor(t, "the fast failure", func() bool { return e.up.calls.Load() == 3 && e.r.InFlight() == 0 })
	// A client's miss of the stalled name answers it: prefetches resume.
	e.up.set(dns.RcodeSuccess, "192.0.2.9", nil)
	e.clk.Advance(31 * time.Second)
	if en, _, err := e.r.Resolve(context.Background(), q, nil); err != nil || addrOf(t, en, q) != "192.0.2.9" {
		t.Fatalf("the client's miss: %v", err)
	}
	e.r.prefetch(q, b)
	waitFor(t, "the prefetch after the answer", func() bool { return e.up.calls.Load() == 5 })
	e.r.prefetch(fast, b)
	waitFor(t, "the fast one's prefetch", func() bool { return e.up.calls.Load() == 6 })
}
