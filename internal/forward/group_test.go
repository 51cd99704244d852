package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Each faulty TCP upstream is detected as its kind of failure, the query fails over to the next
// server within the deadline, and nothing the faulty one sent is ever returned.
func TestTCPFaultsFailOver(t *testing.T) {
	wrongQuestion := func(q []byte) []byte {
		m := new(dns.Msg)
		m.Unpack(q)
		m.Question[0].Name = "evil.example."
		b, _ := m.Pack()
		return answerFor(b) // right ID, other question
	}
	tests := []struct {
		name  string
		serve func(s *tcpServer, c net.Conn, conn int) // nil: nothing listens
		kinds []string
	}{
		{"refused", nil, []string{KindRefused}},
		{"wrong ID", serveWith(func(q []byte) []byte {
			a := answerFor(q)
			a[0] ^= 0x55 // an ID never sent on this connection
			return a
		}), []string{KindMismatch, KindTimeout}},
		{"wrong question", serveWith(wrongQuestion), []string{KindMismatch}},
		{"garbage", serveWith(func(q []byte) []byte {
			return []byte{q[0], q[1], 0xde, 0xad, 0xbe, 0xef} // our ID, then junk
		}), []string{KindMalformed}},
		{"not a response", serveWith(func(q []byte) []byte { return q }), []string{KindMalformed}},
		{"closes mid-stream", func(s *tcpServer, c net.Conn, _ int) { s.read(c) }, []string{KindClosed}},
		{"resets", func(s *tcpServer, c net.Conn, _ int) {
			s.read(c)
			c.(*net.TCPConn).SetLinger(0) // RST instead of FIN
		}, []string{KindClosed}},
		{"slow", serveInOrder(400 * time.Millisecond), []string{KindTimeout}},
	}
	good := startTCP(t, servePipelined)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := deadAddr(t)
			if tt.serve != nil {
				bad = startTCP(t, tt.serve).addr
			}
			rec := newRecorder()
			g := newGroup(t, GroupConfig{
				Servers: []netip.AddrPort{bad, good.addr}, Proto: TCP, TryTimeout: 150 * time.Millisecond,
			}, rec)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			name := "victim.svc.cluster.local."
			ans, err := g.Exchange(ctx, query(t, name, 4242))
			if err != nil {
				t.Fatalf("Exchange: %v", err)
			}
			if err := checkTXT(ans, name, 4242); err != nil {
				t.Fatalf("wrong answer: %v", err)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("failover took %v", d)
			}
			for _, kind := range tt.kinds {
				if rec.failuresOf(bad.String(), kind) == 0 {
					t.Errorf("no %q failure counted for the faulty upstream", kind)
				}
			}
			if rec.exchangesAt(good.addr.String()) != 1 {
				t.Error("answer not reported for the good upstream")
			}
		})
	}
}

// A query to a silent UDP server fails over to the next within the caller's deadline.
func TestUDPFailoverWithinDeadline(t *testing.T) {
	silent := startUDP(t, func([]byte, func([]byte)) {})
	good := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{silent.addr, good.addr}, TryTimeout: 200 * time.Millisecond}, rec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	ans, err := g.Exchange(ctx, query(t, "www.example.com.", 77))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "www.example.com.", 77); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 600*time.Millisecond {
		t.Errorf("took %v, want one 200 ms try timeout then an answer", d)
	}
	if rec.failuresOf(silent.addr.String(), KindTimeout) != 1 {
		t.Error("timeout of the silent server not counted")
	}
}

// The overall deadline wins over the per-try timeout, and the error comes back promptly.
func TestDeadlineShorterThanTry(t *testing.T) {
	silent := startUDP(t, func([]byte, func([]byte)) {})
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{silent.addr}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := g.Exchange(ctx, query(t, "x.example.", 1))
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("err %v, want ErrNoAnswer", err)
	}
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Errorf("returned after %v with a 100 ms deadline", d)
	}
}

// After maxFails failures an upstream is marked down and skipped; the probe marks it up once it
// answers again.
func TestHealthDownThenProbedUp(t *testing.T) {
	dead := deadAddr(t)
	good := startTCP(t, servePipelined)
	rec := newRecorder()
	clk := newFake()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{dead, good.addr}, Proto: TCP, Clock: clk}, rec)
	ask := func(i int) {
		t.Helper()
		name := fmt.Sprintf("h%d.example.", i)
		ans, err := g.Exchange(context.Background(), query(t, name, uint16(i)))
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range maxFails {
		ask(i)
	}
	if !rec.hasHealth(dead.String() + " down") {
		t.Fatalf("not marked down after %d failures: %v", maxFails, rec.healthEvents())
	}
	fails := rec.failuresOf(dead.String(), KindRefused)
	for i := range 5 {
		ask(10 + i)
	}
	if n := rec.failuresOf(dead.String(), KindRefused); n != fails {
		t.Errorf("down upstream still tried: %d failures, was %d", n, fails)
	}
	revived := startTCPOn(t, dead.String(), servePipelined)
	advanceWhen(t, clk, 1, probeInterval) // the probe's timer
	waitFor(t, 5*time.Second, "probe to mark the upstream up", func() bool {
		return slices.Equal(rec.healthTransitions(dead.String()), []string{"down", "up"})
	})
	ask(20)
	if revived.queries.Load() < 2 { // the probe and the query
		t.Errorf("revived upstream saw %d queries, want the probe and the query", revived.queries.Load())
	}
}

// When every upstream is down, a query is still tried on one; a refused one still fails fast.
func TestAllDownFailsFast(t *testing.T) {
	dead := deadAddr(t)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{dead}, Proto: TCP}, rec)
	for range 2 { // two passes per query: maxFails reached on the second query
		g.Exchange(context.Background(), query(t, "a.example.", 1))
	}
	if !rec.hasHealth(dead.String() + " down") {
		t.Fatalf("not down: %v", rec.healthEvents())
	}
	tried := rec.failuresOf(dead.String(), KindRefused)
	start := time.Now()
	_, err := g.Exchange(context.Background(), query(t, "b.example.", 2))
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("err %v, want ErrNoAnswer", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("failing on a refused upstream took %v", d)
	}
	if n := rec.failuresOf(dead.String(), KindRefused); n != tried+1 {
		t.Errorf("%d more tries while all down, want 1", n-tried)
	}
}

// Past MaxInflight queries, Exchange fails at once with ErrOverloaded, counted.
func TestOverloaded(t *testing.T) {
	release := make(chan struct{})
	srv := startTCP(t, func(s *tcpServer, c net.Conn, _ int) {
		for {
			q, err := s.read(c)
			if err != nil {
				return
			}
			go func() { <-release; writeFrame(c, answerFor(q)) }()
		}
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, MaxInflight: 2}, rec)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := g.Exchange(context.Background(), query(t, fmt.Sprintf("o%d.example.", i), 1)); err != nil {
				t.Errorf("query %d: %v", i, err)
			}
		}()
	}
	waitFor(t, 2*time.Second, "two queries in flight", func() bool { return rec.inflightNow() == 2 })
	start := time.Now()
	_, err := g.Exchange(context.Background(), query(t, "third.example.", 3))
	if !errors.Is(err, ErrOverloaded) {
		t.Errorf("err %v, want ErrOverloaded", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("ErrOverloaded took %v", d)
	}
	if rc := wire.RcodeError(0); errors.As(err, &rc) {
		t.Errorf("without RefuseOverload the error carries rcode %d", rc)
	}
	if rec.failuresOf("", KindOverloaded) != 1 {
		t.Error("overload not counted")
	}
	// max_concurrent: the same error, carrying REFUSED for the client.
	g.cfg.RefuseOverload = true
	_, err = g.Exchange(context.Background(), query(t, "fourth.example.", 4))
	if rc := wire.RcodeError(0); !errors.Is(err, ErrOverloaded) || !errors.As(err, &rc) || rc != wire.RcodeRefused {
		t.Errorf("RefuseOverload: err %v", err)
	}
	close(release)
	wg.Wait()
}

// A SERVFAIL answer moves on to the next server; from the last server it is returned.
func TestServfailTriesNext(t *testing.T) {
	servfail := startTCP(t, serveWith(func(q []byte) []byte { return replyWith(q, dns.RcodeServerFailure) }))
	good := startTCP(t, servePipelined)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{servfail.addr, good.addr}, Proto: TCP}, rec)
	ans, err := g.Exchange(context.Background(), query(t, "sf.example.", 9))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "sf.example.", 9); err != nil {
		t.Fatal(err)
	}

	only := newGroup(t, GroupConfig{Servers: []netip.AddrPort{servfail.addr}, Proto: TCP}, nil)
	ans, err = only.Exchange(context.Background(), query(t, "sf.example.", 10))
	if err != nil {
		t.Fatal(err)
	}
	if wire.Rcode(ans) != dns.RcodeServerFailure || ans[0] != 0 || ans[1] != 10 {
		t.Errorf("want the upstream's SERVFAIL with ID 10, got rcode %d ID %d", wire.Rcode(ans), int(ans[0])<<8|int(ans[1]))
	}
}

// The caller's query bytes are untouched and its ID comes back, though the wire ID differs.
func TestExchangeKeepsCallerIDAndQuery(t *testing.T) {
	wireIDs := make(chan uint16, 2)
	srv := startTCP(t, serveWith(func(q []byte) []byte {
		wireIDs <- uint16(q[0])<<8 | uint16(q[1])
		return answerFor(q)
	}))
	udp := startUDP(t, func(q []byte, reply func([]byte)) {
		wireIDs <- uint16(q[0])<<8 | uint16(q[1])
		reply(answerFor(q))
	})
	for _, cfg := range []GroupConfig{
		{Servers: []netip.AddrPort{srv.addr}, Proto: TCP},
		{Servers: []netip.AddrPort{udp.addr}, Proto: UDP},
	} {
		g := newGroup(t, cfg, nil)
		q := query(t, "MiXeD.Example.", 0xBEEF)
		orig := bytes.Clone(q)
		ans, err := g.Exchange(context.Background(), q)
		if err != nil {
			t.Fatalf("%v: %v", cfg.Proto, err)
		}
		if !bytes.Equal(q, orig) {
			t.Errorf("%v: query modified", cfg.Proto)
		}
		if err := checkTXT(ans, "mixed.example.", 0xBEEF); err != nil {
			t.Errorf("%v: %v", cfg.Proto, err)
		}
		if id := <-wireIDs; id == 0xBEEF {
			t.Logf("%v: wire ID equals the caller's by chance", cfg.Proto)
		}
	}
}

func TestBadQuery(t *testing.T) {
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{deadAddr(t)}}, nil)
	if _, err := g.Exchange(context.Background(), []byte{1, 2, 3}); !errors.Is(err, ErrBadQuery) {
		t.Errorf("err %v, want ErrBadQuery", err)
	}
}

func TestNewGroupValidates(t *testing.T) {
	ok := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}
	tests := []struct {
		name string
		cfg  GroupConfig
	}{
		{"no name", GroupConfig{Servers: ok}},
		{"no servers", GroupConfig{Name: "x"}},
		{"zero address", GroupConfig{Name: "x", Servers: []netip.AddrPort{{}}}},
		{"port 0", GroupConfig{Name: "x", Servers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}}},
		{"bad proto", GroupConfig{Name: "x", Servers: ok, Proto: 7}},
		{"negative", GroupConfig{Name: "x", Servers: ok, PoolSize: -1}},
	}
	for _, tt := range tests {
		if g, err := NewGroup(tt.cfg, nil); err == nil {
			g.Close()
			t.Errorf("%s: NewGroup accepted %+v", tt.name, tt.cfg)
		}
	}
	g, err := NewGroup(GroupConfig{Name: "x", Servers: ok}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.cfg.PoolSize != DefaultPoolSize || g.cfg.TryTimeout != DefaultTryTimeout || g.cfg.MaxInflight != DefaultMaxInflight {
		t.Errorf("defaults not applied: %+v", g.cfg)
	}
}

// health_check's domain: a down server is probed for "NAME IN NS", recursion
// not desired; without it for ". IN NS".
func TestProbeAsksTheHealthCheckDomain(t *testing.T) {
	for _, tc := range []struct{ probe, want string }{{"", "."}, {"Health.Example", "health.example."}} {
		dead := deadAddr(t)
		clk := newFake()
		rec := newRecorder()
		g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{dead}, Proto: TCP, Clock: clk, MaxFails: 1, ProbeName: tc.probe}, rec)
		g.Exchange(context.Background(), query(t, "a.example.", 1))
		if !rec.hasHealth(dead.String() + " down") {
			t.Fatalf("not down: %v", rec.healthEvents())
		}
		var mu sync.Mutex
		var asked []string
		startTCPOn(t, dead.String(), serveWith(func(q []byte) []byte {
			m := new(dns.Msg)
			if err := m.Unpack(q); err == nil && len(m.Question) == 1 {
				mu.Lock()
				asked = append(asked, fmt.Sprintf("%s %s rd=%v", strings.ToLower(m.Question[0].Name), dns.TypeToString[m.Question[0].Qtype], m.RecursionDesired))
				mu.Unlock()
			}
			return answerFor(q)
		}))
		advanceWhen(t, clk, 1, probeInterval)
		waitFor(t, 5*time.Second, "probe to mark the upstream up", func() bool {
			return slices.Equal(rec.healthTransitions(dead.String()), []string{"down", "up"})
		})
		mu.Lock()
		if want := tc.want + " NS rd=false"; len(asked) != 1 || asked[0] != want {
			t.Errorf("probe %q asked %v, want [%s]", tc.probe, asked, want)
		}
		mu.Unlock()
	}
	if _, err := NewGroup(GroupConfig{Name: "x", Servers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}, Proto: TCP, ProbeName: "a..b"}, nil); err == nil {
		t.Error("an invalid probe name was taken")
	}
}

// FailoverRcodes: an answer with such an rcode moves on to the next server,
// like SERVFAIL; without it the answer is final. MaxTries caps the tries
// that get no answer: with one, a dead first server ends the walk.
func TestFailoverRcodesAndMaxTries(t *testing.T) {
	nx := startTCP(t, serveWith(func(q []byte) []byte { return replyWith(q, dns.RcodeNameError) }))
	good := startTCP(t, servePipelined)
	for _, tc := range []struct {
		mask uint16
		want int
	}{{0, dns.RcodeNameError}, {1 << dns.RcodeNameError, dns.RcodeSuccess}, {1 << dns.RcodeFormatError, dns.RcodeNameError}} {
		g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{nx.addr, good.addr}, Proto: TCP, FailoverRcodes: tc.mask}, nil)
		ans, err := g.Exchange(context.Background(), query(t, "f.example.", 7))
		if err != nil || wire.Rcode(ans) != tc.want {
			t.Errorf("failover %b: rcode %d (%v), want %d", tc.mask, wire.Rcode(ans), err, tc.want)
		}
	}
	dead := deadAddr(t)
	for _, tc := range []struct {
		max int
		ok  bool
	}{{0, true}, {1, false}, {2, true}} {
		g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{dead, good.addr}, Proto: TCP, MaxFails: -1, MaxTries: tc.max}, nil)
		_, err := g.Exchange(context.Background(), query(t, "m.example.", 8))
		if (err == nil) != tc.ok {
			t.Errorf("MaxTries %d: %v", tc.max, err)
		}
	}
}
