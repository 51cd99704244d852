package main

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func TestReapedFromStat(t *testing.T) {
	// A command name with a space and a parenthesis; utime 7, stime 8,
	// cutime 12, cstime 30.
	line := "1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 8 12 30 20 0 1 0 100 1000 10 18446744073709551615"
	got, err := ReapedFromStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(42 * 10_000_000); got != want {
		t.Errorf("reaped %d ns, want %d", got, want)
	}
	if _, err := ReapedFromStat("1234 no parenthesis"); err == nil {
		t.Error("no error for a malformed line")
	}
}

func TestFirstField(t *testing.T) {
	ns, err := FirstField("758677 127000 2\n")
	if err != nil || ns != 758677 {
		t.Errorf("FirstField = %d, %v", ns, err)
	}
	if _, err := FirstField(""); err == nil {
		t.Error("no error for an empty line")
	}
}

// spin burns d of CPU time on the calling (locked) thread, however
// loaded the machine is.
func spin(t *testing.T, d time.Duration) {
	x := 0
	for {
		var ts syscall.Timespec
		// 3: CLOCK_THREAD_CPUTIME_ID.
		if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
			t.Error(errno)
			return
		}
		if ts.Nano() >= d.Nanoseconds() {
			return
		}
		for range 10000 {
			x++
		}
	}
}

// TestMeasureSeesBusyThreads: the clock grows by about the CPU a process
// burns, and counts the time of a thread that exited (which the live
// threads' schedstat no longer shows).
func TestMeasureSeesBusyThreads(t *testing.T) {
	pid := os.Getpid()
	before, err := Measure("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	if before.Process < before.Threads {
		t.Errorf("process clock %d < live threads %d", before.Process, before.Threads)
	}
	// A goroutine locked to its thread that returns without unlocking:
	// the runtime ends that thread.
	// The runtime never ends the process's main thread: a goroutine that
	// lands there unlocks and another one tries.
	for try := 0; ; try++ {
		ended := make(chan bool)
		go func() {
			runtime.LockOSThread()
			if syscall.Gettid() == pid {
				runtime.UnlockOSThread()
				ended <- false
				return
			}
			spin(t, 200*time.Millisecond)
			ended <- true
		}()
		if <-ended {
			break
		}
		if try == 100 {
			t.Skip("every goroutine ran on the main thread")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		after, err := Measure("/proc", pid)
		if err != nil {
			t.Fatal(err)
		}
		grew := after.Process - before.Process
		if grew < 150*time.Millisecond.Nanoseconds() {
			t.Fatalf("process clock grew by %v after 200ms of spinning", time.Duration(grew))
		}
		// Once the thread is gone its time is in the process clock only.
		if after.Process-after.Threads >= 150*time.Millisecond.Nanoseconds() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("exited thread's time not seen: process %d, threads %d", after.Process, after.Threads)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestChildren: a forked child's CPU counts while it runs and after it is reaped.
func TestChildren(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	before, err := Measure("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	after, err := Measure("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.Children-before.Children < 10*time.Millisecond.Nanoseconds() {
		t.Errorf("children grew by %v after a busy child", time.Duration(after.Children-before.Children))
	}
}
