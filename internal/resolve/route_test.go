package resolve

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// fetchSpy is a Fetcher that records the block each call was given.
type fetchSpy struct {
	up               FetchFunc
	started, fetched *Block
	asker            netip.AddrPort
}

func (f *fetchSpy) Start(b *Block, _, _ []byte, asker netip.AddrPort, _ time.Duration, _ FetchDone) bool {
	f.started, f.asker = b, asker
	return false // the blocking path: Fetch
}

func (f *fetchSpy) Fetch(ctx context.Context, b *Block, qname string, query []byte) ([]byte, error) {
	f.fetched = b
	return f.up(ctx, qname, query)
}

// The block a miss was given rides with it: its Fetcher's Start and
// Fetch get it, so the fetch side never looks the name up again, and the
// flight's first asker goes with it.
func TestBlockRidesWithTheMiss(t *testing.T) {
	spy := &fetchSpy{}
	blk := &Block{Zone: "example.", Policy: testPolicy, Fetcher: spy}
	lookups := 0
	e := newEnv(t, func(c *Config) {
		spy.up = c.Fetch
		c.Blocks = func([]byte) *Block { lookups++; return blk }
	})
	q := question(t, "r.example.")
	q.From, q.FromPort = netip.MustParseAddr("192.0.2.7"), 5353
	w := newWaiter()
	if _, how, _ := e.r.Start(q, blk, w); how != Later {
		t.Fatalf("Start: %v", how)
	}
	w.wait(t)
	if spy.started != blk || spy.fetched != blk {
		t.Fatalf("Start got %p, Fetch got %p, want %p", spy.started, spy.fetched, blk)
	}
	if spy.asker != netip.MustParseAddrPort("192.0.2.7:5353") {
		t.Errorf("asker %v", spy.asker)
	}
	if lookups != 0 {
		t.Errorf("%d lookups of a miss given its block", lookups)
	}
}
