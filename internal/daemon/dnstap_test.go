package daemon

import (
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
)

// tapListener is a collector on a unix socket: frames received, and
// connections accepted and ended.
type tapListener struct {
	frames, conns, ended atomic.Int64
	mu                   sync.Mutex
	cs                   []net.Conn
}

func listenTap(t *testing.T, path string) *tapListener {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := &tapListener{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.conns.Add(1)
			l.mu.Lock()
			l.cs = append(l.cs, c)
			l.mu.Unlock()
			go func() {
				_ = dnstap.Collect(c, func([]byte) { l.frames.Add(1) })
				l.ended.Add(1)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.cs {
			c.Close()
		}
	})
	return l
}

// waitTap polls f until it holds within 5 s.
func waitTap(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A Corefile edit applies dnstap live: an edit that keeps a block's
// dnstap keeps its connection, one that changes the socket connects to the
// new collector and closes the old connection (STOP), one that removes it
// sends nothing more.
func TestCorefileDnstapReload(t *testing.T) {
	a := startUpstream(t, answerA("10.0.0.1"))
	b := startUpstream(t, answerA("10.0.0.2"))
	dir := t.TempDir()
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	ta, tb := listenTap(t, sockA), listenTap(t, sockB)
	conf := filepath.Join(dir, "Corefile")
	tapped := func(u *upstream, sock string) string {
		tp := ""
		if sock != "" {
			tp = "  dnstap " + sock + " full\n"
		}
		return "corp.example:53 {\n  bind 127.0.0.1\n" + tp + "  forward . " + u.addr.String() + "\n}\n.:53 {\n  bind 127.0.0.1\n  forward . /etc/resolv.conf\n}\n"
	}
	e := startCorefile(t, conf, tapped(a, sockA))
	e.firstA(t, "x.corp.example.")
	waitTap(t, "frames on a", func() bool { return ta.frames.Load() == 4 }) // a miss: CLIENT_QUERY, FORWARDER_QUERY, FORWARDER_RESPONSE, CLIENT_RESPONSE

	// Another upstream, the same dnstap: the same connection.
	writeAtomic(t, conf, tapped(b, sockA))
	e.eventually(t, "b", "corp.example.", "10.0.0.2")
	if n := ta.conns.Load(); n != 1 {
		t.Errorf("an edit that kept the dnstap made %d connections", n)
	}
	// Another socket: b gets the frames, a's connection ends.
	writeAtomic(t, conf, tapped(a, sockB))
	e.eventually(t, "c", "corp.example.", "10.0.0.1")
	waitTap(t, "a's connection closed", func() bool { return ta.ended.Load() == 1 })
	before := ta.frames.Load()
	e.ask(t, "y.corp.example.", dns.TypeA, false, "tcp")
	waitTap(t, "frames on b", func() bool { return tb.frames.Load() >= 2 })
	if ta.frames.Load() != before {
		t.Errorf("the old collector still gets frames")
	}
	// No dnstap: nothing more.
	writeAtomic(t, conf, tapped(b, ""))
	e.eventually(t, "d", "corp.example.", "10.0.0.2")
	waitTap(t, "b's connection closed", func() bool { return tb.ended.Load() == 1 })
	n := tb.frames.Load()
	e.ask(t, "z.corp.example.", dns.TypeA, false, "udp")
	time.Sleep(200 * time.Millisecond)
	if tb.frames.Load() != n || ta.frames.Load() != before {
		t.Errorf("frames after dnstap was removed")
	}
}
