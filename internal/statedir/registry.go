// Package statedir is where instances serving the same addresses meet: the
// registry that tells a starting instance which twins serve, lets an
// exiting one decide under a lock whether to tear down, hands the link's
// ownership from twin to twin, and lets an exec probe find its instance.
// It owns the control socket's name, and who may use it: an abstract unix
// socket of the network namespace whose peers are checked both ways
// (control.go); a twin is one that answers there, not one whose files are
// in the state directory. The requests over the control socket (handover,
// cache, probes) are internal/daemon's.
package statedir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
)

// Twins are instances serving the same addresses and port in the same
// network namespace: during a rolling update (maxSurge 1, maxUnavailable 0)
// the new pod starts while the old one still serves. They meet in the
// network namespace, through their control sockets (control.go), and in
// the state directory (-state-dir, a hostPath both pods mount):
//
//	@nodelocaldns/<key>/<id>/<nonce>  instance <id>'s control socket (handover,
//	                                  probes): abstract, listed in /proc/net/unix
//	<state-dir>/<key>/              one directory per (netns, addresses, port)
//	    key                         what the key stands for, for operators
//	    group.lock                  flock held while an instance starts or
//	                                decides, on exit, whether to tear down
//	    <id>.lock                   flock held by instance <id> for its life,
//	                                naming its control socket
//	    ownership.json              link/addresses an exited twin created
//	    fallback.json               the fallback rules' counters as last
//	                                reported (FallbackSeen)
//
// key is a hash of the network namespace's inode (/proc/self/ns/net), the
// sorted addresses and the port, so instances in other namespaces (tests run
// many on one host) or on other addresses never meet. id is the PID
// namespace's inode and the PID: unique among live processes on the host,
// and an exec probe, which runs in the container's PID namespace, can find
// its own instance by it. A lock file whose flock nobody holds belongs to
// an instance that died (the kernel drops the lock with the process); it is
// removed by whoever finds it. A held one proves nothing: anyone with the
// state directory can hold a flock (control.go).
type Registry struct {
	dir     string
	key     string
	id      string
	self    *os.File // <id>.lock, flocked while we live
	control string   // our control socket's name (ListenControl)
}

// groupLockPoll is how often a waiting instance retries the group lock.
const groupLockPoll = 10 * time.Millisecond

// instanceKey names the twin group of this process for addrs and port.
func instanceKey(addrs []netip.Addr, port int) (key, desc string, err error) {
	netns, err := NSInode("net")
	if err != nil {
		return "", "", err
	}
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.Unmap().String()
	}
	slices.Sort(s)
	desc = fmt.Sprintf("netns %d, addresses %s, port %d", netns, strings.Join(s, ","), port)
	h := sha256.Sum256([]byte(desc))
	return hex.EncodeToString(h[:8]), desc, nil
}

// InstanceID is this process's id in the state directory.
func InstanceID() (string, error) {
	pidns, err := NSInode("pid")
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d-%d", pidns, os.Getpid()), nil
}

// NSInode is the inode of this process's namespace of kind ("net", "pid").
func NSInode(kind string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/"+kind, &st); err != nil {
		return 0, fmt.Errorf("%s namespace: %w", kind, err)
	}
	return st.Ino, nil
}

// Open creates the group directory and registers this instance:
// its lock file is created and locked. Call it with the group lock held
// (see LockGroup) so that a twin deciding whether to tear down sees us.
func Open(stateDir, id string, addrs []netip.Addr, port int) (*Registry, error) {
	key, desc, err := instanceKey(addrs, port)
	if err != nil {
		return nil, err
	}
	r := &Registry{dir: filepath.Join(stateDir, key), key: key, id: id}
	// sun_path holds 108 bytes, the abstract name's leading NUL included.
	if n := len(r.namePrefix(id)) + len(nonce()); n > 107 {
		return nil, fmt.Errorf("instance id %q: control socket name is %d bytes, longer than a unix socket allows (107)", id, n)
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "key")); errors.Is(err, os.ErrNotExist) {
		_ = os.WriteFile(filepath.Join(r.dir, "key"), []byte(desc+"\n"), 0o600)
	}
	return r, nil
}

func (r *Registry) lockPath(id string) string { return filepath.Join(r.dir, id+".lock") }

// sockPath is where versions before issue 41 put instance id's control
// socket; removed with a dead instance's lock file.
func (r *Registry) sockPath(id string) string { return filepath.Join(r.dir, id+".sock") }

// ID is this instance's id.
func (r *Registry) ID() string { return r.id }

// LockGroup takes the group lock, waiting at most until ctx is done. The
// returned function releases it.
func (r *Registry) LockGroup(ctx context.Context) (func(), error) {
	f, err := os.OpenFile(filepath.Join(r.dir, "group.lock"), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("group lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil // closing drops the flock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("group lock: %w", err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("group lock held by a twin: %w", ctx.Err())
		case <-time.After(groupLockPoll):
		}
	}
}

// Register creates and locks this instance's lock file, and writes info
// and the control socket's name (ListenControl first) into it.
func (r *Registry) Register(info map[string]any) error {
	f, err := os.OpenFile(r.lockPath(r.id), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return fmt.Errorf("register %s: %w (another live instance has this id)", r.id, err)
	}
	info["control"] = r.control
	b, _ := json.Marshal(info)
	_ = f.Truncate(0)
	_, _ = f.WriteAt(append(b, '\n'), 0)
	r.self = f
	return nil
}

// Unregister removes this instance's files and drops its lock.
func (r *Registry) Unregister() {
	if r.self == nil {
		return
	}
	_ = os.Remove(r.sockPath(r.id))
	_ = os.Remove(r.lockPath(r.id))
	_ = r.self.Close()
	r.self = nil
}

// Alive reports whether instance id of this group serves: its control
// socket answers as id over a checked connection (verify).
func (r *Registry) Alive(id string) bool {
	for _, c := range r.candidates(id) {
		if c.id == id {
			if _, err := c.verify(); err == nil {
				return true
			}
		}
	}
	return false
}

// Twins returns the live twins, youngest first: the instances of this
// group whose control sockets answer as theirs (verify). It also removes
// the files of dead instances (call it under the group lock).
func (r *Registry) Twins() []string {
	r.reap()
	type twin struct {
		id      string
		started time.Time
	}
	var live []twin
	for _, c := range r.candidates("") {
		if c.id == r.id || slices.ContainsFunc(live, func(t twin) bool { return t.id == c.id }) {
			continue
		}
		if started, err := c.verify(); err == nil {
			live = append(live, twin{c.id, started})
		}
	}
	slices.SortFunc(live, func(a, b twin) int { return b.started.Compare(a.started) })
	out := make([]string, len(live))
	for i, t := range live {
		out[i] = t.id
	}
	return out
}

// candidates lists the control sockets that may be instance id's (""
// every instance's) of this group: the listening names in /proc/net/unix
// (or, where it cannot be read, those the lock files name), and the socket
// files of older versions' instances. At most maxCandidates: each is
// verified before it counts.
func (r *Registry) candidates(id string) []control {
	prefix := controlPrefix + r.key + "/"
	if id != "" {
		prefix = r.namePrefix(id)
	}
	socks, ok := listening(prefix)
	if !ok {
		socks = r.recorded(prefix)
	}
	// Those with a lock file first: a process of our network namespace may
	// bind names that look like ours (it cannot write the state directory),
	// one with the state directory cannot bind them; neither can push a
	// real twin past the bound.
	slices.SortStableFunc(socks, func(a, b control) int {
		return r.locked(b.id) - r.locked(a.id)
	})
	socks = append(socks, r.legacy(id)...)
	return socks[:min(len(socks), maxCandidates)]
}

// locked is 1 when instance id has a lock file, else 0.
func (r *Registry) locked(id string) int {
	if _, err := os.Lstat(r.lockPath(id)); err == nil {
		return 1
	}
	return 0
}

// legacy lists the instances of versions before issue 41 in this group
// (id "": all): a lock file held by a live process that names no control
// socket, beside its socket file.
func (r *Registry) legacy(id string) []control {
	locks, _ := filepath.Glob(filepath.Join(r.dir, "*.lock"))
	var out []control
	for _, l := range locks {
		lid := strings.TrimSuffix(filepath.Base(l), ".lock")
		if lid == "group" || lid == r.id || id != "" && lid != id {
			continue
		}
		var rec map[string]any
		if b, err := readAtMost(l, 4096); err != nil || json.Unmarshal(b, &rec) != nil || rec["control"] != nil {
			continue
		}
		if fi, err := os.Lstat(r.sockPath(lid)); err != nil || fi.Mode()&os.ModeSocket == 0 || !held(l) {
			continue
		}
		out = append(out, control{key: r.key, id: lid, name: r.sockPath(lid), legacy: true})
	}
	return out
}

// held reports whether a live process holds the lock file's flock.
func held(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
}

// recorded lists the control sockets the lock files name, with prefix.
func (r *Registry) recorded(prefix string) []control {
	locks, _ := filepath.Glob(filepath.Join(r.dir, "*.lock"))
	var out []control
	for _, l := range locks {
		var rec struct {
			Control string `json:"control"`
		}
		b, err := readAtMost(l, 4096)
		if err != nil || json.Unmarshal(b, &rec) != nil || !strings.HasPrefix(rec.Control, prefix) {
			continue
		}
		if c, ok := parseName(rec.Control); ok && c.id+".lock" == filepath.Base(l) {
			out = append(out, c)
		}
	}
	return out
}

func readAtMost(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// reap removes the lock files (and the control socket files of versions
// before issue 41) of instances that died: nobody holds their flock.
func (r *Registry) reap() {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || id == "group" || id == r.id {
			continue
		}
		f, err := os.OpenFile(r.lockPath(id), os.O_RDWR|syscall.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil { // nobody holds it: dead
			_ = os.Remove(r.sockPath(id))
			_ = os.Remove(r.lockPath(id))
		}
		f.Close()
	}
}

// Dial connects to twin id's control socket and checks its owner
// (CheckPeer), within d.
func (r *Registry) Dial(id string, d time.Duration) (*net.UnixConn, error) {
	var errs []error
	for _, c := range r.candidates(id) {
		if c.id != id {
			continue
		}
		conn, err := c.dial(d)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("instance %s has no control socket", id)
	}
	return nil, errors.Join(errs...)
}

// Ownership of the link and addresses, handed from twin to twin so the
// last one removes what the first one added.

func (r *Registry) ownershipPath() string { return filepath.Join(r.dir, "ownership.json") }

// readOwnership reads what exited twins recorded; none is the zero
// Ownership. A file that cannot be read or decoded is an error: what it
// recorded is unknown.
func (r *Registry) readOwnership() (netsetup.Ownership, error) {
	var o netsetup.Ownership
	b, err := os.ReadFile(r.ownershipPath())
	if errors.Is(err, os.ErrNotExist) {
		return o, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &o)
	}
	if err != nil {
		return netsetup.Ownership{}, fmt.Errorf("%s: %w", r.ownershipPath(), err)
	}
	return o, nil
}

// RecordOwnership merges o into the group's ownership file. When that file
// is unreadable it is left as it is (the evidence, removed by the last
// instance's teardown) and the error returned.
func (r *Registry) RecordOwnership(o netsetup.Ownership) error {
	prev, err := r.readOwnership()
	if err != nil {
		return err
	}
	m := prev.Merge(o)
	if !m.LinkCreated && len(m.Addrs) == 0 {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := r.ownershipPath() + "." + r.id
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.ownershipPath())
}

func (r *Registry) ForgetOwnership() { _ = os.Remove(r.ownershipPath()) }

// InheritedOwnership is what the last instance removes besides its own
// additions: what exited twins recorded. When the record is unreadable it
// removes only its own: removing a link or address that another party
// created (an adopted link) would break it, while one left behind is
// harmless and removed by hand. That is logged as an error naming what to
// check.
func (r *Registry) InheritedOwnership(log *slog.Logger) netsetup.Ownership {
	o, err := r.readOwnership()
	if err != nil {
		log.Error("the twins' ownership record is unreadable: removing only what this instance added; a link or address an earlier instance created may be left (check `ip addr show` and remove it by hand)", "err", err)
	}
	return o
}

// Live returns the control sockets of the live instances of this
// process's PID namespace whose groups are under stateDir (an exec probe
// runs in its container's PID namespace and the pod's network namespace);
// pid picks one instance when several share the namespace, 0 means any.
// Each has answered as its id over a checked connection.
func Live(stateDir string, pid int) ([]string, error) {
	pidns, err := NSInode("pid")
	if err != nil {
		return nil, err
	}
	want := func(id string) bool {
		if pid > 0 {
			return id == fmt.Sprintf("%d-%d", pidns, pid)
		}
		return strings.HasPrefix(id, fmt.Sprintf("%d-", pidns))
	}
	socks, ok := listening(controlPrefix)
	if !ok {
		dirs, _ := filepath.Glob(filepath.Join(stateDir, "*"))
		socks = nil
		for _, d := range dirs {
			socks = append(socks, (&Registry{dir: d, key: filepath.Base(d)}).recorded(controlPrefix)...)
		}
	}
	var live []string
	for _, c := range socks {
		if !want(c.id) || slices.Contains(live, c.name) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(stateDir, c.key)); err != nil || !fi.IsDir() {
			continue // another state directory's
		}
		if _, err := c.verify(); err == nil {
			live = append(live, c.name)
		}
	}
	return live, nil
}

// DialName connects to the control socket name (one of Live's) and checks
// its owner (CheckPeer), within d.
func DialName(name string, d time.Duration) (*net.UnixConn, error) {
	return control{name: name}.dial(d)
}

// PID returns the PID part of an instance id.
func PID(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 {
		return id[i+1:]
	}
	return id
}

// The fallback's counters as an instance last reported them: the next one
// reports only what came after (the counters live in the kernel with the
// rules, across instances).

func (r *Registry) fallbackPath() string { return filepath.Join(r.dir, "fallback.json") }

// FallbackSeen returns the counters last recorded; none (or unreadable) is
// an empty map: everything counted is then reported.
func (r *Registry) FallbackSeen() map[netip.Addr]netsetup.Count {
	out := map[netip.Addr]netsetup.Count{}
	b, err := os.ReadFile(r.fallbackPath())
	if err == nil {
		_ = json.Unmarshal(b, &out)
	}
	return out
}

// RecordFallbackSeen replaces the recorded counters.
func (r *Registry) RecordFallbackSeen(m map[netip.Addr]netsetup.Count) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := r.fallbackPath() + "." + r.id
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.fallbackPath())
}
