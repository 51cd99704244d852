package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/statedir"
)

// TestStateDirThiefGetsNothing is issue 41's thief: a root process in
// another network namespace (a pod without hostNetwork) that mounts the
// state directory. Before, it connected to the control socket it found
// there, took the listening sockets and dumped the cache, and a lock file
// it held made the real daemon leave its rules and address on exit. Now:
//
//   - the control sockets the lock files name are abstract, the node's
//     network namespace's: it cannot connect; the one socket file in the
//     directory (kept for a rollback to an older version) answers only a
//     peer the kernel names as in the node's namespace: no cache, no socket;
//   - a fake twin (a lock file it holds, naming a control socket it serves
//     in its own namespace and answering as that id; another naming the
//     real daemon's own socket) is no twin: the daemon tears down on exit,
//     rules and address, as when alone;
//   - a process outside the node's namespace that holds a socket made in it
//     (and so can connect) is refused where the kernel names the peer's
//     namespace (Linux 6.11+), and counted.
func TestStateDirThiefGetsNothing(t *testing.T) {
	need(t, "iptables-save")
	dig := need(t, "dig")
	ns, in := netns(t)
	thiefNS, _ := netns(t)
	bin := buildBinary(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
	before := rulesOf(t, in, "iptables-save")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc := startDnsmasq(t, ctx, ns)
	dir := stateDir(t)
	a := startInstance(t, exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "-local-mode",
		"-setupinterface=true", "-setupiptables=true", "-localip", "169.254.20.10", "-resolv-conf", rc,
		"-metrics-listen-address", "127.0.0.1:9253", "-state-dir", dir, "-udp-sockets", "2", "-lameduck", "0s"))
	waitProbe(t, bin, dir, a)
	if got := strings.TrimSpace(mustRun(t, in(dig, "@169.254.20.10", "+short", "+time=2", "+tries=1", "example.com"))); got != "192.0.2.1" {
		t.Fatalf("dig: %q", got) // cached now: what the thief is after
	}
	groups, _ := filepath.Glob(filepath.Join(dir, "*", "key"))
	if len(groups) != 1 {
		t.Fatalf("group directories %v", groups)
	}
	group := filepath.Dir(groups[0])

	// The thief, from its own network namespace, with the state directory.
	var got tries
	stopFake := make(chan struct{})
	defer close(stopFake)
	fakeReady := make(chan error, 1)
	go func() {
		if err := enterNetns(thiefNS); err != nil {
			fakeReady <- err
			return
		}
		got = steal(t, dir)
		fakeReady <- fakeTwin(group, stopFake)
	}()
	if err := <-fakeReady; err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		if g.n > 0 || g.oobn > 0 {
			t.Errorf("the thief got something: %s", tries{g})
		}
	}
	t.Logf("what the thief tried:\n%s", got)

	// A process of the test's namespace holding a socket made in the node's.
	if peerNetnsKnown() {
		refused := func() string {
			return grepLines(mustRun(t, in("curl", "-sf", "http://127.0.0.1:9253/metrics")), "nodelocaldns_control_refused_total ")
		}
		before := refused()
		if reply := fromOutsideWithSocketOfNS(t, ns, a); reply != "" {
			t.Errorf("a peer outside the namespace got %q", reply)
		}
		if after := refused(); after == before {
			t.Errorf("the refused peer is not counted: %q, then %q", before, after)
		}
	} else {
		t.Log("this kernel does not name a peer's network namespace (Linux 6.11+): that part is not checked")
	}

	_ = a.cmd.Process.Signal(unix.SIGTERM)
	if code := a.exitCode(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, a.log)
	}
	if l := a.log.String(); strings.Contains(l, "leaving link and rules to it") {
		t.Errorf("a fake twin made the daemon leave its rules and address:\n%s", l)
	}
	if after := rulesOf(t, in, "iptables-save"); after != before {
		t.Errorf("rules left behind:\nbefore:\n%s\nafter:\n%s\n%s", before, after, a.log)
	}
	if strings.Contains(mustRun(t, in("ip", "addr", "show", "nodelocaldns")), "169.254.20.10") {
		t.Errorf("the address is still on the link\n%s", a.log)
	}
}

// try is one request of the thief and what came back.
type try struct {
	req, name string
	n, oobn   int // bytes, and bytes of descriptors, read
	err       error
}

type tries []try

func (ts tries) String() string {
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintf(&b, "%s %q: read %d bytes, %d of descriptors: %v\n", t.req, t.name, max(t.n, 0), t.oobn, t.err)
	}
	return b.String()
}

// steal tries every socket file under dir and every control socket a lock
// file names: connect, ask for the cache, then for the sockets.
func steal(t *testing.T, dir string) tries {
	var tried tries
	try1 := func(network, name string) {
		for _, req := range []string{"cache thief", "handover thief"} {
			c, err := net.Dial(network, name)
			if err != nil {
				tried = append(tried, try{req: req, name: name, err: err})
				continue
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = c.Write([]byte(req))
			uc := c.(*net.UnixConn)
			buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(4*8))
			n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
			c.Close()
			tried = append(tried, try{req, name, n, oobn, err})
		}
	}

	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type()&fs.ModeSocket != 0 {
			try1("unixpacket", path)
		}
		if strings.HasSuffix(path, ".lock") && !strings.HasSuffix(path, "group.lock") {
			var rec struct {
				Control string `json:"control"`
			}
			if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &rec) == nil && rec.Control != "" {
				try1("unixpacket", rec.Control)
			}
		}
		return nil
	})
	if len(tried) == 0 {
		t.Error("the thief found nothing to try: the test proves nothing")
	}
	return tried
}

// fakeTwin plants three fake twins in group: one whose lock names a
// control socket served here (in the thief's namespace: the caller's
// thread's) that answers as its id, one whose lock names the real daemon's
// own control socket, and one of an older version (a socket file served
// here). Their flocks are held until stop closes.
func fakeTwin(group string, stop <-chan struct{}) error {
	realLock, _ := filepath.Glob(filepath.Join(group, "*-*.lock"))
	if len(realLock) != 1 {
		return fmt.Errorf("lock files %v", realLock)
	}
	var rec struct {
		Control string `json:"control"`
	}
	b, _ := os.ReadFile(realLock[0])
	if err := json.Unmarshal(b, &rec); err != nil {
		return err
	}
	const fakeID, replayID = "4026599999-4242", "4026599999-4343"
	name := "@nodelocaldns/" + filepath.Base(group) + "/" + fakeID + "/0123456789abcdef"
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return err
	}
	go func() {
		<-stop
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			if n, _ := c.Read(buf); string(buf[:n]) == statedir.IDRequest {
				_, _ = c.Write(statedir.IDReply(fakeID, time.Now()))
			}
			c.Close()
		}
	}()
	// A fake of a version before issue 41: a socket file answering
	// anything, beside a lock naming no control socket.
	const legacyID = "4026599999-4444"
	old, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(group, legacyID+".sock"), Net: "unixpacket"})
	if err != nil {
		return err
	}
	go func() {
		<-stop
		old.Close()
	}()
	go func() {
		for {
			c, err := old.AcceptUnix()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 64))
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	for id, control := range map[string]string{fakeID: name, replayID: rec.Control, legacyID: ""} {
		f, err := os.OpenFile(filepath.Join(group, id+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			return err
		}
		if control == "" {
			fmt.Fprint(f, `{"pid": 4444}`)
		} else {
			fmt.Fprintf(f, `{"pid": 4242, "control": %q}`, control)
		}
		go func() {
			<-stop
			f.Close()
		}()
	}
	return nil
}

// fromOutsideWithSocketOfNS connects to the daemon's control socket from
// this process (in the test's network namespace) with a socket made in
// namespace ns, asks for the cache, and returns what came back.
func fromOutsideWithSocketOfNS(t *testing.T, ns string, a *instance) string {
	t.Helper()
	fdc := make(chan int, 1)
	go func() {
		// A thread of ours in ns makes the socket; the process stays in
		// the test's namespace.
		if err := enterNetns(ns); err != nil {
			t.Error(err)
			fdc <- -1
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Error(err)
		}
		fdc <- fd
	}()
	fd := <-fdc
	if fd < 0 {
		return ""
	}
	f := os.NewFile(uintptr(fd), "socket of "+ns)
	defer f.Close()
	name := controlOf(t, a)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		t.Fatalf("connect with a socket of the namespace: %v", err)
	}
	_, _ = unix.Write(fd, []byte("cache thief"))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	buf := make([]byte, 4096)
	n, _ := unix.Read(fd, buf)
	return string(buf[:max(n, 0)])
}

// controlOf is the control socket's name the instance's lock file gives.
func controlOf(t *testing.T, a *instance) string {
	t.Helper()
	locks, _ := filepath.Glob(filepath.Join(flagValue(a.cmd.Args, "-state-dir"), "*", fmt.Sprintf("*-%d.lock", a.pid())))
	if len(locks) != 1 {
		t.Fatalf("lock files of pid %d: %v", a.pid(), locks)
	}
	var rec struct {
		Control string `json:"control"`
	}
	b, _ := os.ReadFile(locks[0])
	if err := json.Unmarshal(b, &rec); err != nil || rec.Control == "" {
		t.Fatalf("lock file %s: %s", locks[0], b)
	}
	return rec.Control
}

func flagValue(args []string, flag string) string {
	for i, a := range args[:len(args)-1] {
		if a == flag {
			return args[i+1]
		}
	}
	return ""
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// peerNetnsKnown reports whether the kernel names a unix socket peer's
// network namespace (SO_PEERPIDFD, PIDFD_GET_NET_NAMESPACE).
func peerNetnsKnown() bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	pidfd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return false
	}
	defer unix.Close(pidfd)
	nsfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), 0xFF04, 0) // PIDFD_GET_NET_NAMESPACE
	if errno != 0 {
		return false
	}
	unix.Close(int(nsfd))
	runtime.KeepAlive(fds)
	return true
}
