package daemon

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Who may join our port group. Linux lets a socket join a SO_REUSEPORT
// group only when it is owned by the same UID as the group's sockets, and
// a socket is owned by the filesystem UID of the thread that created it.
// The daemon runs as root, as do most pods, so any hostNetwork pod that
// binds port 53 on our address with SO_REUSEPORT would join the group and
// receive a share of the queries. With -socket-uid the DNS sockets are
// created under a UID no other pod uses: a pod running as root (or as any
// other UID) then gets EADDRINUSE. The process itself stays root: netlink
// and iptables (CAP_NET_ADMIN, CAP_NET_RAW, the root-owned xtables lock)
// and the state directory need it. Only setfsuid(2) on the one thread
// creating the sockets changes, which needs CAP_SETUID; a process that has
// CAP_SETUID (by default a container's root does) can still take the UID
// on purpose: this keeps accidents out, not an attacker with that power.

// listenAs runs listen, which creates sockets on the calling goroutine,
// on a thread whose filesystem UID is uid, and restores it after; a
// negative uid runs listen as it is.
func listenAs(uid int64, listen func() error) error {
	if uid < 0 {
		return listen()
	}
	runtime.LockOSThread()
	prev, err := setfsuid(uid)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("-socket-uid %d: %w (needs CAP_SETUID)", uid, err)
	}
	lerr := listen()
	if _, err := setfsuid(prev); err != nil {
		// Leave the thread locked: the goroutine keeps it and nothing
		// else runs with the wrong UID; Start fails.
		return fmt.Errorf("-socket-uid %d: restoring filesystem UID %d: %w", uid, prev, err)
	}
	runtime.UnlockOSThread()
	return lerr
}

// setfsuid sets the calling thread's filesystem UID and returns the one it
// had. setfsuid(2) reports no error; it is checked by reading the UID back
// (an invalid UID, -1, changes nothing and returns the current one). The
// kernel's uid_t is 32 bits unsigned: on a 32-bit platform (arm) a UID over
// 2^31-1 travels as a negative int with the same bits, so the UIDs are
// passed and compared as uint32.
func setfsuid(uid int64) (prev int64, err error) {
	p, _ := unix.SetfsuidRetUid(int(uint32(uid)))
	prev = int64(uint32(p))
	if cur, _ := unix.SetfsuidRetUid(-1); uint32(cur) != uint32(uid) {
		return prev, fmt.Errorf("setfsuid(%d) left the filesystem UID at %d", uid, uint32(cur))
	}
	return prev, nil
}
