package statedir

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The control socket of an instance is a SOCK_SEQPACKET unix socket in the
// abstract namespace, named
//
//	@nodelocaldns/<key>/<id>/<nonce>
//
// Abstract names belong to the network namespace: only a process in ours
// can connect to one, or bind one; a container that merely mounts the state
// directory sees none of them (issue 41: a root process in another
// network namespace took a twin's sockets and cache through the socket
// file it found there). The nonce, random, keeps anyone from binding an
// instance's name before it does. Every connection checks the process at
// the other end (CheckPeer): our uid and, where the kernel can tell, our
// network namespace; a twin counts only once it has answered IDRequest with
// its id over a checked connection (verify). Twins are found by their
// listening names in /proc/net/unix, which lists the sockets of our network
// namespace only, so a file in the state directory can neither make a twin
// up nor hide a live one; the lock files stay for the instances of older
// versions, which find their twins by them, and as the list where
// /proc/net/unix cannot be read.

// controlPrefix starts every control socket's name.
const controlPrefix = "@nodelocaldns/"

// IDRequest asks an instance for its id; it answers IDReply.
const IDRequest = "id"

// verifyTimeout bounds checking one candidate twin.
const verifyTimeout = time.Second

// maxCandidates bounds the names checked per look: a process of our
// network namespace may bind names that look like ours (each costs a
// connect and a refusal, tens of microseconds).
const maxCandidates = 256

// pidfdGetNetNamespace is PIDFD_GET_NET_NAMESPACE (linux/pidfd.h,
// _IO(0xFF, 4)): the network namespace of a pidfd's process, Linux 6.11+.
const pidfdGetNetNamespace = 0xFF04

// errNetnsUnknown: the kernel cannot tell the peer's network namespace.
var errNetnsUnknown = errors.New("peer's network namespace unknown")

// IDReply is the answer to IDRequest: the instance's id and when it
// started.
func IDReply(id string, started time.Time) []byte {
	return fmt.Appendf(nil, "id %s %d", id, started.UnixNano())
}

// ListenControl binds this instance's control socket and records its name
// for Register.
func (r *Registry) ListenControl() (*net.UnixListener, error) {
	var err error
	for range 3 {
		name := r.namePrefix(r.id) + nonce()
		var ln *net.UnixListener
		ln, err = net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
		if err == nil {
			r.control = name
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("control socket: %w", err)
}

// namePrefix starts the control socket names of instance id of this group.
func (r *Registry) namePrefix(id string) string { return controlPrefix + r.key + "/" + id + "/" }

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CheckPeer checks the process at the other end of c: its uid must be
// ours (SO_PEERCRED; root in a user namespace is another uid), and its
// network namespace ours where the kernel can tell (SO_PEERPIDFD and
// PIDFD_GET_NET_NAMESPACE, Linux 6.11+, and a process we may inspect). Where
// it cannot, the abstract namespace already proves that the peer's socket
// was made in our network namespace.
func CheckPeer(c *net.UnixConn) error { return checkPeer(c, false) }

// CheckPeerStrict is CheckPeer where the kernel must name the peer's
// network namespace as ours: for a socket file, which a process of any
// namespace that mounts the state directory can reach.
func CheckPeerStrict(c *net.UnixConn) error { return checkPeer(c, true) }

// ListenLegacy binds the socket file versions before issue 41 dial to hand
// over (<state-dir>/<key>/<id>.sock), for a rollback to one: serve it with
// CheckPeerStrict. Unregister removes it.
func (r *Registry) ListenLegacy() (*net.UnixListener, error) {
	path := r.sockPath(r.id)
	if len(path) > 107 {
		return nil, fmt.Errorf("%s: longer than a unix socket path may be", path)
	}
	_ = os.Remove(path) // a dead instance with our id left it
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // Unregister removes it, before the lock
	return ln, nil
}

// checkPeer is CheckPeer; strict: the kernel must tell the peer's network
// namespace (a socket file, which any namespace may have bound).
func checkPeer(c *net.UnixConn, strict bool) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr, nerr error
	if err := raw.Control(func(fd uintptr) {
		if cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); cerr == nil {
			nerr = peerNetns(int(fd))
		}
	}); err != nil {
		return err
	}
	switch {
	case cerr != nil:
		return fmt.Errorf("peer credentials: %w", cerr)
	case int(cred.Uid) != os.Geteuid():
		return fmt.Errorf("peer (pid %d in our PID namespace, 0: outside it) runs as uid %d, not %d", cred.Pid, cred.Uid, os.Geteuid())
	case nerr != nil && (strict || !errors.Is(nerr, errNetnsUnknown)):
		return nerr
	}
	return nil
}

// peerNetns compares the network namespace of the process at the other end
// of the unix socket fd with ours: nil when it is ours, errNetnsUnknown
// when the kernel does not say.
func peerNetns(fd int) error {
	pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return errNetnsUnknown // before Linux 6.5
	}
	defer unix.Close(pidfd)
	ns, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), pidfdGetNetNamespace, 0)
	if errno != 0 {
		// ENOTTY or EINVAL before 6.11, EACCES where we may not inspect
		// it, ESRCH once it has exited.
		return errNetnsUnknown
	}
	defer unix.Close(int(ns))
	var theirs, ours unix.Stat_t
	if unix.Fstat(int(ns), &theirs) != nil || unix.Stat("/proc/self/ns/net", &ours) != nil {
		return errNetnsUnknown
	}
	if theirs.Ino != ours.Ino || theirs.Dev != ours.Dev {
		return fmt.Errorf("peer is in network namespace %d, not ours (%d)", theirs.Ino, ours.Ino)
	}
	return nil
}

// dial connects to control socket c and checks its owner (CheckPeer;
// strictly for an older version's socket file), within d.
func (c control) dial(d time.Duration) (*net.UnixConn, error) {
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: c.name, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(d))
	if err := checkPeer(conn, c.legacy); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	return conn, nil
}

// verify checks that control socket c is its instance's: its owner passes
// the peer check and answers IDRequest with the id (an older version's,
// which does not know the request, answers at all). It returns when the
// instance started (an older version's: the zero time).
func (c control) verify() (time.Time, error) {
	conn, err := c.dial(verifyTimeout)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close()
	return c.askID(conn)
}

func (c control) askID(conn *net.UnixConn) (time.Time, error) {
	name, id := c.name, c.id
	if c.legacy {
		if _, err := conn.Write([]byte("ready")); err != nil {
			return time.Time{}, err
		}
		_, err := conn.Read(make([]byte, 256)) // "ok" or "fail: ...": it serves
		return time.Time{}, err
	}
	if _, err := conn.Write([]byte(IDRequest)); err != nil {
		return time.Time{}, err
	}
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil {
		return time.Time{}, err
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) != 3 || f[0] != "id" || f[1] != id {
		return time.Time{}, fmt.Errorf("%s answers %q, not instance %s", name, buf[:min(n, 64)], id)
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s answers %q", name, buf[:n])
	}
	return time.Unix(0, ns), nil
}

// listening returns the listening control sockets of our network namespace
// whose names start with prefix, as (id, name), from /proc/net/unix. ok is
// false when it cannot be read.
func listening(prefix string) (socks []control, ok bool) {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return nil, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<16)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fields := strings.Fields(sc.Text())
		if len(fields) != 8 || fields[3] != "00010000" || fields[4] != "0005" || !strings.HasPrefix(fields[7], prefix) {
			continue // not a listening SOCK_SEQPACKET socket of ours
		}
		if c, ok := parseName(fields[7]); ok && !slices.Contains(socks, c) {
			socks = append(socks, c)
		}
	}
	return socks, sc.Err() == nil
}

// control is one control socket found: its instance's key and id, and
// its name. legacy: the socket file of a version before issue 41
// (<state-dir>/<key>/<id>.sock), trusted only where the kernel names its
// owner's network namespace.
type control struct {
	key, id, name string
	legacy        bool
}

// parseName splits @nodelocaldns/<key>/<id>/<nonce>.
func parseName(name string) (control, bool) {
	rest, ok := strings.CutPrefix(name, controlPrefix)
	if !ok {
		return control{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return control{}, false
	}
	return control{key: parts[0], id: parts[1], name: name}, true
}
