package forward

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// goStatements lists the functions the package's non-test code starts with a go statement.
func goStatements(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(pkgDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				out = append(out, string(src[fset.Position(g.Call.Fun.Pos()).Offset:fset.Position(g.Call.Fun.End()).Offset]))
			}
			return true
		})
	}
	sort.Strings(out)
	return out
}

// The leak check knows every goroutine the package starts: the go statements in its code are
// the ones listed here, and each of them (and a timer callback) is caught when left running.
func TestLeakCheckKnowsEveryGoroutine(t *testing.T) {
	want := []string{"a.resume", "a.resume", "a.resume", "a.resumeClosed", "a.resumeTCP", "c.readLoop", "c.writeLoop", "g.probe", "s.readLoop"}
	if got := goStatements(t); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the package starts %v; this test (and a leak of each) covers %v: add the new one", got, want)
	}
	found := func(fn string) bool {
		for _, g := range leakedGoroutines() {
			if strings.Contains(g, fn) {
				return true
			}
		}
		return false
	}

	// A live connection: its reader and writer are the package's.
	srv := startTCP(t, serveWith(answerFor))
	g, err := NewGroup(GroupConfig{Name: "leak", Servers: []netip.AddrPort{srv.addr}, Proto: TCP}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Exchange(context.Background(), query(t, "a.example.", 1)); err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"(*tcpConn).readLoop", "(*tcpConn).writeLoop"} {
		if !found(fn) {
			t.Errorf("leak check does not see %s of an open connection", fn)
		}
	}

	// A deliberately leaked writeLoop alone (the one the old check missed).
	c := g.ups[0].tcp.conns[0]
	g.ups[0].tcp.wg.Add(1)
	go c.writeLoop() // a second writer on the connection, never stopped by the pool
	g.Close()        // ends the reader, which closes wdone: both writers return
	waitFor(t, 5*time.Second, "connection goroutines to end", func() bool { return !found("(*tcpConn)") })

	leaked := &tcpConn{pool: &tcpPool{}, wake: make(chan struct{}, 1), wdone: make(chan struct{})}
	leaked.pool.wg.Add(1)
	go leaked.writeLoop()
	waitFor(t, 5*time.Second, "leak check to see a leaked writeLoop", func() bool { return found("(*tcpConn).writeLoop") })
	close(leaked.wdone)
	waitFor(t, 5*time.Second, "leaked writeLoop to end", func() bool { return !found("(*tcpConn).writeLoop") })

	// An open UDP socket's reader, and its end with the group.
	usrv := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	ug, err := NewGroup(GroupConfig{Name: "leak-udp", Servers: []netip.AddrPort{usrv.addr}, Proto: UDP}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ug.Exchange(context.Background(), query(t, "a.example.", 1)); err != nil {
		t.Fatal(err)
	}
	if !found("(*udpSock).readLoop") {
		t.Error("leak check does not see the reader of an open UDP socket")
	}
	ug.Close()
	// Close returns once the reader has called wg.Done, its last deferred
	// call: the goroutine may still be on its way out for a moment (seen:
	// 1 run in 100, 4 on main, with -race).
	waitFor(t, 5*time.Second, "the UDP socket's reader to end with its group's Close", func() bool { return !found("(*udpSock).readLoop") })

	// A probe and a try timer's callback.
	dead := deadAddr(t)
	g2, err := NewGroup(GroupConfig{Name: "leak2", Servers: []netip.AddrPort{dead}, Proto: UDP, TryTimeout: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	g2.ups[0].down.Store(true)
	g2.startProbe(g2.ups[0])
	waitFor(t, 5*time.Second, "leak check to see a probe", func() bool { return found("(*Group).probe") })
	if !packageGoroutine(timerCallback) {
		t.Error("leak check does not see a try timer's callback")
	}
	if packageGoroutine(testCaller) {
		t.Error("leak check takes a test's caller of Exchange for the package's goroutine")
	}
}

// Stacks as runtime.Stack prints them: a try timer's callback (started by the time package,
// running the package's code) and a test's goroutine blocked in Exchange.
var (
	timerCallback = `goroutine 9 [select]:
context.(*cancelCtx).cancel(0xc0001, 0x1, {0x0, 0x0}, {0x0, 0x0})
	/usr/local/go/src/context/context.go:560 +0x1a
github.com/nodelocaldns/nodelocaldns/internal/forward.(*Group).tryContext.func1()
	` + filepath.Join(pkgDir, "group.go") + `:330 +0x29
created by time.goFunc
	/usr/local/go/src/time/sleep.go:215 +0x2d`
	testCaller = `goroutine 10 [select]:
github.com/nodelocaldns/nodelocaldns/internal/forward.(*tcpPool).exchangeOnce(0xc0001)
	` + filepath.Join(pkgDir, "tcp.go") + `:130 +0x29
github.com/nodelocaldns/nodelocaldns/internal/forward.(*Group).Exchange(0xc0001)
	` + filepath.Join(pkgDir, "group.go") + `:200 +0x29
github.com/nodelocaldns/nodelocaldns/internal/forward.TestX.func1()
	` + filepath.Join(pkgDir, "x_test.go") + `:20 +0x29
created by github.com/nodelocaldns/nodelocaldns/internal/forward.TestX in goroutine 7
	` + filepath.Join(pkgDir, "x_test.go") + `:18 +0x29`
)
