package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketUID is the UID the test gives the daemon's DNS sockets: one no
// process on a test machine runs as.
const socketUID = 65353

// TestSocketUIDKeepsOthersOutOfThePortGroup runs the binary in a network
// namespace and a second, real process that binds the same address and
// port with SO_REUSEPORT, as another DNS pod on the node would. Without
// -socket-uid a root process joins the group (and would get a share of the
// queries); with it, root gets EADDRINUSE on UDP and TCP, while a process
// whose filesystem UID is the socket UID joins: it is the UID that decides.
// The daemon stays healthy (its health check asks every socket).
func TestSocketUIDKeepsOthersOutOfThePortGroup(t *testing.T) {
	need(t, "curl")
	ns, in := netns(t)
	bin := buildBinary(t)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	// Never asked: the test sends no query that needs an upstream.
	if err := os.WriteFile(rc, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	join := func(fsuid int) string {
		t.Helper()
		c := in(self, "-test.run=^TestJoinPortGroupHelper$", "-test.count=1")
		c.Env = append(os.Environ(), "NLD_JOIN=127.0.0.1:53", "NLD_JOIN_FSUID="+strconv.Itoa(fsuid))
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("joiner: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(l, "join: "); ok {
				return s
			}
		}
		t.Fatalf("joiner said nothing:\n%s", out)
		return ""
	}
	for _, tc := range []struct {
		flag     []string
		asRoot   string
		asSocket string
	}{
		{nil, "udp=joined tcp=joined", ""},
		{[]string{"-socket-uid", strconv.Itoa(socketUID)}, "udp=EADDRINUSE tcp=EADDRINUSE", "udp=joined tcp=joined"},
	} {
		t.Run(fmt.Sprintf("flag=%v", tc.flag), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			args := []string{"netns", "exec", ns, bin, "-local-mode", "-setupinterface=false", "-setupiptables=false",
				"-localip", "127.0.0.1", "-port", "53", "-resolv-conf", rc,
				"-metrics-listen-address", "127.0.0.1:9253", "-state-dir", stateDir(t), "-lameduck", "0s"}
			d := exec.CommandContext(ctx, "ip", append(args, tc.flag...)...)
			var stderr bytes.Buffer
			d.Stderr = &stderr
			if err := d.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- d.Wait() }()
			defer func() {
				_ = d.Process.Signal(syscall.SIGTERM)
				select {
				case err := <-exited:
					if err != nil {
						t.Errorf("exit: %v\n%s", err, stderr.String())
					}
				case <-time.After(30 * time.Second):
					t.Errorf("no exit after SIGTERM\n%s", stderr.String())
				}
			}()
			health := func() string {
				out, _ := in("curl", "-s", "-m", "5", "http://127.0.0.1:9253/health").CombinedOutput()
				return strings.TrimSpace(string(out))
			}
			deadline := time.Now().Add(30 * time.Second) // the bound is not the point: startup under load
			for health() != "ok" {
				select {
				case err := <-exited:
					t.Fatalf("daemon exited: %v\n%s", err, stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("not healthy\n%s", stderr.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			if got := join(0); got != tc.asRoot {
				t.Errorf("a root process binding 127.0.0.1:53 with SO_REUSEPORT: %s, want %s", got, tc.asRoot)
			}
			if tc.asSocket != "" {
				if got := join(socketUID); got != tc.asSocket {
					t.Errorf("a process with filesystem UID %d: %s, want %s", socketUID, got, tc.asSocket)
				}
			}
			if h := health(); h != "ok" {
				t.Errorf("health after the join attempts: %q\n%s", h, stderr.String())
			}
		})
	}
}

// TestJoinPortGroupHelper is the second process of
// TestSocketUIDKeepsOthersOutOfThePortGroup (run only with NLD_JOIN set):
// with its filesystem UID set to NLD_JOIN_FSUID it binds a UDP socket and
// a TCP listener on NLD_JOIN with SO_REUSEPORT and prints what happened.
func TestJoinPortGroupHelper(t *testing.T) {
	addr := os.Getenv("NLD_JOIN")
	if addr == "" {
		t.Skip("the second process of TestSocketUIDKeepsOthersOutOfThePortGroup")
	}
	fsuid, err := strconv.Atoi(os.Getenv("NLD_JOIN_FSUID"))
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread() // the filesystem UID is per thread; this one is discarded after
	if _, err := unix.SetfsuidRetUid(fsuid); err != nil {
		t.Fatal(err)
	}
	if cur, _ := unix.SetfsuidRetUid(-1); cur != fsuid {
		t.Fatalf("filesystem UID %d, want %d", cur, fsuid)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	result := func(err error) string {
		switch {
		case err == nil:
			return "joined"
		case errors.Is(err, unix.EADDRINUSE):
			return "EADDRINUSE"
		}
		return err.Error()
	}
	pc, uerr := lc.ListenPacket(context.Background(), "udp", addr)
	if uerr == nil {
		pc.Close()
	}
	ln, terr := lc.Listen(context.Background(), "tcp", addr)
	if terr == nil {
		ln.Close()
	}
	fmt.Printf("join: udp=%s tcp=%s\n", result(uerr), result(terr))
}
