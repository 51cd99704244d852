// Command cpuns prints the CPU time processes have used so far, in
// nanoseconds of scheduler time rather than 10 ms ticks, so that bench/run.sh
// can tell CPU per query to the microsecond from a few seconds of load.
//
// For each PID it prints one line:
//
//		PID TOTAL_NS PROCESS_NS THREADS_NS CHILDREN_NS
//
//	  - THREADS_NS: the first field of /proc/PID/task/*/schedstat (time on CPU,
//	    ns) summed over the threads alive now.
//	  - PROCESS_NS: the process's CPU clock (clock_gettime on
//	    clock_getcpuclockid(PID)): the same scheduler time, summed by the
//	    kernel over every thread, including threads that have exited (a Go
//	    runtime rarely ends threads, but it may). PROCESS_NS ≥ THREADS_NS; the
//	    difference is the exited threads.
//	  - CHILDREN_NS: processes the PID forked (dnsmasq forks one per TCP
//	    connection): the CPU clocks of its live descendants, plus its reaped
//	    children from /proc/PID/stat (cutime + cstime, whose resolution is the
//	    10 ms tick: the kernel keeps no finer sum for reaped children).
//	  - TOTAL_NS = PROCESS_NS + CHILDREN_NS, what the bench subtracts.
//
// A PID that is gone prints "PID gone".
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on every Linux
// architecture the bench runs on (sysconf(_SC_CLK_TCK)).
const userHZ = 100

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cpuns PID...")
		os.Exit(2)
	}
	status := 0
	for _, a := range os.Args[1:] {
		pid, err := strconv.Atoi(a)
		if err != nil || pid <= 0 {
			fmt.Fprintf(os.Stderr, "cpuns: bad pid %q\n", a)
			status = 2
			continue
		}
		u, err := Measure("/proc", pid)
		if err != nil {
			fmt.Printf("%d gone\n", pid)
			status = 1
			continue
		}
		fmt.Printf("%d %d %d %d %d\n", pid, u.Total(), u.Process, u.Threads, u.Children)
	}
	os.Exit(status)
}

// Usage is one process's CPU time so far, in ns.
type Usage struct {
	Process  int64 // CPU clock of the thread group, exited threads included
	Threads  int64 // sum of the live threads' schedstat
	Children int64 // live descendants' CPU clocks + reaped children's ticks
}

// Total is what the process and the children it forked have used.
func (u Usage) Total() int64 { return u.Process + u.Children }

// Measure reads pid's usage from the proc file system mounted at proc.
func Measure(proc string, pid int) (Usage, error) {
	var u Usage
	var err error
	if u.Threads, err = ThreadsNS(proc, pid); err != nil {
		return u, err
	}
	if u.Process, err = ProcessClock(pid); err != nil {
		return u, err
	}
	reaped, err := reapedNS(proc, pid)
	if err != nil {
		return u, err
	}
	u.Children = reaped
	for _, c := range descendants(proc, pid) {
		if ns, err := ProcessClock(c); err == nil {
			u.Children += ns
		}
	}
	return u, nil
}

// ThreadsNS sums the first field of /proc/PID/task/*/schedstat: the time
// each live thread has spent on a CPU, in ns.
func ThreadsNS(proc string, pid int) (int64, error) {
	files, err := filepath.Glob(filepath.Join(proc, strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil {
		return 0, err
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("pid %d: no threads", pid)
	}
	var sum int64
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited since the glob
		}
		ns, err := FirstField(string(b))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
		sum += ns
	}
	return sum, nil
}

// FirstField parses the first field of a schedstat line ("ns_on_cpu
// ns_waiting timeslices").
func FirstField(s string) (int64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("empty schedstat")
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// ProcessClock reads pid's CPU-time clock: CLOCK_PROCESS_CPUTIME_ID of
// another process, the clockid clock_getcpuclockid(3) makes: (~pid << 3) |
// CPUCLOCK_SCHED (2), the scheduler's sum_exec_runtime over all threads.
func ProcessClock(pid int) (int64, error) {
	clock := (^int64(pid) << 3) | 2
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, uintptr(clock), uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		return 0, errno
	}
	return ts.Nano(), nil
}

// reapedNS is cutime + cstime of /proc/PID/stat in ns: the CPU time of the
// children pid has waited for.
func reapedNS(proc string, pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return ReapedFromStat(string(b))
}

// ReapedFromStat parses cutime + cstime (fields 16 and 17) of a
// /proc/PID/stat line into ns. The command name (field 2) may hold spaces
// and parentheses: fields are counted after its last ')'.
func ReapedFromStat(s string) (int64, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat line")
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, fmt.Errorf("stat line has %d fields after the name", len(f))
	}
	var ticks int64
	for _, k := range []int{16, 17} {
		v, err := strconv.ParseInt(f[k-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %d: %w", k, err)
		}
		ticks += v
	}
	return ticks * (1e9 / userHZ), nil
}

// descendants lists pid's live child processes and theirs, from
// /proc/PID/task/*/children.
func descendants(proc string, pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		files, _ := filepath.Glob(filepath.Join(proc, strconv.Itoa(p), "task", "*", "children"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(c); err == nil {
					out = append(out, n)
					queue = append(queue, n)
				}
			}
		}
	}
	return out
}
