package config

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults for zero WatchConfig fields.
const (
	// DefaultWatchInterval: the fallback re-read when no event came (a
	// filesystem without inotify, an overflowed queue, a directory that
	// did not exist yet). 10 s keeps a missed change well under the
	// stock node-cache's minute of lag while costing two small reads.
	DefaultWatchInterval = 10 * time.Second
	// DefaultWatchSettle: the kubelet's update is a burst of events (new
	// directory, files, ..data_tmp, rename, old directory removed); one
	// re-read after the burst is enough. Far below the 2 s we promise.
	DefaultWatchSettle = 50 * time.Millisecond
)

// WatchConfig says what a Watcher watches.
type WatchConfig struct {
	// Paths are files or directories. For each, the directory holding it
	// is watched for events on its name (so a file replaced by rename, a
	// directory created later, or a retargeted symlink is seen), the
	// directory holding its symlink target likewise, and a path that is a
	// directory is watched as a whole (the kubelet's ..data swap is a
	// rename inside it).
	Paths    []string
	Interval time.Duration // periodic wake-up; DefaultWatchInterval when 0
	Settle   time.Duration // quiet time after an event before waking; DefaultWatchSettle when 0
	Logger   *slog.Logger  // nil: discard
}

// Watcher wakes its owner, through C, when files it watches may have
// changed: after inotify events (once they settle) and every Interval as a
// fallback. It never reads the files: the owner re-reads and compares, so
// a spurious wake-up costs only a read. One wake-up is sent as soon as the
// watches are in place, so a change made before is not missed.
type Watcher struct {
	// C receives a value after a possible change; at most one is pending.
	C <-chan struct{}

	c                  chan struct{}
	cfg                WatchConfig
	log                *slog.Logger
	fd                 int      // inotify descriptor, for adding watches (never f.Fd(): that makes it blocking)
	file               *os.File // fd for reading; nil when inotify is unavailable
	mu                 sync.Mutex
	dirs               map[int32]*watchedDir // by watch descriptor
	kick               chan struct{}         // events from the reader, buffered 1
	stop               chan struct{}
	loopDone, readDone sync.WaitGroup
	close              sync.Once
}

// watchedDir is one inotify watch: events for names (or any name when all).
type watchedDir struct {
	path  string
	all   bool
	names map[string]bool
}

// watchMask: every way a file in a directory comes, goes or changes, and
// the directory itself going away.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR

// NewWatcher starts watching. Without inotify (or past the instance limit)
// it logs one line and falls back to the periodic wake-up.
func NewWatcher(cfg WatchConfig) *Watcher {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultWatchInterval
	}
	if cfg.Settle <= 0 {
		cfg.Settle = DefaultWatchSettle
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := make(chan struct{}, 1)
	w := &Watcher{
		C: c, c: c, cfg: cfg, log: log,
		dirs: map[int32]*watchedDir{},
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		log.Warn("no inotify; re-reading only periodically", "paths", cfg.Paths, "interval", cfg.Interval, "err", err)
	} else {
		// Non-blocking: os.NewFile puts it in the runtime poller, so Close
		// ends a pending Read.
		w.fd, w.file = fd, os.NewFile(uintptr(fd), "inotify")
		w.readDone.Add(1)
		go w.read()
	}
	w.sync()
	w.wake()
	w.loopDone.Add(1)
	go w.loop()
	return w
}

// Close stops the watcher and waits for its goroutines.
func (w *Watcher) Close() {
	w.close.Do(func() {
		close(w.stop)
		w.loopDone.Wait() // no add on the descriptor after this
		if w.file != nil {
			_ = w.file.Close() // ends the pending Read
		}
	})
	w.readDone.Wait()
}

func (w *Watcher) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

func (w *Watcher) loop() {
	defer w.loopDone.Done()
	tick := time.NewTicker(w.cfg.Interval)
	defer tick.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.kick:
			settle.Reset(w.cfg.Settle)
		case <-settle.C:
			w.sync()
			w.wake()
		case <-tick.C:
			w.sync()
			w.wake()
		}
	}
}

// sync adds watches for what the paths name now: directories that
// appeared and new symlink targets. Watches on directories that no longer
// matter stay; their events only cause a harmless re-read.
func (w *Watcher) sync() {
	if w.file == nil {
		return
	}
	for _, p := range w.cfg.Paths {
		w.add(filepath.Dir(p), filepath.Base(p))
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			w.add(p, "")
		}
		if t, err := filepath.EvalSymlinks(p); err == nil && t != filepath.Clean(p) {
			w.add(filepath.Dir(t), filepath.Base(t))
			if st, err := os.Stat(t); err == nil && st.IsDir() {
				w.add(t, "")
			}
		}
	}
}

// add watches dir for events on name, or on every name when name is "".
// A directory that does not exist yet is skipped: its parent's watch or the
// periodic sync adds it later.
func (w *Watcher) add(dir, name string) {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.dirs[int32(wd)]
	if d == nil || d.path != dir {
		d = &watchedDir{path: dir, names: map[string]bool{}}
		w.dirs[int32(wd)] = d
	}
	if name == "" {
		d.all = true
	} else {
		d.names[name] = true
	}
}

// read turns inotify events that concern a watched name into kicks.
func (w *Watcher) read() {
	defer w.readDone.Done()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				select {
				case <-w.stop:
				default:
					w.log.Warn("inotify read failed; re-reading only periodically", "err", err)
				}
			}
			return
		}
		if w.relevant(buf[:n]) {
			select {
			case w.kick <- struct{}{}:
			default:
			}
		}
	}
}

// relevant parses a batch of events and reports whether any concerns a
// watched name, a watched directory as a whole, or the watches themselves
// (a removed directory, an overflowed queue).
func (w *Watcher) relevant(b []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	hit := false
	for len(b) >= unix.SizeofInotifyEvent {
		// struct inotify_event { int wd; uint32 mask, cookie, len; char name[]; }
		wd := int32(binary.NativeEndian.Uint32(b[0:]))
		mask := binary.NativeEndian.Uint32(b[4:])
		size := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
		if size > len(b) {
			break
		}
		name := ""
		if size > unix.SizeofInotifyEvent {
			raw := b[unix.SizeofInotifyEvent:size]
			for i, c := range raw {
				if c == 0 {
					raw = raw[:i]
					break
				}
			}
			name = string(raw)
		}
		b = b[size:]
		switch {
		case mask&unix.IN_Q_OVERFLOW != 0:
			hit = true
		case mask&unix.IN_IGNORED != 0:
			delete(w.dirs, wd) // the directory is gone; sync re-adds it if it comes back
			hit = true
		case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
			hit = true
		default:
			if d := w.dirs[wd]; d != nil && (d.all || d.names[name]) {
				hit = true
			}
		}
	}
	return hit
}

// String names what is watched, for logs.
func (w *Watcher) String() string {
	return fmt.Sprintf("%v every %v", w.cfg.Paths, w.cfg.Interval)
}
