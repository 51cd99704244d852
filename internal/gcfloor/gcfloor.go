// Package gcfloor is the daemon's garbage-collector policy: a heap goal of at
// least the live heap plus a fixed floor of garbage, whatever the live heap,
// and a goal proportional to the live heap (a base GOGC) once that is larger.
//
// Go has no minimum-heap setting, and a proportional goal alone runs a small
// heap's collector very often: 4 MiB live at GOGC=50 is a cycle every 2 MiB
// allocated, about every 120 ms at 10k misses/s, and a query that arrives
// during a mark phase waits for it. The policy re-computes GOGC after each
// cycle from runtime/metrics (/gc/heap/live:bytes plus the stacks and
// globals GOGC also applies to) so that the next goal leaves at least the
// floor of garbage, and sets it (runtime/debug.SetGCPercent: the heap lock,
// no stop of the world) only when the goal has left a band of [floor,
// 1.25×floor]: with a steady live heap it sets nothing.
//
// It owns the GOGC percent and nothing else: GOMEMLIMIT (the runtime's own
// cap on the goal) still bounds every goal it asks for, it logs nothing, and
// what it set is visible as the runtime's /gc/gogc:percent (go_gc_gogc_percent).
//
// Why not a ballast (a large never-touched allocation): it is counted in the
// live heap, so it raises a large heap's proportional goal too, and the
// runtime counts it against GOMEMLIMIT although it is never resident.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

const (
	// maxPercent bounds the GOGC the policy sets. The runtime applies GOGC
	// to the live heap plus stacks and globals, which are at least ~100 KiB
	// in any Go program; 100,000% of that is ~100 MiB of garbage, above any
	// floor worth setting, and far from int32 overflow in the runtime.
	maxPercent = 100_000
	// slackDen: the policy asks for floor + floor/slackDen (12.5% over the
	// floor) and sets GOGC again only when the goal falls below the floor
	// or above floor + 2×floor/slackDen, so a live heap that moves by less
	// than ~11% between cycles costs no call.
	slackDen = 8
)

// DefaultFloor is the daemon's floor. A miss allocates ~0.95 KB on the
// asynchronous miss path (~10 MB/s at 10k misses/s), so 16 MiB (18 MiB
// asked, the trigger at 70-95% of it) spaces the collections ~2 s apart.
// Each stalls the server's core for 4-6 ms: at 8 MiB (one every ~0.85 s)
// they were the UDP miss path's p99 in make bench (1.05 ms against
// Unbound's 0.63; 0.47 with no collection at all in misscost). Each MiB of
// floor is a MiB of RSS once misses have run a while (docs/design.md,
// "Garbage collection").
const DefaultFloor = 16 << 20

// The runtime/metrics the policy reads; together they are what GOGC applies to.
const (
	metricLive    = "/gc/heap/live:bytes"
	metricStacks  = "/gc/scan/stack:bytes"
	metricGlobals = "/gc/scan/globals:bytes"
	metricCycles  = "/gc/cycles/total:gc-cycles"
)

// Policy is a running policy. There is one per process: GOGC is global.
type Policy struct {
	base  int
	floor uint64

	mu      sync.Mutex // orders cycle against Stop
	stopped bool
	percent int // what the policy last set
	prev    int // GOGC before Start, restored by Stop
	samples [4]metrics.Sample

	seen atomic.Uint64 // the runtime's cycle count when the policy last looked
	sets atomic.Uint64
}

// Start applies the policy now and after every garbage collection until
// Stop: GOGC is at least base, and high enough that the next heap goal is
// at least the live heap plus floor bytes. The caller decides whether GOGC
// in the environment wins (the daemon does not call Start then).
func Start(base int, floor uint64) *Policy {
	p := &Policy{base: base, floor: floor}
	p.samples[0].Name, p.samples[1].Name, p.samples[2].Name, p.samples[3].Name = metricLive, metricStacks, metricGlobals, metricCycles
	p.mu.Lock()
	live, scan := p.read()
	p.percent = Next(-1, base, floor, live, scan)
	p.prev = debug.SetGCPercent(p.percent)
	p.sets.Add(1)
	p.mu.Unlock()
	p.arm()
	return p
}

// sentinel is allocated, unreachable, once per cycle: its cleanup runs
// after the collection that found it dead. The pointer field keeps it out
// of the tiny allocator, whose blocks may outlive the object.
type sentinel struct{ _ *byte }

// arm makes the next cycle (or the one after it, when armed during a mark
// phase, which allocates black) call p.cycle.
func (p *Policy) arm() {
	runtime.AddCleanup(&sentinel{}, (*Policy).cycle, p)
}

// cycle runs on the runtime's cleanup goroutine once a collection is over.
func (p *Policy) cycle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.adjust()
	p.arm()
}

// adjust reads what the last cycle found and sets GOGC if the goal left
// the band. Called with p.mu held.
func (p *Policy) adjust() {
	live, scan := p.read()
	if next := Next(p.percent, p.base, p.floor, live, scan); next != p.percent {
		debug.SetGCPercent(next)
		p.percent = next
		p.sets.Add(1)
	}
}

// read returns what the last cycle found: the live heap, and the bytes
// GOGC applies to (live heap, stacks, globals); it records the cycle's
// number. Called with p.mu held (p.samples is reused).
func (p *Policy) read() (live, scan uint64) {
	metrics.Read(p.samples[:])
	var v [len(p.samples)]uint64
	for i, s := range p.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	p.seen.Store(v[3])
	return v[0], v[0] + v[1] + v[2]
}

// Next is the GOGC percent to run with when the current one is cur (-1:
// none set yet), for a base percent, a floor of garbage in bytes, the live
// heap and the bytes GOGC applies to (scan: live heap, stacks, globals). It
// returns base when base's goal leaves at least the floor; cur while cur's
// goal leaves between the floor and 1.25×floor; otherwise the least percent
// whose goal leaves 1.125×floor (at most maxPercent).
func Next(cur, base int, floor, live, scan uint64) int {
	scan = max(scan, live, 1)
	if goal(base, live, scan) >= live+floor {
		return base // the proportional goal already leaves the floor
	}
	if cur > base {
		if g := goal(cur, live, scan); g >= live+floor && g <= live+floor+2*floor/slackDen {
			return cur
		}
	}
	want := live + floor + floor/slackDen
	// The least percent whose goal reaches want: through the proportional
	// part, or through the heap minimum, whichever needs less.
	p := min((100*(want-live)+scan-1)/scan, (100*want+heapMinimum-1)/heapMinimum)
	return int(min(max(p, uint64(base)), maxPercent))
}

// goal is the heap goal the runtime computes for GOGC percent p
// (runtime/mgcpacer.go, gcControllerState.commit): live + scan×p/100, and
// at least the heap minimum, which SetGCPercent scales by p/100 too (a
// floor through GOGC alone, 100×floor/scan, would otherwise set a tiny
// heap's minimum, and goal, far above live + floor).
func goal(p int, live, scan uint64) uint64 {
	return max(live+scan*uint64(p)/100, heapMinimum*uint64(p)/100)
}

// heapMinimum is the runtime's heap minimum at GOGC=100
// (defaultHeapMinimum): 4 MiB, or 512 KiB when built with
// GOEXPERIMENT=heapminimum512kib.
var heapMinimum uint64 = 4 << 20

func init() {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "GOEXPERIMENT" && slices.Contains(strings.Split(s.Value, ","), "heapminimum512kib") {
				heapMinimum = 512 << 10
			}
		}
	}
}

// Percent is the GOGC percent the policy set last.
func (p *Policy) Percent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.percent
}

// Seen is the number of the last collection the policy has seen end (the
// runtime's /gc/cycles/total:gc-cycles when it last looked).
func (p *Policy) Seen() uint64 { return p.seen.Load() }

// Sets is the number of times the policy has set GOGC, Start included.
func (p *Policy) Sets() uint64 { return p.sets.Load() }

// Stop ends the policy and puts back the GOGC that was in force before
// Start. The daemon never stops it; tests do.
func (p *Policy) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		p.stopped = true
		debug.SetGCPercent(p.prev)
	}
}
