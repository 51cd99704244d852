package statedir

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests below run a copy of the test binary as the peer, with this
// helper: it connects to the abstract name in NLD_TEST_DIAL (through the
// socket inherited as fd 3 when NLD_TEST_DIAL_FD is set), sends a request
// and writes what came back to the file NLD_TEST_OUT (a file: the race
// detector's copy lost lines written to a pipe).
func TestHelperDial(t *testing.T) {
	name, out := os.Getenv("NLD_TEST_DIAL"), os.Getenv("NLD_TEST_OUT")
	if name == "" || out == "" {
		t.Skip("a helper process for the tests below")
	}
	report := func(format string, args ...any) { _ = os.WriteFile(out, fmt.Appendf(nil, format, args...), 0o644) }
	var c net.Conn
	var err error
	if os.Getenv("NLD_TEST_DIAL_FD") != "" {
		sa := &unix.SockaddrUnix{Name: name}
		if err = unix.Connect(3, sa); err == nil {
			c, err = net.FileConn(os.NewFile(3, "inherited"))
		}
	} else {
		c, err = net.Dial("unixpacket", name)
	}
	if err != nil {
		report("dial: %v", err)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	_, _ = c.Write([]byte("cache thief"))
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	report("read %d bytes: %q %v", n, buf[:n], err)
}

// serveChecked listens on a fresh abstract name and answers each peer
// that passes CheckPeer with "secret"; every refusal is sent on refused.
func serveChecked(t *testing.T) (name string, refused chan error) {
	t.Helper()
	r := &Registry{key: fmt.Sprintf("test%d", rand.Uint64()), id: "1-1"}
	ln, err := r.ListenControl()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	refused = make(chan error, 10)
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			if err := CheckPeer(c); err != nil {
				refused <- err
			} else {
				_, _ = c.Read(make([]byte, 64)) // the request: closing unread would reset
				_, _ = c.Write([]byte("secret"))
			}
			c.Close()
		}
	}()
	return r.control, refused
}

// helper runs TestHelperDial against name (after prefix, a command that
// runs it elsewhere) and returns what it wrote.
// Both are where any uid may reach them: the peer may run as another.
func helper(t *testing.T, name string, prefix []string, setup func(*exec.Cmd)) []byte {
	t.Helper()
	dir, err := os.MkdirTemp("", "nld-helper")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper.test")
	if b, err := os.ReadFile(self); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	outFile := filepath.Join(dir, "out")
	args := append(prefix, bin, "-test.run=^TestHelperDial$")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "NLD_TEST_DIAL="+name, "NLD_TEST_OUT="+outFile)
	if setup != nil {
		setup(cmd)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	b, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatalf("the helper wrote nothing: %v", err)
	}
	return b
}

func wantRefused(t *testing.T, out []byte, refused chan error, want string) {
	t.Helper()
	if strings.Contains(string(out), "secret") {
		t.Errorf("the peer got the answer:\n%s", out)
	}
	select {
	case err := <-refused:
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refused for %v, want %q", err, want)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the peer was not refused:\n%s", out)
	}
}

// TestCheckPeerSameUIDAnswered: a process of our uid and network namespace
// is answered (the exec probe's and a twin's case).
func TestCheckPeerSameUIDAnswered(t *testing.T) {
	name, refused := serveChecked(t)
	if out := helper(t, name, nil, nil); !strings.Contains(string(out), `"secret"`) {
		t.Fatalf("our own uid and namespace: %s", out)
	}
	select {
	case err := <-refused:
		t.Fatalf("refused: %v", err)
	default:
	}
}

// TestCheckPeerRefusesOtherUID: a process of our network namespace running
// as another uid is refused (root in a user namespace is another uid too).
func TestCheckPeerRefusesOtherUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a peer as another uid")
	}
	name, refused := serveChecked(t)
	out := helper(t, name, nil, func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	})
	wantRefused(t, out, refused, "uid 65534")
}

// TestCheckPeerRefusesOtherNetns: a process in another network namespace
// cannot reach the control socket at all (the abstract namespace is the
// network namespace's), and one that holds a socket made in ours, and so
// can connect, is refused where the kernel tells its namespace (Linux 6.11+).
func TestCheckPeerRefusesOtherNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	ns := fmt.Sprintf("nld-sd-%d", rand.IntN(1_000_000))
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	name, refused := serveChecked(t)

	inNS := []string{"ip", "netns", "exec", ns}
	out := helper(t, name, inNS, nil)
	if !strings.Contains(string(out), "dial:") || strings.Contains(string(out), "secret") {
		t.Errorf("from another network namespace:\n%s", out)
	}

	if !netnsOfPeerKnown(t) {
		t.Skip("this kernel does not tell a peer's network namespace (SO_PEERPIDFD, PIDFD_GET_NET_NAMESPACE: Linux 6.11)")
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0) // made here, in ours
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "ours")
	defer f.Close()
	out = helper(t, name, inNS, func(cmd *exec.Cmd) {
		cmd.ExtraFiles = []*os.File{f}
		cmd.Env = append(cmd.Env, "NLD_TEST_DIAL_FD=1")
	})
	wantRefused(t, out, refused, "not ours")
}

// netnsOfPeerKnown reports whether this kernel tells the network namespace
// of a unix socket's peer.
func netnsOfPeerKnown(t *testing.T) bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	return peerNetns(fds[0]) == nil
}

// TestTwinsAreVerified: a lock file with a held flock is no twin, whatever
// it names; an instance that answers as its id on its control socket is,
// and a name that answers as another id is not.
func TestTwinsAreVerified(t *testing.T) {
	dir := t.TempDir()
	addrs := []netip.Addr{netip.AddrFrom4([4]byte{127, byte(rand.IntN(200) + 20), byte(rand.IntN(250) + 1), 9})}
	open := func(id string) *Registry {
		r, err := Open(dir, id, addrs, 53)
		if err != nil {
			t.Skip(err)
		}
		return r
	}
	serve := func(r *Registry, answerAs string) {
		ln, err := r.ListenControl()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		if err := r.Register(map[string]any{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Unregister)
		go func() {
			for {
				c, err := ln.AcceptUnix()
				if err != nil {
					return
				}
				buf := make([]byte, 64)
				if n, _ := c.Read(buf); CheckPeer(c) == nil && string(buf[:n]) == IDRequest {
					_, _ = c.Write(IDReply(answerAs, time.Now()))
				}
				c.Close()
			}
		}()
	}
	a, b, liar := open("1-100"), open("1-200"), open("1-300")
	serve(a, "1-100")
	serve(b, "1-200")
	serve(liar, "1-100") // claims to be a
	// A fake: a held lock naming a's control socket.
	fake, err := os.OpenFile(a.lockPath("1-999"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	if err := unix.Flock(int(fake.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(fake, `{"control": %q}`, a.control)

	// An instance of a version before issue 41: a held lock naming no
	// control socket, beside its socket file, answering "ready". It is a
	// twin where the kernel names its owner's network namespace.
	old := open("1-050")
	oldLock, err := os.OpenFile(old.lockPath("1-050"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer oldLock.Close()
	if err := unix.Flock(int(oldLock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(oldLock, `{"pid": 50}`)
	oldLn, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: old.sockPath("1-050"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer oldLn.Close()
	go func() {
		for {
			c, err := oldLn.AcceptUnix()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 64))
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	want := []string{"1-200"}
	if netnsOfPeerKnown(t) {
		want = append(want, "1-050") // oldest last
	}
	if got := a.Twins(); !slices.Equal(got, want) {
		t.Errorf("a's twins %v, want %v: a fake lock and a liar are none", got, want)
	}
	if !a.Alive("1-200") || a.Alive("1-999") || a.Alive("1-300") {
		t.Errorf("alive: 1-200 %v, 1-999 %v, 1-300 %v; want true, false, false", a.Alive("1-200"), a.Alive("1-999"), a.Alive("1-300"))
	}
	if _, err := a.Dial("1-999", time.Second); err == nil {
		t.Error("dialed the fake")
	}
	c, err := a.Dial("1-200", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
