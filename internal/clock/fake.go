package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to (Advance, Set). Timers
// whose time has come fire during the call that moved the clock, in the
// order of their deadlines: a channel timer's value is sent (the channel
// has room for one, as time.Timer's), an AfterFunc's function is started
// in its own goroutine. Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	seq    uint64
}

// NewFake returns a Fake set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now is the fake's current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer firing d after the fake's current time.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1)}
	t.ch = t.c
	f.mu.Lock()
	f.schedule(t, d)
	f.mu.Unlock()
	f.fireDue()
	return t
}

// AfterFunc runs fn in its own goroutine d after the fake's current time.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{clock: f, fn: fn}
	f.mu.Lock()
	f.schedule(t, d)
	f.mu.Unlock()
	f.fireDue()
	return t
}

// Advance moves the clock forward by d and fires what came due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
	f.fireDue()
}

// Set moves the clock to t (never backwards) and fires what came due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.now = t
	}
	f.mu.Unlock()
	f.fireDue()
}

// Timers is the number of timers waiting to fire: a test polls it to know
// that the code under test has started waiting before it advances.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next is the deadline of the earliest waiting timer, and false if none.
func (f *Fake) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return time.Time{}, false
	}
	return f.timers[0].when, true
}

// schedule adds t to the waiting timers; f.mu is held.
func (f *Fake) schedule(t *fakeTimer, d time.Duration) {
	f.seq++
	t.when, t.seq, t.active = f.now.Add(d), f.seq, true
	f.timers = append(f.timers, t)
	sort.Slice(f.timers, func(i, j int) bool {
		a, b := f.timers[i], f.timers[j]
		if !a.when.Equal(b.when) {
			return a.when.Before(b.when)
		}
		return a.seq < b.seq
	})
}

// unschedule removes t; f.mu is held. It reports whether t was waiting.
func (f *Fake) unschedule(t *fakeTimer) bool {
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			t.active = false
			return true
		}
	}
	return false
}

func (f *Fake) fireDue() {
	for {
		f.mu.Lock()
		if len(f.timers) == 0 || f.timers[0].when.After(f.now) {
			f.mu.Unlock()
			return
		}
		t := f.timers[0]
		f.timers = f.timers[1:]
		t.active = false
		now := f.now
		f.mu.Unlock()
		if t.fn != nil {
			go t.fn()
			continue
		}
		select {
		case t.c <- now:
		default: // a value is already waiting, as with time.Timer
		}
	}
}

type fakeTimer struct {
	clock  *Fake
	c      chan time.Time
	ch     <-chan time.Time
	fn     func()
	when   time.Time
	seq    uint64
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	return t.clock.unschedule(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.clock.mu.Lock()
	was := t.clock.unschedule(t)
	if t.c != nil {
		// As time.Timer since Go 1.23: no stale value after Reset.
		select {
		case <-t.c:
		default:
		}
	}
	t.clock.schedule(t, d)
	t.clock.mu.Unlock()
	t.clock.fireDue()
	return was
}

var _ Clock = (*Fake)(nil)
