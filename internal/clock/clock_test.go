package clock

import (
	"sync/atomic"
	"testing"
	"time"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestFakeTimerFiresOnlyWhenAdvancedPastDeadline(t *testing.T) {
	f := NewFake(epoch)
	tm := f.NewTimer(2 * time.Second)
	f.Advance(1999 * time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("fired before its deadline")
	default:
	}
	f.Advance(time.Millisecond)
	select {
	case got := <-tm.C():
		if want := epoch.Add(2 * time.Second); !got.Equal(want) {
			t.Fatalf("fired with %v, want %v", got, want)
		}
	default:
		t.Fatal("did not fire at its deadline")
	}
	if f.Timers() != 0 {
		t.Fatalf("%d timers still waiting", f.Timers())
	}
}

func TestFakeStopAndReset(t *testing.T) {
	f := NewFake(epoch)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a waiting timer returned false")
	}
	if tm.Stop() {
		t.Fatal("second Stop returned true")
	}
	f.Advance(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("stopped timer fired")
	default:
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer returned true")
	}
	if next, ok := f.Next(); !ok || !next.Equal(epoch.Add(time.Hour+time.Second)) {
		t.Fatalf("Next = %v %v", next, ok)
	}
	f.Advance(time.Second)
	<-tm.C()
}

func TestFakeAfterFuncRunsInOrder(t *testing.T) {
	f := NewFake(epoch)
	var got atomic.Int64
	done := make(chan struct{}, 2)
	f.AfterFunc(2*time.Second, func() { got.Store(2); done <- struct{}{} })
	f.AfterFunc(time.Second, func() { got.CompareAndSwap(0, 1); done <- struct{}{} })
	f.Advance(time.Second)
	<-done
	if got.Load() != 1 {
		t.Fatalf("after 1s got %d", got.Load())
	}
	f.Advance(time.Second)
	<-done
	if got.Load() != 2 {
		t.Fatalf("after 2s got %d", got.Load())
	}
}

func TestFakeZeroDurationFiresAtOnce(t *testing.T) {
	f := NewFake(epoch)
	tm := f.NewTimer(0)
	select {
	case <-tm.C():
	default:
		t.Fatal("a zero timer did not fire at once")
	}
}

func TestRealClock(t *testing.T) {
	c := Or(nil)
	if c != Real {
		t.Fatal("Or(nil) is not Real")
	}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	fired := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(fired) })
	<-fired
}
