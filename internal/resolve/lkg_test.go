package resolve

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// flipper is an upstream whose answer the test sets as a function of the
// query.
type flipper struct {
	mu    sync.Mutex
	reply func(q *dns.Msg) *dns.Msg
	calls int
}

func (f *flipper) set(reply func(q *dns.Msg) *dns.Msg) {
	f.mu.Lock()
	f.reply = reply
	f.mu.Unlock()
}

func (f *flipper) fetch(_ context.Context, _ string, query []byte) ([]byte, error) {
	m := new(dns.Msg)
	if err := m.Unpack(query); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.calls++
	reply := f.reply
	f.mu.Unlock()
	return reply(m).Pack()
}

func rr(t testing.TB, s string) dns.RR {
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// replies of a reachable upstream that does not answer the question.
func nonAnswers(t *testing.T) map[string]func(q *dns.Msg) *dns.Msg {
	soa := rr(t, "example. 60 IN SOA ns.example. h.example. 1 2 3 4 60")
	return map[string]func(q *dns.Msg) *dns.Msg{
		"NXDOMAIN": func(q *dns.Msg) *dns.Msg {
			r := new(dns.Msg).SetRcode(q, dns.RcodeNameError)
			r.Ns = []dns.RR{soa}
			return r
		},
		"NODATA": func(q *dns.Msg) *dns.Msg {
			r := new(dns.Msg).SetReply(q)
			r.Ns = []dns.RR{soa}
			return r
		},
		"empty NOERROR": func(q *dns.Msg) *dns.Msg { return new(dns.Msg).SetReply(q) },
		"referral": func(q *dns.Msg) *dns.Msg {
			r := new(dns.Msg).SetReply(q)
			r.Ns = []dns.RR{rr(t, "example. 60 IN NS ns.example.")}
			return r
		},
		"additional only": func(q *dns.Msg) *dns.Msg {
			r := new(dns.Msg).SetReply(q)
			r.Extra = []dns.RR{rr(t, q.Question[0].Name+" 60 IN A 192.0.2.77")}
			return r
		},
		"CNAME without the type": func(q *dns.Msg) *dns.Msg {
			r := new(dns.Msg).SetReply(q)
			r.Answer = []dns.RR{rr(t, q.Question[0].Name+" 60 IN CNAME gone.example.")}
			return r
		},
		"SERVFAIL": func(q *dns.Msg) *dns.Msg { return new(dns.Msg).SetRcode(q, dns.RcodeServerFailure) },
	}
}

func positive(addr string) func(q *dns.Msg) *dns.Msg {
	return func(q *dns.Msg) *dns.Msg {
		r := new(dns.Msg).SetReply(q)
		a, _ := dns.NewRR(q.Question[0].Name + " 30 IN A " + addr)
		r.Answer = []dns.RR{a}
		return r
	}
}

func lkgEnv(t *testing.T, prefer bool, log *bytes.Buffer, prefetch ...int) (*env, *flipper, *cache.LastKnownGood) {
	f := &flipper{}
	zone := "lkg-" + strings.ReplaceAll(t.Name(), "/", "-") + "."
	ctr := cache.LastKnownGoodCounter(zone)
	e := newEnv(t, func(c *Config) {
		pol := testPolicy
		pol.StaleClientTimeout = time.Millisecond // immediate
		pol.TTL.DenialNoSOA = true
		pol.TTL.PreferPositive = prefer
		pol.TTL.LastKnownGood = ctr
		if len(prefetch) > 0 {
			pol.TTL.PrefetchSet, pol.TTL.PrefetchHits, pol.TTL.PrefetchPercent = true, prefetch[0], 10
		}
		c.Blocks, _ = Zones(pol)
		c.Fetch = f.fetch
		c.Logger = slog.New(slog.NewTextHandler(log, nil))
	})
	return e, f, ctr
}

// TestPreferPositiveKeepsLastGoodAnswer: with the policy, every kind of
// non-answer from a reachable upstream leaves clients the last good
// records within the stale window, counted; an answer replaces them; the
// window bounds them. Without it, the non-answer replaces the answer (as
// before), except SERVFAIL.
func TestPreferPositiveKeepsLastGoodAnswer(t *testing.T) {
	for name, reply := range nonAnswers(t) {
		for _, prefer := range []bool{true, false} {
			t.Run(name+map[bool]string{true: "/policy", false: "/off"}[prefer], func(t *testing.T) {
				var log bytes.Buffer
				e, f, ctr := lkgEnv(t, prefer, &log)
				q := question(t, "svc.example.")
				f.set(positive("192.0.2.1"))
				if en, _, err := e.r.Resolve(context.Background(), q, nil); err != nil || aOf(t, en, q) != "192.0.2.1" {
					t.Fatalf("warm: %v", err)
				}
				e.clk.Advance(31 * time.Second)
				f.set(reply)
				// The refresh answers (immediate: the client got stale or the refresh).
				en, stale, err := e.r.Resolve(context.Background(), q, nil)
				if err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the refresh", func() bool { return e.r.InFlight() == 0 })
				kept := prefer || name == "SERVFAIL"
				if !kept {
					// The next question gets the upstream's word.
					e.clk.Advance(time.Millisecond)
					en, stale, err = e.r.Resolve(context.Background(), q, nil)
					if err != nil || aOf(t, en, q) == "192.0.2.1" && !stale {
						t.Fatalf("without the policy: %v stale=%v err=%v, want the non-answer", aOf(t, en, q), stale, err)
					}
					return
				}
				if !stale || aOf(t, en, q) != "192.0.2.1" {
					t.Fatalf("got %s stale=%v, want the last good answer", aOf(t, en, q), stale)
				}
				// Later clients, within the window: still the last good answer.
				for i := 0; i < 3; i++ {
					e.clk.Advance(time.Minute)
					en, stale, err := e.r.Resolve(context.Background(), q, nil)
					if err != nil || !stale || aOf(t, en, q) != "192.0.2.1" {
						t.Fatalf("round %d: %s stale=%v err=%v", i, aOf(t, en, q), stale, err)
					}
					waitFor(t, "the refresh", func() bool { return e.r.InFlight() == 0 })
				}
				if name == "SERVFAIL" && !prefer {
					return
				}
				if ctr.Served.Load() < 4 || ctr.Kept.Load() == 0 {
					t.Fatalf("counters: served %d kept %d", ctr.Served.Load(), ctr.Kept.Load())
				}
				if n := strings.Count(log.String(), "does not answer"); n != 1 {
					t.Fatalf("%d log lines for the state change, want 1:\n%s", n, log.String())
				}
				// An answer replaces it.
				e.clk.Advance(time.Minute)
				f.set(positive("192.0.2.2"))
				waitFor(t, "the new answer", func() bool {
					e.clk.Advance(time.Second)
					en, _, err := e.r.Resolve(context.Background(), q, nil)
					return err == nil && aOf(t, en, q) == "192.0.2.2"
				})
				if !strings.Contains(log.String(), "answers again") {
					t.Fatalf("no log line for the recovery:\n%s", log.String())
				}
				// The stale window bounds it: past it, the non-answer.
				f.set(reply)
				e.clk.Advance(31*time.Second + time.Hour)
				en, stale, err = e.r.Resolve(context.Background(), q, nil)
				if name == "SERVFAIL" {
					if err == nil && en.Rcode() != dns.RcodeServerFailure {
						t.Fatalf("past the window: %s", aOf(t, en, q))
					}
					return
				}
				if err != nil || stale || aOf(t, en, q) == "192.0.2.2" {
					t.Fatalf("past the window: %s stale=%v err=%v, want the non-answer", aOf(t, en, q), stale, err)
				}
			})
		}
	}
}

// TestPreferPositivePrefetchKeepsFreshAnswer: a prefetch answered NXDOMAIN
// does not replace a fresh answer; hits on it count as served by the policy.
func TestPreferPositivePrefetchKeepsFreshAnswer(t *testing.T) {
	var log bytes.Buffer
	e, f, ctr := lkgEnv(t, true, &log, 2)
	// The counters are the zone's for the process (one per test name): a
	// second run of the test (-count) finds the first's counts.
	kept0, served0 := ctr.Kept.Load(), ctr.Served.Load()
	q := question(t, "pf.example.")
	f.set(positive("192.0.2.1"))
	if _, _, err := e.r.Resolve(context.Background(), q, nil); err != nil {
		t.Fatal(err)
	}
	f.set(nonAnswers(t)["NXDOMAIN"])
	e.clk.Advance(28 * time.Second) // last 10% of 30 s
	// Exactly the prefetch's 2 hits: a third could land after the prefetch
	// kept the answer and count as served by the policy (seen 1 run in 6).
	for i := 0; i < 2; i++ {
		e.r.Hit(q, nil, e.clk.Now().UnixNano())
	}
	waitFor(t, "the prefetch", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.calls == 2 })
	waitFor(t, "the prefetch to finish", func() bool { return e.r.InFlight() == 0 })
	h := e.r.Hit(q, nil, e.clk.Now().UnixNano())
	if h == nil || aOf(t, h, q) != "192.0.2.1" {
		t.Fatalf("hit after the prefetch: %v", h)
	}
	if k, sv := ctr.Kept.Load()-kept0, ctr.Served.Load()-served0; k != 1 || sv != 1 {
		t.Fatalf("kept %d served %d, want 1 and 1", k, sv)
	}
}

// TestStaleRecheckNegativeAsksEachTime: a negative recheck (CoreDNS's
// FAILURE_RECHECK 0) lets every stale answer start a refresh.
func TestStaleRecheckNegativeAsksEachTime(t *testing.T) {
	for _, tc := range []struct {
		recheck time.Duration
		want    int
	}{{-1, 4}, {30 * time.Second, 2}} {
		f := &flipper{}
		e := newEnv(t, func(c *Config) {
			pol := testPolicy
			pol.StaleClientTimeout = time.Millisecond
			pol.StaleRecheck = tc.recheck
			c.Blocks, _ = Zones(pol)
			c.Fetch = f.fetch
		})
		q := question(t, "rc.example.")
		f.set(positive("192.0.2.1"))
		e.r.Resolve(context.Background(), q, nil)
		e.clk.Advance(31 * time.Second)
		f.set(nonAnswers(t)["SERVFAIL"])
		for i := 0; i < 3; i++ {
			e.clk.Advance(time.Second)
			if en, stale, err := e.r.Resolve(context.Background(), q, nil); err != nil || !stale || aOf(t, en, q) != "192.0.2.1" {
				t.Fatalf("stale: %v %v", stale, err)
			}
			waitFor(t, "refresh", func() bool { return e.r.InFlight() == 0 })
		}
		f.mu.Lock()
		calls := f.calls
		f.mu.Unlock()
		if calls != tc.want {
			t.Errorf("recheck %v: %d upstream queries, want %d", tc.recheck, calls, tc.want)
		}
	}
}

// aOf is the first A record an entry answers with, else its rcode.
func aOf(t *testing.T, e *cache.Entry, q *wire.Query) string {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(e.WriteStale(nil, q, 0xFFFF, 1232)); err != nil {
		t.Fatal(err)
	}
	for _, r := range m.Answer {
		if a, ok := r.(*dns.A); ok {
			return a.A.String()
		}
	}
	return dns.RcodeToString[m.Rcode]
}

// TestImmediateServesStaleWithoutWaiting: a negative StaleClientTimeout
// (CoreDNS's `immediate`) gives the stale answer even when the refresh
// would answer at once; the refresh goes on and replaces the entry.
func TestImmediateServesStaleWithoutWaiting(t *testing.T) {
	f := &flipper{}
	e := newEnv(t, func(c *Config) {
		pol := testPolicy
		pol.StaleClientTimeout = -1
		c.Blocks, _ = Zones(pol)
		c.Fetch = f.fetch
	})
	q := question(t, "imm.example.")
	f.set(positive("192.0.2.1"))
	e.r.Resolve(context.Background(), q, nil)
	e.clk.Advance(31 * time.Second)
	f.set(positive("192.0.2.2"))
	en, stale, err := e.r.Resolve(context.Background(), q, nil)
	if err != nil || !stale || aOf(t, en, q) != "192.0.2.1" {
		t.Fatalf("got %s stale=%v err=%v, want the stale answer at once", aOf(t, en, q), stale, err)
	}
	waitFor(t, "the refresh", func() bool { return e.r.InFlight() == 0 })
	if h := e.r.Hit(q, nil, e.clk.Now().UnixNano()); h == nil || aOf(t, h, q) != "192.0.2.2" {
		t.Fatal("the refresh did not replace the entry")
	}
}
