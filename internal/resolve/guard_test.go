package resolve

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// panickyWaiter panics in Resolved, after recording it.
type panickyWaiter struct{ *waiter }

func (w panickyWaiter) Resolved(e *cache.Entry, err error) {
	w.waiter.Resolved(e, err)
	panic("test: a panic injected in a waiter")
}

func quietPanics(t *testing.T) {
	panics.SetLogger(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { panics.SetLogger(nil) })
}

// TestPanicFinishesTheFlight: a panic while a flight is open (starting its
// fetch, in the fetch, or building the answer) finishes it with an error:
// every waiter is told once, nothing stays in flight, and the next asker
// starts a new flight that answers. A fetch still under way when its
// flight was finished this way changes nothing when it ends.
func TestPanicFinishesTheFlight(t *testing.T) {
	quietPanics(t)
	t.Run("start", func(t *testing.T) {
		var boom bool
		var late FetchDone // the fetch that was under way when the start panicked
		e, s := newStartEnv(t, func(c *Config) {
			start := c.Start
			c.Start = func(b *Block, qname, query []byte, asker netip.AddrPort, timeout time.Duration, done FetchDone) bool {
				if boom {
					late = done
					panic("test: a panic injected in starting a fetch")
				}
				return start(b, qname, query, asker, timeout, done)
			}
		})
		boom = true
		q := question(t, "start.example.")
		w := newWaiter()
		before := panics.Count(panics.Resolve)
		if _, how, _ := e.r.Start(q, nil, w); how != Later {
			t.Fatalf("Start: %v, want Later", how)
		}
		w.wait(t)
		if !errors.Is(w.err, errRecovered) || w.calls.Load() != 1 {
			t.Fatalf("waiter: %v after %d calls, want errRecovered once", w.err, w.calls.Load())
		}
		if e.r.InFlight() != 0 || panics.Count(panics.Resolve)-before != 1 {
			t.Fatalf("in flight %d, panics %d", e.r.InFlight(), panics.Count(panics.Resolve)-before)
		}
		late.Fetched(nil, errors.New("the fetch ends after all"))
		if w.calls.Load() != 1 || e.r.InFlight() != 0 {
			t.Fatalf("the late fetch called the waiter again (%d calls) or opened a flight", w.calls.Load())
		}
		boom = false
		w2 := newWaiter()
		if _, how, _ := e.r.Start(q, nil, w2); how != Later || s.count() != 1 {
			t.Fatalf("a new flight: %v, %d starts", how, s.count())
		}
		s.answer(0)
		w2.wait(t)
		if w2.err != nil || addrOf(t, w2.e, q) != "192.0.2.1" {
			t.Fatalf("after: %v %v", w2.e, w2.err)
		}
	})
	t.Run("waiter", func(t *testing.T) {
		e, s := newStartEnv(t, nil)
		q := question(t, "waiters.example.")
		bad, good := newWaiter(), newWaiter()
		e.r.Start(q, nil, panickyWaiter{bad})
		e.r.Start(q, nil, good)
		s.answer(0)
		bad.wait(t)
		good.wait(t)
		if good.err != nil || addrOf(t, good.e, q) != "192.0.2.1" || e.r.InFlight() != 0 {
			t.Fatalf("the waiter after a panicking one: %v %v, %d in flight", good.e, good.err, e.r.InFlight())
		}
	})
	t.Run("fetch", func(t *testing.T) {
		e := newEnv(t, func(c *Config) {
			c.Fetch = func(context.Context, string, []byte) ([]byte, error) {
				panic("test: a panic injected in a fetch")
			}
		})
		q := question(t, "fetch.example.")
		if _, _, err := e.r.Resolve(t.Context(), q, nil); !errors.Is(err, errRecovered) {
			t.Fatalf("Resolve: %v, want errRecovered", err)
		}
		if e.r.InFlight() != 0 {
			t.Fatal("the flight stayed open")
		}
	})
	t.Run("store", func(t *testing.T) {
		e, s := newStartEnv(t, nil)
		q := question(t, "store.example.")
		w := newWaiter()
		e.r.Start(q, nil, w)
		s.mu.Lock()
		st := s.started[0]
		s.mu.Unlock()
		resp, err := s.up.fetch(context.Background(), wire.NameString(st.qname), st.query)
		st.done.(*call).blk = nil // building the answer dereferences it: a panic
		st.done.Fetched(resp, err)
		w.wait(t)
		if !errors.Is(w.err, errRecovered) || e.r.InFlight() != 0 {
			t.Fatalf("waiter: %v, %d in flight", w.err, e.r.InFlight())
		}
	})
}
