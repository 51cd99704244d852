package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

var (
	t0  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pol = cache.Policy{SuccessMax: 30 * time.Second, DenialMax: 30 * time.Second}
	fp  = func([]byte, uint8) (uint64, uint16) { return 7, 0 }
	sec = int64(time.Second)
)

// question parses a client query for name A.
func question(name string) (*wire.Query, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, _ := m.Pack()
	q := new(wire.Query)
	return q, wire.ParseQuery(b, q)
}

// fill is a cache holding n names, each answered 192.0.2.1 for 30 s (an
// hour more stale), stored at now.
func fill(n int, now int64) (*cache.Cache, []*wire.Query, error) {
	c := cache.New(cache.Config{SuccessCapacity: n + 1})
	var qs []*wire.Query
	for i := range n {
		name := fmt.Sprintf("n%d.example.", i)
		q, err := question(name)
		if err != nil {
			return nil, nil, err
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.Response = true
		rr, _ := dns.NewRR(name + " 30 IN A 192.0.2.1")
		m.Answer = append(m.Answer, rr)
		b, _ := m.Pack()
		e, err := cache.BuildStale(b, q, pol, time.Second, time.Hour, now)
		if err != nil || !c.Put(e) {
			return nil, nil, fmt.Errorf("entry %d: %v", i, err)
		}
		qs = append(qs, q)
	}
	return c, qs, nil
}

func filled(t testing.TB, n int, now int64) (*cache.Cache, []*wire.Query) {
	t.Helper()
	c, qs, err := fill(n, now)
	if err != nil {
		t.Fatal(err)
	}
	return c, qs
}

// ttl is the TTL a hit on q at now shows, -1 on a miss.
func ttl(t *testing.T, c *cache.Cache, q *wire.Query, now int64) int {
	t.Helper()
	e, _ := c.Get(q, now)
	if e == nil {
		return -1
	}
	m := new(dns.Msg)
	if err := m.Unpack(e.Write(nil, q, now, 512, 1232)); err != nil {
		t.Fatal(err)
	}
	return int(m.Answer[0].Header().Ttl)
}

var boot1 = [16]byte{1, 2, 3}

// TestWriteLoad: what is written is loaded, each entry with the TTL its
// true age leaves it, whichever way the wall clock moved meanwhile; an
// entry expires when it would have.
func TestWriteLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.snapshot")
	c, qs := filled(t, 1000, t0.UnixNano())
	at := Times{Wall: t0.UnixNano() + 5*sec, Boot: 1000 * sec, BootID: boot1}
	w, err := Write(path, c, at, fp, 8<<20)
	if err != nil || w.Entries != 1000 {
		t.Fatalf("wrote %+v, %v", w, err)
	}
	if st, _ := os.Stat(path); st.Size() != w.Bytes || st.Mode().Perm() != 0o600 {
		t.Fatalf("file of %d bytes, mode %v; wrote %d", st.Size(), st.Mode(), w.Bytes)
	}
	for _, tc := range []struct {
		name string
		wall int64 // the wall clock's move
	}{{"wall clock in step", 10 * sec}, {"wall clock stepped back an hour", 10*sec - 3600*sec}, {"wall clock a day behind", -86400 * sec}} {
		t.Run(tc.name, func(t *testing.T) {
			now := Times{Wall: at.Wall + tc.wall, Boot: at.Boot + 10*sec, BootID: boot1}
			nw := cache.New(cache.Config{})
			l, err := Load(path, nw, now, fp, 8<<20)
			if err != nil || l.Kept != 1000 || l.Age != 10*time.Second || l.Bytes != w.Bytes {
				t.Fatalf("loaded %+v, %v", l, err)
			}
			// Stored at t0, 15 s old: 15 s of 30 left.
			if got := ttl(t, nw, qs[3], now.Wall); got != 15 {
				t.Fatalf("TTL %d, want 15", got)
			}
			if got := ttl(t, nw, qs[3], now.Wall+15*sec); got != -1 {
				t.Fatalf("alive (TTL %d) past its TTL", got)
			}
		})
	}
	// The wall clock ran ahead of the boot clock: the entries are as old
	// as the wall clock says, the longer.
	now := Times{Wall: at.Wall + 20*sec, Boot: at.Boot + 10*sec, BootID: boot1}
	nw := cache.New(cache.Config{})
	if l, err := Load(path, nw, now, fp, 8<<20); err != nil || l.Kept != 1000 || ttl(t, nw, qs[0], now.Wall) != 5 {
		t.Fatalf("loaded %+v, %v, TTL %d; want 5", l, err, ttl(t, nw, qs[0], now.Wall))
	}
}

// TestAge: the snapshot's age on the clocks that can tell it.
func TestAge(t *testing.T) {
	w := Times{Wall: 100 * sec, Boot: 50 * sec, BootID: boot1}
	other := [16]byte{9}
	for _, tc := range []struct {
		name string
		now  Times
		age  int64
		ok   bool
	}{
		{"both clocks agree", Times{Wall: 110 * sec, Boot: 60 * sec, BootID: boot1}, 10 * sec, true},
		{"wall stepped back", Times{Wall: 90 * sec, Boot: 60 * sec, BootID: boot1}, 10 * sec, true},
		{"wall stepped forward", Times{Wall: 200 * sec, Boot: 60 * sec, BootID: boot1}, 100 * sec, true},
		{"boot clock back in one boot", Times{Wall: 110 * sec, Boot: 40 * sec, BootID: boot1}, 0, false},
		{"another boot, wall forward", Times{Wall: 300 * sec, Boot: 5 * sec, BootID: other}, 200 * sec, true},
		{"another boot, wall back", Times{Wall: 90 * sec, Boot: 5 * sec, BootID: other}, 0, false},
		{"no boot id", Times{Wall: 110 * sec}, 10 * sec, true},
	} {
		if age, ok := Age(w, tc.now); age != tc.age || ok != tc.ok {
			t.Errorf("%s: age %v %v, want %v %v", tc.name, time.Duration(age), ok, time.Duration(tc.age), tc.ok)
		}
	}
	nw := cache.New(cache.Config{})
	path := filepath.Join(t.TempDir(), "s")
	c, _ := filled(t, 10, w.Wall)
	if _, err := Write(path, c, w, fp, 1<<20); err != nil {
		t.Fatal(err)
	}
	if l, err := Load(path, nw, Times{Wall: 90 * sec, BootID: [16]byte{9}}, fp, 1<<20); !errors.Is(err, ErrClock) || l.Kept != 0 {
		t.Fatalf("a snapshot of unknown age: %+v %v", l, err)
	}
}

// TestLoadOnlyWholeFiles: a file cut anywhere, with a byte changed, or
// with bytes after it, loads nothing; one over the bound is refused.
func TestLoadOnlyWholeFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.snapshot")
	c, _ := filled(t, 300, t0.UnixNano())
	at := Times{Wall: t0.UnixNano(), Boot: sec, BootID: boot1}
	if _, err := Write(path, c, at, fp, 1<<20); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	bad := filepath.Join(dir, "bad")
	try := func(what string, b []byte, want error) {
		t.Helper()
		if err := os.WriteFile(bad, b, 0o600); err != nil {
			t.Fatal(err)
		}
		nw := cache.New(cache.Config{})
		if l, err := Load(bad, nw, at, fp, 1<<20); !errors.Is(err, want) || l.Kept != 0 || nw.Stats().Entries[cache.Success] != 0 {
			t.Fatalf("%s: loaded %+v, %v; want nothing and %v", what, l, err, want)
		}
	}
	for cut := 0; cut < len(good); cut++ {
		if cut > headerLen+64 && cut < len(good)-trailerLen-64 {
			// Every cut of the header, the trailer and next to them; here
			// and there between.
			cut = min(cut+rand.IntN(400), len(good)-trailerLen-64)
		}
		try(fmt.Sprintf("cut at %d of %d", cut, len(good)), good[:cut], ErrCorrupt)
	}
	for range 50 {
		b := bytes.Clone(good)
		i := rand.IntN(len(b))
		b[i] ^= byte(1 + rand.IntN(255))
		try(fmt.Sprintf("byte %d changed", i), b, ErrCorrupt)
	}
	try("a byte more", append(bytes.Clone(good), 0), ErrCorrupt)
	// Writable by others, or another user's: not what Write leaves.
	if err := os.WriteFile(bad, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bad, 0o666); err != nil {
		t.Fatal(err)
	}
	notOurs := func(what string) {
		t.Helper()
		nw := cache.New(cache.Config{})
		if l, err := Load(bad, nw, at, fp, 1<<20); !errors.Is(err, ErrNotOurs) || l.Kept != 0 {
			t.Fatalf("%s: loaded %+v, %v", what, l, err)
		}
	}
	notOurs("mode 0666")
	if os.Geteuid() == 0 {
		_ = os.Chmod(bad, 0o600)
		if err := os.Chown(bad, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		notOurs("owned by nobody")
	}
	nw := cache.New(cache.Config{})
	if _, err := Load(path, nw, at, fp, int64(len(good)-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "none"), nw, at, fp, 1<<20); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no file: %v", err)
	}
}

// TestBound: the file never exceeds its bound, and a small bound keeps
// some of every part of the cache.
func TestBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.snapshot")
	c, qs := filled(t, 5000, t0.UnixNano())
	at := Times{Wall: t0.UnixNano(), Boot: sec, BootID: boot1}
	for _, bound := range []int64{64 << 10, 256 << 10} {
		w, err := Write(path, c, at, fp, bound)
		if err != nil || w.Bytes > bound || w.Entries == 0 || w.Entries >= 5000 {
			t.Fatalf("bound %d: %+v %v", bound, w, err)
		}
		nw := cache.New(cache.Config{})
		if l, err := Load(path, nw, at, fp, bound); err != nil || l.Kept != w.Entries {
			t.Fatalf("bound %d: loaded %+v %v", bound, l, err)
		}
		kept := 0
		for _, q := range qs {
			if e, _ := nw.Get(q, at.Wall); e != nil {
				kept++
			}
		}
		t.Logf("bound %d KiB: %d entries, %d bytes (%d bytes an entry)", bound>>10, w.Entries, w.Bytes, w.Bytes/int64(w.Entries))
	}
}

// writerEnv makes the test binary a process that writes snapshots of a
// full cache to the path it names, over and over, until killed.
const writerEnv = "NLD_SNAPSHOT_WRITER"

// killedEntries: the writer's cache (a write takes about a millisecond).
const killedEntries = 5000

func TestMain(m *testing.M) {
	if path := os.Getenv(writerEnv); path != "" {
		c, _, err := fill(killedEntries, t0.UnixNano())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		at := Times{Wall: t0.UnixNano(), Boot: sec, BootID: boot1}
		for i := 0; ; i++ {
			if _, err := Write(path, c, at, fp, 8<<20); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if i == 0 {
				fmt.Println("written")
			}
		}
	}
	os.Exit(m.Run())
}

// TestKilledWriterNeverLeavesABadFile: a writer SIGKILLed at any moment
// leaves the last whole snapshot, never one that loads with part of the
// entries or fails as corrupt; Clean removes what it left.
func TestKilledWriterNeverLeavesABadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.snapshot")
	for round := range 6 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), writerEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// After its first whole snapshot, anywhere in the next ones (a
		// few ms each, back to back).
		line := make([]byte, 8)
		if _, err := io.ReadFull(out, line); err != nil || string(line) != "written\n" {
			t.Fatalf("writer: %q %v", line, err)
		}
		time.Sleep(time.Duration(rand.IntN(30000)) * time.Microsecond)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		nw := cache.New(cache.Config{})
		l, err := Load(path, nw, Times{Wall: t0.UnixNano(), Boot: sec, BootID: boot1}, fp, 8<<20)
		if err != nil || l.Kept != killedEntries {
			t.Fatalf("round %d: a snapshot of %d entries of %d: %v", round, l.Kept, killedEntries, err)
		}
	}
	left, _ := filepath.Glob(path + tmpInfix + "*")
	// A live writer's temporary file, locked: Clean leaves it.
	live, err := os.CreateTemp(dir, filepath.Base(path)+tmpInfix+"*")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := unix.Flock(int(live.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if n := Clean(path); n != len(left) {
		t.Fatalf("Clean removed %d of %d files left", n, len(left))
	}
	if _, err := os.Stat(live.Name()); err != nil {
		t.Fatalf("Clean removed a live writer's file: %v", err)
	}
	_ = os.Remove(live.Name())
	if rest, _ := filepath.Glob(path + tmpInfix + "*"); len(rest) != 0 {
		t.Fatalf("left: %v", rest)
	}
	if len(left) == 0 {
		t.Log("no kill landed inside a write")
	}
	t.Logf("6 kills: %d inside a write (a temporary file left)", len(left))
}

// BenchmarkWrite is one snapshot of a cache of 20,000 names (the default
// capacities' order) on the test's temporary directory.
func BenchmarkWrite(b *testing.B) {
	path := filepath.Join(b.TempDir(), "cache.snapshot")
	c, _ := filled(b, 20000, t0.UnixNano())
	at := Times{Wall: t0.UnixNano(), Boot: sec, BootID: boot1}
	b.ReportAllocs()
	var w Written
	cpu := processCPU(b)
	for b.Loop() {
		var err error
		if w, err = Write(path, c, at, fp, 8<<20); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(w.Bytes), "bytes/snapshot")
}

// processCPU is the scheduler time of every thread of the process (ns).
func processCPU(b *testing.B) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return ts.Nano()
}

// BenchmarkLoad is the start of an instance with that snapshot.
func BenchmarkLoad(b *testing.B) {
	path := filepath.Join(b.TempDir(), "cache.snapshot")
	c, _ := filled(b, 20000, t0.UnixNano())
	at := Times{Wall: t0.UnixNano(), Boot: sec, BootID: boot1}
	if _, err := Write(path, c, at, fp, 8<<20); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		nw := cache.New(cache.Config{SuccessCapacity: 20000})
		if l, err := Load(path, nw, at, fp, 8<<20); err != nil || l.Kept != 20000 {
			b.Fatal(l, err)
		}
	}
}
