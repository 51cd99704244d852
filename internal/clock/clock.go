// Package clock is the time source every package of the daemon takes: the
// current time, timers and functions run after a delay. Production code
// uses Real; tests use a Fake and move it, so no test sleeps to let a TTL,
// a timeout or a backoff pass.
//
// It owns nothing else: no tickers (a loop resets a Timer), no time zones.
package clock

import "time"

// Clock is a source of time and timers.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// NewTimer is time.NewTimer on this clock.
	NewTimer(d time.Duration) Timer
	// AfterFunc is time.AfterFunc on this clock: f runs in its own
	// goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is the part of *time.Timer the daemon uses.
type Timer interface {
	// C delivers the time when the timer fires; nil for an AfterFunc timer.
	C() <-chan time.Time
	// Stop prevents the timer from firing; false if it had fired or been
	// stopped.
	Stop() bool
	// Reset makes the timer fire d from now; false if it had fired or been
	// stopped.
	Reset(d time.Duration) bool
}

// Real is the system clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

// Or returns c, or Real when c is nil, so a zero Config field means the
// system clock.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

var (
	_ Clock = realClock{}
	_ Timer = realTimer{}
)
