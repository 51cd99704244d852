package gcfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestNext(t *testing.T) {
	const floor = 16 * mib
	const kib = 1 << 10
	for _, c := range []struct {
		name       string
		cur        int
		live, scan uint64
		want       int
	}{
		{"first call, small heap: 1.125×floor over 4.5 MiB", -1, 4 * mib, 4608 * kib, 400},
		{"first call, large heap: base", -1, 64 * mib, 65 * mib, 50},
		{"within the band: kept", 400, 4300 * kib, 4812 * kib, 400},
		{"live heap shrank: goal under the floor", 400, 3 * mib, 3584 * kib, 515},
		{"live heap grew: goal over 1.25×floor", 400, 5 * mib, 5632 * kib, 328},
		{"live heap grew past the proportional goal", 400, 40 * mib, 41 * mib, 50},
		{"base kept while it gives the floor", 50, 33280 * kib, 33 * mib, 50},
		{"tiny heap: through the heap minimum", -1, 512 * kib, mib, 463},
		{"nothing yet", -1, 0, 0, 450},
	} {
		if got := Next(c.cur, 50, floor, c.live, c.scan); got != c.want {
			t.Errorf("%s: Next(%d, 50, 16 MiB, %d, %d) = %d, want %d", c.name, c.cur, c.live, c.scan, got, c.want)
		}
	}
	// Whatever the input, the goal Next asks for leaves at least the floor,
	// and at most 1.25×floor unless it is the base's (proportional) goal.
	for live := uint64(0); live < 256*mib; live = live*9/8 + 4096 {
		scan := live + 512*kib
		for _, cur := range []int{-1, 50, 100, 400, 1000, 5000} {
			p := Next(cur, 50, floor, live, scan)
			garbage := goal(p, live, scan) - live
			if garbage < floor {
				t.Fatalf("live %d cur %d: percent %d allows %d bytes of garbage, under the floor", live, cur, p, garbage)
			}
			if p > 50 && garbage > floor+floor/4 {
				t.Fatalf("live %d cur %d: percent %d allows %d bytes of garbage, over 1.25×floor", live, cur, p, garbage)
			}
		}
	}
}

// runtimeStats reads the runtime's figures the tests check.
type runtimeStats struct {
	cycles, allocs, goal, live, gogc uint64
}

func readStats() runtimeStats {
	s := []metrics.Sample{
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/gc/heap/goal:bytes"},
		{Name: metricLive},
		{Name: "/gc/gogc:percent"},
	}
	metrics.Read(s)
	return runtimeStats{s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64(), s[3].Value.Uint64(), s[4].Value.Uint64()}
}

// collect runs a full collection and waits until p has looked at the
// runtime after it (its cleanup runs on the runtime's goroutine once the
// sweep found the sentinel dead). A sentinel allocated during a mark phase
// survives that cycle, so it collects again until the policy has seen one.
func collect(t *testing.T, p *Policy) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		target := readStats().cycles
		for until := time.Now().Add(100 * time.Millisecond); time.Now().Before(until); {
			if p.Seen() >= target {
				return
			}
			time.Sleep(time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy saw no collection after cycle %d within 10s (it saw %d)", target, p.Seen())
		}
	}
}

func startPolicy(t *testing.T, base int, floor uint64) *Policy {
	t.Helper()
	p := Start(base, floor)
	t.Cleanup(p.Stop)
	return p
}

var sink [][]byte

// churn allocates total bytes in chunks of chunk bytes, keeping the last
// keep chunks live (keep×chunk bytes of live heap).
func churn(total, chunk, keep int) {
	ring := make([][]byte, keep)
	for i := 0; i*chunk < total; i++ {
		ring[i%keep] = make([]byte, chunk)
	}
	sink = ring
	sink = nil
}

// bytesPerCycle churns total bytes over a small live heap and returns the
// bytes allocated per collection.
func bytesPerCycle(total int) (float64, uint64) {
	a := readStats()
	churn(total, 32<<10, 32) // 1 MiB live
	b := readStats()
	cycles := b.cycles - a.cycles
	return float64(b.allocs-a.allocs) / float64(max(cycles, 1)), cycles
}

// TestFloorSpacesCycles: with a small live heap, collections are at least
// ~the floor of allocation apart with the policy, and a proportional
// GOGC=50 alone runs them far more often (the control, run first in the
// same process, shows the test can fail).
func TestFloorSpacesCycles(t *testing.T) {
	const floor = 16 * mib
	const total = 256 * mib
	old := debug.SetGCPercent(50)
	runtime.GC()
	ctlPer, ctlCycles := bytesPerCycle(total)
	debug.SetGCPercent(old)

	p := startPolicy(t, 50, floor)
	collect(t, p)
	s := readStats()
	if s.goal < s.live+floor {
		t.Errorf("after a collection: heap goal %d MiB, live %d MiB: less than the floor (%d MiB) apart",
			s.goal/mib, s.live/mib, floor/mib)
	}
	if int(s.gogc) != p.Percent() || p.Percent() <= 50 {
		t.Errorf("GOGC %d, the policy says it set %d: want the same, above 50", s.gogc, p.Percent())
	}
	per, cycles := bytesPerCycle(total)
	t.Logf("GOGC=50: %d cycles, %.1f MiB allocated per cycle; floor 16 MiB: %d cycles, %.1f MiB per cycle (GOGC %d, %d sets)",
		ctlCycles, ctlPer/mib, cycles, per/mib, p.Percent(), p.Sets())
	// The runtime starts a cycle between 70% and 95% of the way from the
	// live heap to the goal, and allocation during the mark phase counts
	// toward the next one: half the floor is a bound it always keeps.
	if per < floor/2 {
		t.Errorf("with the floor: %.1f MiB allocated per cycle, want at least %d", per/mib, floor/2/mib)
	}
	if ctlPer >= floor/2 {
		t.Errorf("control at GOGC=50: %.1f MiB allocated per cycle; the test cannot tell the policy from none", ctlPer/mib)
	}
}

// TestLargeHeapProportional: a live heap whose proportional goal leaves
// more than the floor runs at the base GOGC; when it is let go the floor
// comes back.
func TestLargeHeapProportional(t *testing.T) {
	const floor = 8 * mib
	p := startPolicy(t, 50, floor)
	live := make([][]byte, 48)
	for i := range live {
		live[i] = make([]byte, mib)
	}
	collect(t, p)
	s := readStats()
	if p.Percent() != 50 || s.gogc != 50 {
		t.Errorf("48 MiB live: GOGC %d (policy %d), want the base 50", s.gogc, p.Percent())
	}
	// 50% of live + stacks + globals: at least 24 MiB, and not the 8 MiB
	// the floor alone would give.
	if g := s.goal - s.live; g < 24*mib || g > 30*mib {
		t.Errorf("48 MiB live: goal %d MiB is live %d MiB + %d MiB, want +24-30 MiB", s.goal/mib, s.live/mib, g/mib)
	}
	runtime.KeepAlive(live)
	live = nil
	collect(t, p)
	s = readStats()
	if p.Percent() <= 50 || s.goal < s.live+floor {
		t.Errorf("live heap let go: GOGC %d, goal %d MiB, live %d MiB: want the floor back", p.Percent(), s.goal/mib, s.live/mib)
	}
}

// TestMemoryLimitCaps: GOMEMLIMIT still caps the goal the floor asks for.
func TestMemoryLimitCaps(t *testing.T) {
	const floor = 64 * mib
	p := startPolicy(t, 50, floor)
	collect(t, p)
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	limit := int64(s[0].Value.Uint64()-s[1].Value.Uint64()) + 8*mib
	old := debug.SetMemoryLimit(limit)
	defer debug.SetMemoryLimit(old)
	st := readStats()
	if st.goal >= st.live+floor {
		t.Errorf("GOMEMLIMIT %d MiB: goal %d MiB, live %d MiB: the floor went past the limit", limit/mib, st.goal/mib, st.live/mib)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if st = readStats(); st.goal < st.live+floor {
		t.Errorf("no limit: goal %d MiB, live %d MiB: want the floor of %d MiB", st.goal/mib, st.live/mib, floor/mib)
	}
}

// TestStopRestores: Stop puts back the GOGC in force before Start, and the
// policy sets nothing after it.
func TestStopRestores(t *testing.T) {
	old := debug.SetGCPercent(77)
	defer debug.SetGCPercent(old)
	p := Start(50, 16*mib)
	collect(t, p)
	p.Stop()
	if s := readStats(); s.gogc != 77 {
		t.Errorf("after Stop: GOGC %d, want 77", s.gogc)
	}
	sets := p.Sets()
	churn(64*mib, 32<<10, 4)
	runtime.GC()
	runtime.GC()
	if s := readStats(); s.gogc != 77 || p.Sets() != sets {
		t.Errorf("after Stop and collections: GOGC %d, %d sets (were %d)", s.gogc, p.Sets(), sets)
	}
}

// The policy's work per collection besides allocating the next sentinel
// (8 bytes): one runtime/metrics read and the arithmetic; GOGC is set
// only when the goal left the band, which a steady heap never does.
func BenchmarkAdjust(b *testing.B) {
	p := Start(50, 16*mib)
	defer p.Stop()
	b.ReportAllocs()
	for b.Loop() {
		p.mu.Lock()
		p.adjust()
		p.mu.Unlock()
	}
}
