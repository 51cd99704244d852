// Package snapshot keeps a copy of the cache in a file, so that an
// instance that starts after a crash, with no twin to hand it the cache,
// starts warm (issue 42). It owns that file: its format, writing it
// atomically, reading it back whole and checksummed, and the clock
// arithmetic that keeps every entry within its TTL across a restart.
//
// It decides nothing about when to write or where (internal/daemon: the
// state directory, every few seconds when the cache changed), checks no
// entry itself (cache.Import checks each as strictly as an upstream
// answer, and drops those whose policy changed), opens no socket and logs
// nothing.
package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
)

// The file is
//
//	magic "NLDCACHE", FormatVersion (4 bytes),
//	when it was written: the cache's clock (unix ns), CLOCK_BOOTTIME (ns)
//	    and the kernel's boot id (16 bytes): see Times,
//	the cache's export stream (cache.Export: its own version, entries, end),
//	the length of all of the above (8 bytes), its CRC-32C (4 bytes), "END!".
//
// A file is loaded only whole: the trailer's length and checksum must
// match, so a file cut short (a full disk, a writer killed on a file
// system where rename is not atomic) or changed is never loaded.
const (
	magic         = "NLDCACHE"
	trailerMagic  = "END!"
	FormatVersion = 1
	headerLen     = len(magic) + 4 + 8 + 8 + 16
	trailerLen    = 8 + 4 + len(trailerMagic)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of Load.
var (
	// ErrCorrupt: the file is not a whole snapshot of this format.
	ErrCorrupt = errors.New("not a whole cache snapshot")
	// ErrClock: the clocks cannot say how old the snapshot is (the wall
	// clock is behind the time it was written, and the snapshot is from
	// another boot, or the boot clock went back): nothing is loaded.
	ErrClock = errors.New("the clock went back since the snapshot was written")
	// ErrTooLarge: the file is larger than the bound it is read with.
	ErrTooLarge = errors.New("cache snapshot larger than the bound")
	// ErrNotOurs: the file is not what Write leaves: owned by another
	// user, or writable by others.
	ErrNotOurs = errors.New("cache snapshot not owned by this user or writable by others")
)

// Times is a moment on the clocks a snapshot is aged by.
type Times struct {
	// Wall is the cache's clock (unix ns): the entries' times are on it.
	Wall int64
	// Boot is CLOCK_BOOTTIME (ns): it counts on across a process restart
	// and never steps, unlike the wall clock, but only within one boot.
	Boot int64
	// BootID names the kernel's boot (/proc/sys/kernel/random/boot_id);
	// zero when unknown.
	BootID [16]byte
}

// Age is how long ago (ns) the moment written was, seen at now: on the
// boot clock and the wall clock both when both are comparable, the longer
// of the two, so no entry outlives its TTL by either; ok is false when
// neither can say.
func Age(written, now Times) (age int64, ok bool) {
	wall := now.Wall - written.Wall
	if written.BootID != ([16]byte{}) && written.BootID == now.BootID {
		boot := now.Boot - written.Boot
		if boot < 0 {
			return 0, false
		}
		return max(wall, boot), true
	}
	if wall < 0 {
		return 0, false
	}
	return wall, true
}

// Written says what Write wrote.
type Written struct {
	Entries int
	Bytes   int64
}

// Write writes the entries of c usable at now.Wall to path, at most
// maxBytes in all, atomically: a temporary file in the same directory,
// synced, renamed over path. A reader sees the old file or the new one,
// whole; a writer killed midway leaves a temporary file (Clean removes
// it), never a damaged path.
func Write(path string, c *cache.Cache, now Times, fp cache.Fingerprint, maxBytes int64) (Written, error) {
	var w Written
	if maxBytes < int64(headerLen+trailerLen+8) {
		return w, fmt.Errorf("cache snapshot: a bound of %d bytes holds nothing", maxBytes)
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+tmpInfix+"*")
	if err != nil {
		return w, err
	}
	// Held while it is written: Clean removes a temporary file only when
	// its writer is gone (the kernel drops the lock with the process).
	_ = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	defer func() {
		if f != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	crc := crc32.New(castagnoli)
	out := io.MultiWriter(f, crc)
	hdr := make([]byte, 0, headerLen)
	hdr = append(hdr, magic...)
	hdr = binary.BigEndian.AppendUint32(hdr, FormatVersion)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(now.Wall))
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(now.Boot))
	hdr = append(hdr, now.BootID[:]...)
	if _, err := out.Write(hdr); err != nil {
		return w, err
	}
	cw := &countWriter{w: out}
	if w.Entries, err = c.Export(cw, now.Wall, fp, maxBytes-int64(headerLen+trailerLen)); err != nil {
		return w, err
	}
	n := int64(headerLen) + cw.n
	tr := binary.BigEndian.AppendUint64(make([]byte, 0, trailerLen), uint64(n))
	tr = binary.BigEndian.AppendUint32(tr, crc.Sum32())
	tr = append(tr, trailerMagic...)
	if _, err := f.Write(tr); err != nil {
		return w, err
	}
	// On a tmpfs (the state directory's /run) Sync costs nothing; on a
	// disk it keeps a power loss from renaming a file whose data is not
	// there yet (the checksum would refuse it anyway).
	if err := f.Sync(); err != nil {
		return w, err
	}
	if err := f.Close(); err != nil {
		return w, err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return w, err
	}
	f = nil
	w.Bytes = n + int64(trailerLen)
	return w, nil
}

// tmpInfix names a snapshot being written: path + tmpInfix + random.
const tmpInfix = ".tmp-"

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Loaded says what Load did.
type Loaded struct {
	cache.ImportStats
	// Age is how old the snapshot was (Age of its Times).
	Age time.Duration
	// Bytes is the file's size.
	Bytes int64
}

// Load reads the snapshot at path, whole, and imports into c the entries
// still usable at now (fresh, or within their stale window) whose policy
// is the importer's (fp), each checked by cache.Import. Their times are
// moved by what the wall clock and the snapshot's age disagree on, so a
// hit's TTLs count down from each entry's true age. A missing file is
// os.ErrNotExist; one another user owns, or others may write, ErrNotOurs;
// a file that is not whole ErrCorrupt; one larger than maxBytes
// ErrTooLarge; one whose age is unknown ErrClock.
func Load(path string, c *cache.Cache, now Times, fp cache.Fingerprint, maxBytes int64) (Loaded, error) {
	var l Loaded
	f, err := os.Open(path)
	if err != nil {
		return l, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return l, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return l, fmt.Errorf("%w (uid %d, mode %o)", ErrNotOurs, st.Uid, st.Mode&0o7777)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return l, err
	}
	l.Bytes = int64(len(b))
	if l.Bytes > maxBytes {
		return l, fmt.Errorf("%w (%d bytes)", ErrTooLarge, maxBytes)
	}
	written, stream, err := parse(b)
	if err != nil {
		return l, err
	}
	age, ok := Age(written, now)
	if !ok {
		return l, ErrClock
	}
	l.Age = time.Duration(age)
	// The entries' times are on the writer's wall clock; at now its
	// reading would be written.Wall+age.
	shift := now.Wall - (written.Wall + age)
	l.ImportStats, err = c.ImportShifted(bytes.NewReader(stream), now.Wall, shift, fp)
	return l, err
}

// parse checks the file b and returns its times and its export stream.
func parse(b []byte) (Times, []byte, error) {
	var t Times
	if len(b) < headerLen+trailerLen || string(b[:len(magic)]) != magic || string(b[len(b)-len(trailerMagic):]) != trailerMagic {
		return t, nil, ErrCorrupt
	}
	if v := binary.BigEndian.Uint32(b[len(magic):]); v != FormatVersion {
		return t, nil, fmt.Errorf("%w: format %d, ours %d", ErrCorrupt, v, FormatVersion)
	}
	body := b[:len(b)-trailerLen]
	tr := b[len(body):]
	if binary.BigEndian.Uint64(tr) != uint64(len(body)) || binary.BigEndian.Uint32(tr[8:]) != crc32.Checksum(body, castagnoli) {
		return t, nil, fmt.Errorf("%w: length or checksum differ", ErrCorrupt)
	}
	h := b[len(magic)+4:]
	t.Wall = int64(binary.BigEndian.Uint64(h))
	t.Boot = int64(binary.BigEndian.Uint64(h[8:]))
	copy(t.BootID[:], h[16:32])
	return t, body[headerLen:], nil
}

// Clean removes what writers killed midway left next to path: temporary
// files nobody holds locked (a live writer's, a twin's, is). It returns
// how many it removed.
func Clean(path string) int {
	dir, base := filepath.Dir(path), filepath.Base(path)+tmpInfix
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), base) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil && os.Remove(name) == nil {
			n++
		}
		_ = f.Close()
	}
	return n
}
