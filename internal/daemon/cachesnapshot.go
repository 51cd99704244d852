package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/snapshot"
)

// Warm after a crash, too (issue 42): a rollout hands the cache to the
// twin (cachehandover.go), a crash hands it to nobody. So the cache is
// also kept in a file (-cache-snapshot-dir, the manifest's pod-private
// emptyDir; by default <state-dir>/<group>/cache.snapshot;
// internal/snapshot): written every -cache-snapshot-interval when it
// changed and at exit, and loaded by an instance that starts without a
// twin's cache, each entry checked as an upstream answer, aged by the
// boot clock (which a restart does not reset and no NTP step moves), and
// dropped when its policy is not this configuration's.

// snapshotFile is the snapshot's name in the group's directory.
const snapshotFile = "cache.snapshot"

// A crash loop must not be fed the same cache: an instance that loads the
// snapshot leaves snapshotLoadedFile until it has served snapshotProbation
// (or exits cleanly). A start that finds it knows the last instance to load
// the snapshot died young, perhaps of what it loaded: it starts empty,
// and writes its own snapshot from what it caches.
const (
	snapshotLoadedFile = "cache.snapshot.loaded"
	snapshotProbation  = time.Minute
)

// snapshots is the writer of the cache snapshot.
type snapshots struct {
	path      string
	marker    string      // snapshotLoadedFile
	probation clock.Timer // removes marker; nil when nothing was loaded
	stop      chan struct{}
	done      chan struct{}
	inserts   uint64 // the cache's inserts when the file was last written
	failing   bool   // the last write failed (logged once per run of failures)
}

// startSnapshots loads the snapshot unless the cache came from a twin,
// then writes one every -cache-snapshot-interval when the cache changed.
// With the interval 0 it removes a snapshot an earlier run left.
func (d *Daemon) startSnapshots() {
	dir := d.cfg.Cache.SnapshotDir
	switch {
	case dir != "":
		if err := os.MkdirAll(dir, 0o700); err != nil {
			d.log.Error("cache snapshot directory unusable: a start after a crash will be cold", "dir", dir, "err", err)
			return
		}
	case d.reg == nil:
		return
	default:
		dir = filepath.Dir(d.reg.Path(snapshotFile))
	}
	path, marker := filepath.Join(dir, snapshotFile), filepath.Join(dir, snapshotLoadedFile)
	snapshot.Clean(path)
	if d.cfg.Cache.SnapshotInterval == 0 {
		_ = os.Remove(marker)
		if err := os.Remove(path); err == nil {
			d.log.Info("cache snapshot off: removed the one an earlier run left", "path", path)
		}
		return
	}
	s := &snapshots{path: path, marker: marker, stop: make(chan struct{}), done: make(chan struct{})}
	if !d.cacheAdopted && afterYoungDeath(s.marker) {
		d.log.Warn("the last instance that loaded the cache snapshot died within "+snapshotProbation.String()+" of starting: not loaded again, the cache starts empty",
			"path", path)
	} else if !d.cacheAdopted && d.loadSnapshot(path) {
		_ = os.WriteFile(s.marker, nil, 0o600)
		s.probation = d.clock.AfterFunc(snapshotProbation, func() { _ = os.Remove(s.marker) })
	}
	s.inserts = d.Cache.Stats().Inserts
	d.snap = s
	go d.snapshotLoop(s)
}

// afterYoungDeath reports whether marker was left (by an instance that
// loaded the snapshot and did not live out its probation), and removes it.
func afterYoungDeath(marker string) bool {
	return os.Remove(marker) == nil
}

// loadSnapshot fills the cache from the snapshot at path, with one log
// line saying what came and what was dropped, and why. It reports whether
// it kept anything.
func (d *Daemon) loadSnapshot(path string) bool {
	start := time.Now()
	l, err := snapshot.Load(path, d.Cache, snapshot.Now(d.clock.Now()), d.run.PolicyFingerprint(), d.cfg.Cache.SnapshotMaxBytes)
	d.Metrics.SnapshotLoaded(map[string]int{"kept": l.Kept, "expired": l.Expired, "policy_changed": l.Changed,
		"not_kept": l.Rejected, "invalid": l.Invalid})
	switch {
	case errors.Is(err, os.ErrNotExist):
		d.log.Info("no cache snapshot: the cache starts empty", "path", path)
		return false
	case err != nil && l.Kept+l.Dropped() == 0:
		d.log.Warn("cache snapshot not loaded: the cache starts empty", "path", path, "err", err)
		return false
	}
	args := []any{"path", path, "age", l.Age.Round(time.Millisecond), "bytes", l.Bytes, "kept", l.Kept, "expired", l.Expired,
		"policy_changed", l.Changed, "not_kept", l.Rejected, "invalid", l.Invalid, "took", time.Since(start).Round(time.Millisecond)}
	if l.Invalid > 0 {
		args = append(args, "first_invalid", l.InvalidErr)
	}
	if err != nil {
		d.log.Warn("cache snapshot loaded in part", append(args, "err", err)...)
	} else {
		d.log.Info("loaded the cache snapshot", args...)
	}
	return l.Kept > 0
}

// snapshotLoop writes the snapshot every interval when the cache changed,
// and once more when stopped.
func (d *Daemon) snapshotLoop(s *snapshots) {
	defer close(s.done)
	tm := d.clock.NewTimer(d.cfg.Cache.SnapshotInterval)
	for {
		select {
		case <-tm.C():
			d.writeSnapshot(s)
			tm.Reset(d.cfg.Cache.SnapshotInterval)
		case <-s.stop:
			tm.Stop()
			d.writeSnapshot(s)
			return
		}
	}
}

// writeSnapshot writes the snapshot if the cache took entries since the
// last one (one that only lost entries still answers right: each is
// checked against its lifetime on load), counting the CPU it takes.
func (d *Daemon) writeSnapshot(s *snapshots) {
	inserts := d.Cache.Stats().Inserts
	if inserts == s.inserts {
		return
	}
	// On one thread, so that its CPU clock is the write's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := threadCPU()
	w, err := snapshot.Write(s.path, d.Cache, snapshot.Now(d.clock.Now()), d.run.PolicyFingerprint(), d.cfg.Cache.SnapshotMaxBytes)
	d.Metrics.SnapshotWritten(w.Entries, w.Bytes, threadCPU()-cpu, err != nil)
	switch {
	case err != nil && !s.failing:
		d.log.Warn("cache snapshot not written: a start after a crash will find an older one or none", "path", s.path, "err", err)
		s.failing = true
	case err != nil:
	case s.failing:
		d.log.Info("cache snapshot written again", "path", s.path, "entries", w.Entries, "bytes", w.Bytes)
		s.failing = false
		fallthrough
	default:
		s.inserts = inserts
	}
}

// threadCPU is the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// stopSnapshots writes the last snapshot and stops the writer, within
// the shutdown's deadline (done).
func (d *Daemon) stopSnapshots(done <-chan struct{}) {
	s := d.snap
	if s == nil {
		return
	}
	d.snap = nil
	close(s.stop)
	select {
	case <-s.done:
	case <-done:
		d.log.Warn("the last cache snapshot was not written in time", "path", s.path)
	}
	if s.probation != nil && s.probation.Stop() {
		_ = os.Remove(s.marker) // a clean exit, not a crash
	}
}
