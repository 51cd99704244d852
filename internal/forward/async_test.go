package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// doneRec is a Done that records every call: the first result, and how many calls came.
type doneRec struct {
	mu    sync.Mutex
	calls int
	ans   []byte
	err   error
	stack string        // of the goroutine that made the first call
	got   chan struct{} // closed at the first call
}

func newDoneRec() *doneRec { return &doneRec{got: make(chan struct{})} }

func (d *doneRec) ExchangeDone(ans []byte, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.calls == 1 {
		buf := make([]byte, 16<<10)
		// The answer may be the reader's buffer, valid only during the call.
		d.ans, d.err, d.stack = bytes.Clone(ans), err, string(buf[:runtime.Stack(buf, false)])
		close(d.got)
	}
}

// wait returns the first result, failing the test if none comes within 10 s.
func (d *doneRec) wait(t testing.TB) ([]byte, error) {
	t.Helper()
	tm := time.NewTimer(10 * time.Second)
	defer tm.Stop()
	select {
	case <-d.got:
	case <-tm.C:
		t.Fatal("ExchangeDone not called within 10 s")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ans, d.err
}

// called reports whether the result came.
func (d *doneRec) called() bool {
	select {
	case <-d.got:
		return true
	default:
		return false
	}
}

func (d *doneRec) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

// exchangeAsync is ExchangeAsync waited for; the Done is returned for its checks.
func exchangeAsync(t testing.TB, g *Group, q []byte, timeout time.Duration) (*doneRec, []byte, error) {
	t.Helper()
	d := newDoneRec()
	g.ExchangeAsync(q, timeout, d)
	ans, err := d.wait(t)
	return d, ans, err
}

// settleOnce closes g, fires whatever is left on clk (nil: none), waits until none of the
// package's goroutines runs (readers, writers, try timers, resumed walks: whoever could
// still call a Done), then checks that every Done was called exactly once.
func settleOnce(t *testing.T, g *Group, clk *clock.Fake, dones ...*doneRec) {
	t.Helper()
	g.Close()
	if clk != nil {
		clk.Advance(24 * time.Hour)
	}
	if leaks := waitNoLeaks(5 * time.Second); len(leaks) > 0 {
		t.Fatalf("goroutines of the package still run after Close:\n%s", strings.Join(leaks, "\n\n"))
	}
	for i, d := range dones {
		if n := d.count(); n != 1 {
			t.Errorf("query %d: ExchangeDone called %d times, want once", i, n)
		}
	}
}

// sentinels are the errors a caller branches on; two results are the same when they wrap the
// same ones.
var sentinels = []error{ErrNoAnswer, ErrClosed, ErrOverloaded, ErrBadQuery, context.DeadlineExceeded, context.Canceled}

func sameErr(a, b error) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	for _, s := range sentinels {
		if errors.Is(a, s) != errors.Is(b, s) {
			return false
		}
	}
	return true
}

// obsSnapshot is what a recorder saw, with upstream addresses replaced by their position in
// servers, so two groups on two sets of equal upstreams compare.
func obsSnapshot(r *recorder, servers []netip.AddrPort) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := func(s string) string {
		for i, a := range servers {
			s = strings.ReplaceAll(s, a.String(), fmt.Sprintf("s%d", i))
		}
		return s
	}
	var parts []string
	for k, n := range r.failures {
		parts = append(parts, fmt.Sprintf("fail[%s]=%d", name(k), n))
	}
	for k, n := range r.exchanges {
		parts = append(parts, fmt.Sprintf("answers[%s]=%d", name(k), n))
	}
	for k, n := range r.rcodes {
		parts = append(parts, fmt.Sprintf("rcode[%d]=%d", k, n))
	}
	slices.Sort(parts)
	var b strings.Builder
	b.WriteString(strings.Join(parts, " "))
	for _, h := range r.health {
		fmt.Fprintf(&b, " health[%s]", name(h))
	}
	fmt.Fprintf(&b, " inflight=%d", r.inflight)
	return b.String()
}

// upstreams is a fresh set of test upstreams and the number of queries they received (UDP
// and TCP together).
type upstreams struct {
	addrs   []netip.AddrPort
	queries []func() int32
}

func (u *upstreams) add(addr netip.AddrPort, queries func() int32) {
	u.addrs = append(u.addrs, addr)
	u.queries = append(u.queries, queries)
}

func (u *upstreams) seen() []int32 {
	var out []int32
	for _, q := range u.queries {
		out = append(out, q())
	}
	return out
}

func noQueries() int32 { return 0 }

func udpUp(t *testing.T, u *upstreams, handle func(q []byte, reply func([]byte))) {
	s := startUDP(t, handle)
	u.add(s.addr, s.queries.Load)
}

func tcpUp(t *testing.T, u *upstreams, serve func(s *tcpServer, c net.Conn, conn int)) {
	s := startTCP(t, serve)
	u.add(s.addr, s.queries.Load)
}

// udpAndTCPUp starts a UDP and a TCP upstream on one port.
func udpAndTCPUp(t *testing.T, u *upstreams, handle func(q []byte, reply func([]byte)), serve func(s *tcpServer, c net.Conn, conn int)) {
	t.Helper()
	for range 10 { // find a port free for both TCP and UDP
		tcp := startTCP(t, serve)
		pc, err := net.ListenPacket("udp", tcp.addr.String())
		if err != nil {
			continue
		}
		pc.Close()
		udp := startUDPOn(t, tcp.addr.String(), handle)
		u.add(udp.addr, func() int32 { return udp.queries.Load() + tcp.queries.Load() })
		return
	}
	t.Fatal("no port free for both TCP and UDP")
}

func udpClosedPort(t *testing.T) netip.AddrPort {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	return a
}

func answering(q []byte, reply func([]byte)) { reply(answerFor(q)) }
func silent([]byte, func([]byte))            {}
func rcodeUDP(rc int) func(q []byte, reply func([]byte)) {
	return func(q []byte, reply func([]byte)) { reply(replyWith(q, rc)) }
}

// malformedUDP answers with the right header and question, then a record cut short.
func malformedUDP(q []byte, reply func([]byte)) {
	a := answerFor(q)
	reply(a[:len(a)-3])
}

func truncatedUDP(q []byte, reply func([]byte)) {
	m := new(dns.Msg)
	m.Unpack(q)
	r := new(dns.Msg)
	r.SetReply(m)
	r.Truncated = true
	b, _ := r.Pack()
	reply(b)
}

// oversizedUDP answers with about 2 KB over UDP, no TC bit, whatever the query advertised.
func oversizedUDP(q []byte, reply func([]byte)) {
	m := new(dns.Msg)
	m.Unpack(q)
	r := new(dns.Msg)
	r.SetReply(m)
	big := make([]string, 8)
	for i := range big {
		big[i] = strings.Repeat("x", 250)
	}
	r.Answer = append(r.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30}, Txt: big})
	b, _ := r.Pack()
	reply(b)
}

// closesAfterFirst answers the first query it gets (on any connection), then closes every
// connection on reading a query.
func closesAfterFirst() func(s *tcpServer, c net.Conn, _ int) {
	var answered atomic.Bool
	return func(s *tcpServer, c net.Conn, _ int) {
		for {
			q, err := s.read(c)
			if err != nil {
				return
			}
			if !answered.CompareAndSwap(false, true) {
				return
			}
			if writeFrame(c, answerFor(q)) != nil {
				return
			}
		}
	}
}

// closesSecondOnFirstConn answers everything except the second query on its first
// connection, on which it closes that connection.
func closesSecondOnFirstConn(s *tcpServer, c net.Conn, conn int) {
	for n := 0; ; n++ {
		q, err := s.read(c)
		if err != nil {
			return
		}
		if conn == 0 && n == 1 {
			return
		}
		if writeFrame(c, answerFor(q)) != nil {
			return
		}
	}
}

func rcodeTCP(rc int) func(s *tcpServer, c net.Conn, _ int) {
	return serveWith(func(q []byte) []byte { return replyWith(q, rc) })
}

// ExchangeAsync gives the result Exchange gives, with the same accounting (failures, answers,
// health) and the same queries at the upstreams, in every case of the walk. Each case runs on
// two groups with equal configurations over two sets of equal upstreams: one asked with
// Exchange, the other with ExchangeAsync.
func TestExchangeAsyncSameAsExchange(t *testing.T) {
	// tries that must time out do on the real clock; answers from loopback come well
	// within it even under the load of the whole suite with -race (and, five
	// times longer, under user-mode emulation: emulated).
	try := emulated(300 * time.Millisecond)
	type outcome int
	const (
		wantTXT outcome = iota
		wantRcode
		wantErr
	)
	tests := []struct {
		name    string
		proto   Proto
		ups     func(t *testing.T, u *upstreams)
		warm    bool // an Exchange before, so a TCP pool has a connection and the try is made inline
		prep    func(g *Group)
		timeout time.Duration // 0: 5 s
		query   func(t *testing.T) []byte
		want    outcome
		rcode   int   // wantRcode
		err     error // wantErr
		within  time.Duration
		try     time.Duration // 0: try
		spread  bool
	}{
		{name: "udp answer", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, answering) }},
		{name: "udp silent then answer", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, silent); udpUp(t, u, answering) }},
		{name: "udp port closed then answer", ups: func(t *testing.T, u *upstreams) {
			u.add(udpClosedPort(t), noQueries)
			udpUp(t, u, answering)
		}},
		{name: "udp port closed only", ups: func(t *testing.T, u *upstreams) { u.add(udpClosedPort(t), noQueries) }, want: wantErr, err: ErrNoAnswer},
		{name: "udp malformed then answer", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, malformedUDP); udpUp(t, u, answering) }},
		{name: "udp servfail then answer", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, rcodeUDP(dns.RcodeServerFailure))
			udpUp(t, u, answering)
		}},
		{name: "udp refused then answer", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, rcodeUDP(dns.RcodeRefused))
			udpUp(t, u, answering)
		}},
		{name: "udp servfail then silent", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, rcodeUDP(dns.RcodeServerFailure))
			udpUp(t, u, silent)
		}, want: wantRcode, rcode: dns.RcodeServerFailure},
		{name: "udp servfail only", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, rcodeUDP(dns.RcodeServerFailure)) },
			want: wantRcode, rcode: dns.RcodeServerFailure},
		{name: "udp servfail twice", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, rcodeUDP(dns.RcodeServerFailure))
			udpUp(t, u, rcodeUDP(dns.RcodeRefused))
		}, want: wantRcode, rcode: dns.RcodeRefused},
		{name: "udp nxdomain kept", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, rcodeUDP(dns.RcodeNameError))
			udpUp(t, u, answering)
		}, want: wantRcode, rcode: dns.RcodeNameError},
		{name: "udp all silent", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, silent); udpUp(t, u, silent) },
			want: wantErr, err: ErrNoAnswer},
		{name: "udp truncated then tcp", ups: func(t *testing.T, u *upstreams) { udpAndTCPUp(t, u, truncatedUDP, serveInOrder(0)) }},
		{name: "udp oversized then tcp", ups: func(t *testing.T, u *upstreams) { udpAndTCPUp(t, u, oversizedUDP, serveInOrder(0)) },
			query: func(t *testing.T) []byte {
				m := new(dns.Msg)
				m.SetQuestion("async.example.", dns.TypeTXT)
				m.Id = 0xA5A5
				m.SetEdns0(1232, false)
				q, err := m.Pack()
				if err != nil {
					t.Fatal(err)
				}
				return q
			}},
		{name: "udp truncated, tcp silent, then answer", ups: func(t *testing.T, u *upstreams) {
			udpAndTCPUp(t, u, truncatedUDP, serveWith(func([]byte) []byte { return nil }))
			udpUp(t, u, answering)
		}},
		{name: "udp truncated, tcp refused", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, truncatedUDP) // nothing listens on its port over TCP (or something else does: any failure)
			udpUp(t, u, answering)
		}},
		{name: "udp all down, answer", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, answering); udpUp(t, u, answering) },
			prep: func(g *Group) {
				for _, u := range g.ups {
					u.down.Store(true)
				}
			}},
		{name: "udp all down, silent", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, silent); udpUp(t, u, silent) },
			prep: func(g *Group) {
				for _, u := range g.ups {
					u.down.Store(true)
				}
			}, want: wantErr, err: ErrNoAnswer},
		{name: "udp first down, servfail from second", ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, answering)
			udpUp(t, u, rcodeUDP(dns.RcodeServerFailure))
		}, prep: func(g *Group) { g.ups[0].down.Store(true) }, want: wantRcode, rcode: dns.RcodeServerFailure},
		{name: "udp deadline before the try ends", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, silent) },
			timeout: 100 * time.Millisecond, try: 3 * time.Second, want: wantErr, err: ErrNoAnswer, within: time.Second},
		{name: "deadline already past", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, answering) },
			timeout: -time.Second, want: wantErr, err: ErrNoAnswer, within: time.Second},
		{name: "udp spread", spread: true, ups: func(t *testing.T, u *upstreams) { udpUp(t, u, answering); udpUp(t, u, answering) }},
		{name: "udp spread, servfail from the first's turn", spread: true, ups: func(t *testing.T, u *upstreams) {
			udpUp(t, u, rcodeUDP(dns.RcodeServerFailure))
			udpUp(t, u, answering)
		}},
		{name: "bad query", ups: func(t *testing.T, u *upstreams) { udpUp(t, u, answering) },
			query: func(*testing.T) []byte { return []byte{1, 2, 3} }, want: wantErr, err: ErrBadQuery},

		{name: "tcp answer, dialling", proto: TCP, ups: func(t *testing.T, u *upstreams) { tcpUp(t, u, servePipelined) }},
		{name: "tcp answer", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) { tcpUp(t, u, servePipelined) }},
		{name: "tcp refused then answer", proto: TCP, ups: func(t *testing.T, u *upstreams) {
			u.add(deadAddr(t), noQueries)
			tcpUp(t, u, servePipelined)
		}},
		{name: "tcp servfail then answer", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) {
			tcpUp(t, u, rcodeTCP(dns.RcodeServerFailure))
			tcpUp(t, u, servePipelined)
		}},
		{name: "tcp servfail only", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) {
			tcpUp(t, u, rcodeTCP(dns.RcodeServerFailure))
		}, want: wantRcode, rcode: dns.RcodeServerFailure},
		{name: "tcp silent then answer", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) {
			tcpUp(t, u, serveWith(func(q []byte) []byte {
				if bytes.Contains(q, []byte("warm")) {
					return answerFor(q)
				}
				return nil
			}))
			tcpUp(t, u, servePipelined)
		}},
		{name: "tcp peer closes once", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) { tcpUp(t, u, closesSecondOnFirstConn) }},
		{name: "tcp peer always closes", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) { tcpUp(t, u, closesAfterFirst()) },
			want: wantErr, err: ErrNoAnswer},
		{name: "tcp peer always closes then answer", proto: TCP, warm: true, ups: func(t *testing.T, u *upstreams) {
			tcpUp(t, u, closesAfterFirst())
			tcpUp(t, u, servePipelined)
		}},
		{name: "tcp all down, refused", proto: TCP, ups: func(t *testing.T, u *upstreams) { u.add(deadAddr(t), noQueries) },
			prep: func(g *Group) { g.ups[0].down.Store(true) }, want: wantErr, err: ErrNoAnswer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timeout := tt.timeout
			if timeout == 0 {
				timeout = 5 * time.Second
			}
			type result struct {
				ans     []byte
				err     error
				took    time.Duration
				obs     string
				queries []int32
			}
			run := func(async bool) result {
				var u upstreams
				tt.ups(t, &u)
				rec := newRecorder()
				tryTimeout := tt.try
				if tryTimeout == 0 {
					tryTimeout = try
				}
				g := newGroup(t, GroupConfig{Servers: u.addrs, Proto: tt.proto, TryTimeout: tryTimeout, Spread: tt.spread}, rec)
				if tt.warm {
					g.Exchange(context.Background(), query(t, "warm.example.", 1))
				}
				if tt.prep != nil {
					tt.prep(g)
				}
				q := query(t, "Async.Example.", 0xA5A5)
				if tt.query != nil {
					q = tt.query(t)
				}
				orig := bytes.Clone(q)
				var r result
				start := time.Now()
				if async {
					var d *doneRec
					d, r.ans, r.err = exchangeAsync(t, g, q, timeout)
					r.took = time.Since(start)
					if n := rec.inflightNow(); n != 0 {
						t.Errorf("async: %d in flight after ExchangeDone", n)
					}
					settleOnce(t, g, nil, d)
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					r.ans, r.err = g.Exchange(ctx, q)
					r.took = time.Since(start)
					cancel()
					g.Close()
				}
				if !bytes.Equal(q, orig) {
					t.Errorf("async %v: the query was modified", async)
				}
				// Let the late answers and closes of the upstreams be counted, then compare.
				r.obs = obsSnapshot(rec, u.addrs)
				r.queries = u.seen()
				return r
			}
			sync, async := run(false), run(true)
			for _, r := range []struct {
				how string
				result
			}{{"Exchange", sync}, {"ExchangeAsync", async}} {
				var err error
				switch tt.want {
				case wantTXT:
					if r.err != nil {
						err = r.err
					} else {
						err = checkTXT(r.ans, "async.example.", 0xA5A5)
					}
				case wantRcode:
					switch {
					case r.err != nil:
						err = r.err
					case wire.Rcode(r.ans) != tt.rcode || wire.ID(r.ans) != 0xA5A5:
						err = fmt.Errorf("rcode %d ID %#x, want rcode %d ID 0xa5a5", wire.Rcode(r.ans), wire.ID(r.ans), tt.rcode)
					}
				case wantErr:
					if !errors.Is(r.err, tt.err) {
						err = fmt.Errorf("error %v, want %v", r.err, tt.err)
					}
				}
				if err != nil {
					t.Errorf("%s: %v", r.how, err)
				}
				if within := emulated(tt.within); within > 0 && r.took > within {
					t.Errorf("%s took %v, want at most %v", r.how, r.took, within)
				}
			}
			if !bytes.Equal(sync.ans, async.ans) {
				t.Errorf("answers differ:\nExchange      %x\nExchangeAsync %x", sync.ans, async.ans)
			}
			if !sameErr(sync.err, async.err) {
				t.Errorf("errors differ:\nExchange      %v\nExchangeAsync %v", sync.err, async.err)
			}
			if sync.obs != async.obs {
				t.Errorf("accounting differs:\nExchange      %s\nExchangeAsync %s", sync.obs, async.obs)
			}
			if !slices.Equal(sync.queries, async.queries) {
				t.Errorf("queries at the upstreams differ: Exchange %v, ExchangeAsync %v", sync.queries, async.queries)
			}
		})
	}
}

// calledFrom reports whether the first call came from a goroutine running fn.
func (d *doneRec) calledFrom(fn string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Contains(d.stack, fn)
}

// The first server's answer comes back with the caller's ID, handed to Done once by the
// upstream's reader itself (no goroutine between), with nothing left in flight.
func TestExchangeAsyncFirstServerAnswers(t *testing.T) {
	for _, proto := range []Proto{UDP, TCP} {
		t.Run(proto.String(), func(t *testing.T) {
			var u upstreams
			reader := "(*udpSock).readLoop"
			if proto == TCP {
				tcpUp(t, &u, servePipelined)
				reader = "(*tcpConn).readLoop"
			} else {
				udpUp(t, &u, answering)
			}
			rec := newRecorder()
			g := newGroup(t, GroupConfig{Servers: u.addrs, Proto: proto}, rec)
			if proto == TCP { // a connection to send on
				if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
					t.Fatal(err)
				}
			}
			var dones []*doneRec
			for i := range 20 {
				name := fmt.Sprintf("Q%d.Example.", i)
				id := uint16(0xBEEF + i)
				q := query(t, name, id)
				orig := bytes.Clone(q)
				d, ans, err := exchangeAsync(t, g, q, 5*time.Second)
				dones = append(dones, d)
				if err != nil {
					t.Fatalf("query %d: %v", i, err)
				}
				if err := checkTXT(ans, strings.ToLower(name), id); err != nil {
					t.Fatalf("query %d: %v", i, err)
				}
				if !bytes.Equal(q, orig) {
					t.Fatalf("query %d modified", i)
				}
				if !d.calledFrom(reader) {
					t.Errorf("query %d: ExchangeDone not called by %s:\n%s", i, reader, d.stack)
				}
				if n := rec.inflightNow(); n != 0 {
					t.Errorf("query %d: %d in flight after ExchangeDone", i, n)
				}
			}
			if n := u.seen()[0]; proto == UDP && n != 20 || proto == TCP && n != 21 {
				t.Errorf("upstream saw %d queries", n)
			}
			settleOnce(t, g, nil, dones...)
		})
	}
}

// A first server that stays silent times the first try out on the group's clock; the walk
// goes on to the second server. Failures count towards down as Exchange's do: after maxFails
// the silent server is marked down and skipped, and the next query's first try is the
// second server's.
func TestExchangeAsyncFailoverAndDown(t *testing.T) {
	for _, proto := range []Proto{UDP, TCP} {
		t.Run(proto.String(), func(t *testing.T) {
			const try = time.Second
			var u upstreams
			if proto == TCP {
				tcpUp(t, &u, serveWith(func(q []byte) []byte {
					if bytes.Contains(q, []byte("warm")) {
						return answerFor(q)
					}
					return nil
				}))
				tcpUp(t, &u, servePipelined)
			} else {
				udpUp(t, &u, silent)
				udpUp(t, &u, answering)
			}
			rec := newRecorder()
			clk := newFake()
			g := newGroup(t, GroupConfig{Servers: u.addrs, Proto: proto, TryTimeout: try, Clock: clk}, rec)
			warm := int32(0)
			if proto == TCP {
				if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
					t.Fatal(err)
				}
				warm = 1
			}
			first, second := u.addrs[0].String(), u.addrs[1].String()
			var dones []*doneRec
			for i := range maxFails {
				name := fmt.Sprintf("f%d.example.", i)
				d := newDoneRec()
				dones = append(dones, d)
				g.ExchangeAsync(query(t, name, uint16(i)), time.Hour, d)
				waitFor(t, 5*time.Second, "the query at the silent server", func() bool { return u.seen()[0] == warm+int32(i+1) })
				if d.called() {
					t.Fatalf("query %d done before its try ended", i)
				}
				advanceWhen(t, clk, 1, try)
				ans, err := d.wait(t)
				if err != nil {
					t.Fatalf("query %d: %v", i, err)
				}
				if err := checkTXT(ans, name, uint16(i)); err != nil {
					t.Fatalf("query %d: %v", i, err)
				}
				if n := rec.failuresOf(first, KindTimeout); n != i+1 {
					t.Errorf("after query %d: %d timeouts of the silent server, want %d", i, n, i+1)
				}
				if down := rec.hasHealth(first + " down"); down != (i+1 == maxFails) {
					t.Errorf("after %d timeouts: marked down %v, want %v", i+1, down, i+1 == maxFails)
				}
			}
			d := newDoneRec()
			dones = append(dones, d)
			g.ExchangeAsync(query(t, "skip.example.", 99), time.Hour, d)
			ans, err := d.wait(t)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkTXT(ans, "skip.example.", 99); err != nil {
				t.Fatal(err)
			}
			if n := u.seen()[0]; n != warm+maxFails {
				t.Errorf("the down server got %d queries, want %d", n, warm+maxFails)
			}
			if rec.exchangesAt(second) != maxFails+1 {
				t.Errorf("second server answered %d, want %d", rec.exchangesAt(second), maxFails+1)
			}
			if proto == UDP && !d.calledFrom("(*udpSock).readLoop") {
				t.Errorf("with the first server down, the second's answer did not come from its reader:\n%s", d.stack)
			}
			settleOnce(t, g, clk, dones...)
		})
	}
}

// holdingTCP answers queries whose name contains marker only once release is closed, the
// others at once, out of order.
func holdingTCP(marker string, release <-chan struct{}) func(s *tcpServer, c net.Conn, _ int) {
	return func(s *tcpServer, c net.Conn, _ int) {
		var wmu sync.Mutex
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			q, err := s.read(c)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if bytes.Contains(q, []byte(marker)) {
					<-release
				}
				wmu.Lock()
				defer wmu.Unlock()
				writeFrame(c, answerFor(q))
			}()
		}
	}
}

// A TCP try that needs a dial (no connection yet, or the open one busy while the pool may
// grow) or a free slot (the pool full) is made from a goroutine, the blocking way, with the
// same result; one with a free slot on an open connection is sent inline.
func TestExchangeAsyncTCPPoolFullOrDialling(t *testing.T) {
	release := make(chan struct{})
	srv := startTCP(t, holdingTCP("hold", release))
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1, MaxPerConn: 1}, rec)

	dial, _, err := exchangeAsync(t, g, query(t, "dial.example.", 1), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !dial.calledFrom("(*asyncExchange).resume") {
		t.Errorf("a try that had to dial was not made by resume:\n%s", dial.stack)
	}

	held := newDoneRec()
	g.ExchangeAsync(query(t, "hold.example.", 2), 5*time.Second, held) // the only slot
	waitFor(t, 5*time.Second, "the held query at the upstream", func() bool { return srv.queries.Load() == 2 })
	waiting := newDoneRec()
	g.ExchangeAsync(query(t, "next.example.", 3), 5*time.Second, waiting) // waits for the slot
	if waiting.called() || held.called() {
		t.Fatal("a query finished while the slot was held")
	}
	close(release)
	for _, c := range []struct {
		d    *doneRec
		name string
		id   uint16
		by   string
	}{{held, "hold.example.", 2, "(*tcpConn).readLoop"}, {waiting, "next.example.", 3, "(*asyncExchange).resume"}} {
		ans, err := c.d.wait(t)
		if err == nil {
			err = checkTXT(ans, c.name, c.id)
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.d.calledFrom(c.by) {
			t.Errorf("%s: ExchangeDone not called by %s:\n%s", c.name, c.by, c.d.stack)
		}
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1 (PoolSize)", n)
	}
	settleOnce(t, g, nil, dial, held, waiting)

	// PoolSize 2: the open connection busy, the try dials the second.
	release2 := make(chan struct{})
	srv2 := startTCP(t, holdingTCP("hold", release2))
	g2 := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv2.addr}, Proto: TCP, PoolSize: 2}, nil)
	if _, err := g2.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
		t.Fatal(err)
	}
	busy := newDoneRec()
	g2.ExchangeAsync(query(t, "hold.example.", 2), 5*time.Second, busy)
	waitFor(t, 5*time.Second, "the held query at the upstream", func() bool { return srv2.queries.Load() == 2 })
	second, _, err := exchangeAsync(t, g2, query(t, "other.example.", 3), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := srv2.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want a second one dialled for the query", n)
	}
	if !second.calledFrom("(*asyncExchange).resume") {
		t.Errorf("a try that had to dial was not made by resume:\n%s", second.stack)
	}
	close(release2)
	if _, err := busy.wait(t); err != nil {
		t.Fatal(err)
	}
	settleOnce(t, g2, nil, busy, second)
}

// A pooled connection the upstream closes before answering the first try: the query is sent
// once more on another connection, and answered.
func TestExchangeAsyncTCPPeerCloseRetried(t *testing.T) {
	srv := startTCP(t, closesSecondOnFirstConn)
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP}, rec)
	if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
		t.Fatal(err)
	}
	d, ans, err := exchangeAsync(t, g, query(t, "retry.example.", 5), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTXT(ans, "retry.example.", 5); err != nil {
		t.Fatal(err)
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("accepted %d connections, want 2 (original and retry)", n)
	}
	if n := rec.failuresOf("", KindClosed); n != 1 {
		t.Errorf("closed failures %d, want 1", n)
	}
	if n := rec.exchangesAt(srv.addr.String()); n != 2 {
		t.Errorf("answers reported %d, want 2 (warm-up and retry)", n)
	}
	settleOnce(t, g, nil, d)
}

// A first try on a connection that delivers nothing for the whole try times out on the
// group's clock and closes the connection as stalled, as Exchange's does; the second pass
// fails the same way, and the query ends with ErrNoAnswer.
func TestExchangeAsyncTCPStalledClosed(t *testing.T) {
	release := make(chan struct{})
	srv := startTCP(t, holdingTCP("hold", release))
	rec := newRecorder()
	clk := newFake()
	const try = 100 * time.Millisecond
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1, TryTimeout: try, Clock: clk}, rec)
	if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
		t.Fatal(err)
	}
	d := newDoneRec()
	g.ExchangeAsync(query(t, "hold.example.", 2), time.Hour, d)
	for pass := range 2 {
		waitFor(t, 5*time.Second, "query at the upstream", func() bool { return srv.queries.Load() == int32(pass+2) })
		advanceWhen(t, clk, 1, try)
	}
	_, err := d.wait(t)
	if !errors.Is(err, ErrNoAnswer) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want ErrNoAnswer wrapping a deadline", err)
	}
	if n := rec.failuresOf(srv.addr.String(), KindTimeout); n != 2 {
		t.Errorf("timeouts %d, want 2 (two passes)", n)
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the stalled first one closed, the second dialled", n)
	}
	pool := g.ups[0].tcp
	waitFor(t, 5*time.Second, "the stalled connections to close", func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return len(pool.conns) == 0
	})
	close(release)
	if n := rec.failuresOf("", KindMismatch); n != 0 {
		t.Errorf("late answers counted as %d mismatches", n)
	}
	settleOnce(t, g, clk, d)
}

// Closing the group while a try is out (the first, inline one, or one of the walk's goroutine
// after a failover) ends the query with ErrClosed, once; a query after Close fails at once.
func TestExchangeAsyncGroupClosed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		proto Proto
		tries int // tries out when the group closes: 1 the first, 2 a failover's
	}{{"udp first try", UDP, 1}, {"udp failover", UDP, 2}, {"tcp first try", TCP, 1}, {"tcp failover", TCP, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			var u upstreams
			for range 2 {
				if tc.proto == TCP {
					tcpUp(t, &u, serveWith(func(q []byte) []byte {
						if bytes.Contains(q, []byte("warm")) {
							return answerFor(q)
						}
						return nil
					}))
				} else {
					udpUp(t, &u, silent)
				}
			}
			rec := newRecorder()
			clk := newFake()
			const try = time.Second
			g := newGroup(t, GroupConfig{Servers: u.addrs, Proto: tc.proto, TryTimeout: try, Clock: clk}, rec)
			warm := int32(0)
			if tc.proto == TCP {
				if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
					t.Fatal(err)
				}
				warm = 1
			}
			d := newDoneRec()
			g.ExchangeAsync(query(t, "closed.example.", 3), time.Hour, d)
			waitFor(t, 5*time.Second, "the query at the first server", func() bool { return u.seen()[0] == warm+1 })
			if tc.tries == 2 {
				advanceWhen(t, clk, 1, try)
				waitFor(t, 5*time.Second, "the query at the second server", func() bool { return u.seen()[1] == 1 })
			}
			if d.called() {
				t.Fatal("done before the group closed")
			}
			g.Close()
			_, err := d.wait(t)
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("error %v, want ErrClosed", err)
			}
			if n := rec.failuresOf("", KindNetwork) + rec.failuresOf("", KindClosed); n != 0 {
				t.Errorf("closing counted as %d upstream failures", n)
			}
			after := newDoneRec()
			g.ExchangeAsync(query(t, "after.example.", 4), time.Hour, after)
			if !after.called() {
				t.Error("a query after Close not done at once")
			}
			if _, err := after.wait(t); !errors.Is(err, ErrClosed) {
				t.Errorf("query after Close: %v, want ErrClosed", err)
			}
			if n := rec.inflightNow(); n != 0 {
				t.Errorf("%d in flight after Close", n)
			}
			settleOnce(t, g, clk, d, after)
		})
	}
}

// Past MaxInflight, ExchangeAsync fails at once (before it returns) with ErrOverloaded,
// counted, and the query in flight is not disturbed.
func TestExchangeAsyncOverloaded(t *testing.T) {
	release := make(chan struct{})
	srv := startUDP(t, func(q []byte, reply func([]byte)) {
		go func() { <-release; reply(answerFor(q)) }()
	})
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, MaxInflight: 2}, rec)
	var dones []*doneRec
	for i := range 2 {
		d := newDoneRec()
		dones = append(dones, d)
		g.ExchangeAsync(query(t, fmt.Sprintf("o%d.example.", i), uint16(i)), 5*time.Second, d)
	}
	waitFor(t, 5*time.Second, "two queries at the upstream", func() bool { return srv.queries.Load() == 2 })
	over := newDoneRec()
	g.ExchangeAsync(query(t, "third.example.", 3), 5*time.Second, over)
	if !over.called() {
		t.Fatal("ErrOverloaded not given before ExchangeAsync returned")
	}
	if _, err := over.wait(t); !errors.Is(err, ErrOverloaded) {
		t.Errorf("error %v, want ErrOverloaded", err)
	}
	if rec.failuresOf("", KindOverloaded) != 1 {
		t.Error("overload not counted")
	}
	if n := rec.inflightNow(); n != 2 {
		t.Errorf("%d in flight, want the 2", n)
	}
	close(release)
	for i, d := range dones {
		ans, err := d.wait(t)
		if err == nil {
			err = checkTXT(ans, fmt.Sprintf("o%d.example.", i), uint16(i))
		}
		if err != nil {
			t.Errorf("query %d: %v", i, err)
		}
	}
	if n := rec.inflightNow(); n != 0 {
		t.Errorf("%d in flight after the answers", n)
	}
	settleOnce(t, g, nil, append(dones, over)...)
}

// A bad query fails at once with ErrBadQuery, and nothing stays in flight.
func TestExchangeAsyncBadQuery(t *testing.T) {
	rec := newRecorder()
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{deadAddr(t)}}, rec)
	d := newDoneRec()
	g.ExchangeAsync([]byte{1, 2, 3}, time.Second, d)
	if !d.called() {
		t.Fatal("not done before ExchangeAsync returned")
	}
	if _, err := d.wait(t); !errors.Is(err, ErrBadQuery) {
		t.Errorf("error %v, want ErrBadQuery", err)
	}
	if n := rec.inflightNow(); n != 0 {
		t.Errorf("%d in flight", n)
	}
	settleOnce(t, g, nil, d)
}

// Many concurrent ExchangeAsync with answers arriving around the end of the try (a tiny
// TryTimeout on the real clock, upstreams answering after try/2 to 3·try/2): the answer
// and the try's timer race for every query, as do failovers and the group's resumed walks.
// Each query ends exactly once, with its own answer or ErrNoAnswer, and nothing is left.
func TestExchangeAsyncRaceAtTryTimeout(t *testing.T) {
	const (
		queries = 1000
		callers = 4
		wave    = 25
	)
	for _, tc := range []struct {
		proto Proto
		try   time.Duration // a TCP try includes more of the client's work: dial, pool, writer
	}{{UDP, 5 * time.Millisecond}, {TCP, 20 * time.Millisecond}} {
		proto, try := tc.proto, tc.try
		delay := func() time.Duration { return try/2 + rand.N(try) }
		t.Run(proto.String(), func(t *testing.T) {
			var u upstreams
			for range 2 {
				if proto == UDP {
					udpUp(t, &u, func(q []byte, reply func([]byte)) {
						time.AfterFunc(delay(), func() { reply(answerFor(q)) })
					})
					continue
				}
				tcpUp(t, &u, func(s *tcpServer, c net.Conn, _ int) {
					var wmu sync.Mutex
					var wg sync.WaitGroup
					defer wg.Wait()
					for {
						q, err := s.read(c)
						if err != nil {
							return
						}
						wg.Add(1)
						time.AfterFunc(delay(), func() {
							defer wg.Done()
							wmu.Lock()
							defer wmu.Unlock()
							writeFrame(c, answerFor(q))
						})
					}
				})
			}
			rec := newRecorder()
			// Never down: every query walks both servers twice, four races each.
			// MaxPerConn: no TCP try waits for a slot (it would time out waiting, not racing).
			g := newGroup(t, GroupConfig{Servers: u.addrs, Proto: proto, TryTimeout: try, MaxInflight: 2 * queries, MaxFails: -1, MaxPerConn: queries}, rec)
			if proto == TCP {
				// A connection to each server first, so the tries race answers, not dials.
				for i := range g.ups {
					for j, u := range g.ups {
						u.down.Store(j != i)
					}
					g.Exchange(context.Background(), query(t, "warm.example.", 1))
				}
				for _, u := range g.ups {
					u.down.Store(false)
				}
			}
			dones := make([]*doneRec, queries)
			name := func(i int) string { return fmt.Sprintf("r%d.example.", i) }
			var wg sync.WaitGroup
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Waves of `wave` queries per caller, each wave waited for: a steady
					// load of answers and timers around the try's end, not one burst
					// that times out waiting for the machine.
					var inWave []*doneRec
					for i := c; i < queries; i += callers {
						dones[i] = newDoneRec()
						inWave = append(inWave, dones[i])
						g.ExchangeAsync(query(t, name(i), uint16(i)), 2*time.Second, dones[i])
						if len(inWave) < wave && i+callers < queries {
							continue
						}
						for _, d := range inWave {
							select {
							case <-d.got:
							case <-time.After(10 * time.Second):
								t.Error("ExchangeDone not called within 10 s")
								return
							}
						}
						inWave = inWave[:0]
					}
				}()
			}
			wg.Wait()
			answered := 0
			for i, d := range dones {
				ans, err := d.wait(t)
				switch {
				case err == nil:
					if err := checkTXT(ans, name(i), uint16(i)); err != nil {
						t.Errorf("query %d: %v", i, err)
					}
					answered++
				case !errors.Is(err, ErrNoAnswer):
					t.Errorf("query %d: %v, want an answer or ErrNoAnswer", i, err)
				}
			}
			t.Logf("%s: %d of %d answered; failures %v", proto, answered, queries, rec.failures)
			if n := rec.inflightNow(); n != 0 {
				t.Errorf("%d in flight after every query ended", n)
			}
			settleOnce(t, g, nil, dones...)
		})
	}
}

// chanDone hands the result's error to a channel (a Done without allocations).
type chanDone chan error

func (c chanDone) ExchangeDone(_ []byte, err error) { c <- err }

// echoUDP is a UDP upstream that echoes each query as a NODATA answer (cheap, so the client
// side dominates), as BenchmarkUDPExchange's.
func echoUDP(b *testing.B) netip.AddrPort {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			buf[2] |= 0x80 // QR
			pc.WriteTo(buf[:n], from)
		}
	}()
	b.Cleanup(func() { pc.Close(); <-done })
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// echoTCP is BenchmarkTCPPoolExchange's upstream: each query echoed as a NODATA answer.
func echoTCP(b *testing.B) netip.AddrPort {
	srv := startTCP(b, func(s *tcpServer, c net.Conn, _ int) {
		buf := make([]byte, 2+512)
		for {
			q, err := readFrame(c)
			if err != nil {
				return
			}
			q[2] |= 0x80 // QR
			buf = buf[:2+len(q)]
			buf[0], buf[1] = byte(len(q)>>8), byte(len(q))
			copy(buf[2:], q)
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	return srv.addr
}

func benchmarkExchangeAsync(b *testing.B, proto Proto, addr netip.AddrPort) {
	g := newGroup(b, GroupConfig{Name: "bench", Servers: []netip.AddrPort{addr}, Proto: proto}, nil)
	q := query(b, "kubernetes.default.svc.cluster.local.", 1)
	if _, err := g.Exchange(context.Background(), q); err != nil { // a TCP connection open
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		d := make(chanDone, 1)
		for pb.Next() {
			g.ExchangeAsync(q, 5*time.Second, d)
			if err := <-d; err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkExchangeAsyncUDP is BenchmarkUDPExchange through ExchangeAsync: the answer handed
// to Done by the socket's reader.
func BenchmarkExchangeAsyncUDP(b *testing.B) { benchmarkExchangeAsync(b, UDP, echoUDP(b)) }

// BenchmarkExchangeAsyncTCP is BenchmarkTCPPoolExchange through ExchangeAsync: the frame
// written inline, the answer handed to Done by the connection's reader.
func BenchmarkExchangeAsyncTCP(b *testing.B) { benchmarkExchangeAsync(b, TCP, echoTCP(b)) }

// bigQuery is a TXT query for name padded (EDNS padding) to about size bytes.
func bigQuery(t testing.TB, name string, id uint16, size int) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeTXT)
	m.Id = id
	m.SetEdns0(1232, false)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_PADDING{Padding: make([]byte, size)})
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Inline TCP writes against an upstream that stops reading: once the socket takes no more,
// the rest of the frame goes to the connection's writer goroutine, and the frames queued
// after it follow it; when the upstream reads again every frame arrives whole, in one piece
// each, and every query gets its own answer.
func TestExchangeAsyncTCPInlineWriteBackpressure(t *testing.T) {
	const (
		size = 60000 // bytes of padding: a few hundred frames fill any loopback socket's buffers
		most = 400
	)
	release := make(chan struct{})
	var bad atomic.Int32
	srv := startTCP(t, func(s *tcpServer, c net.Conn, _ int) {
		for n := 0; ; n++ {
			if n == 1 {
				<-release // the warm-up answered, then nothing read until released
			}
			q, err := s.read(c)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if err := m.Unpack(q); err != nil || len(m.Question) != 1 {
				bad.Add(1) // a frame cut or mixed with another
				return
			}
			if writeFrame(c, answerFor(q)) != nil {
				return
			}
		}
	})
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, Proto: TCP, PoolSize: 1, MaxPerConn: most, TryTimeout: time.Minute}, nil)
	if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
		t.Fatal(err)
	}
	pool := g.ups[0].tcp
	pool.mu.Lock()
	c := pool.conns[0]
	pool.mu.Unlock()
	handedOver := func() bool {
		// The inline writer (this goroutine) lets go of the write side before
		// ExchangeAsync returns: if someone holds it now, it is the writer goroutine,
		// woken only by an inline write that could not finish.
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return c.writing || len(c.wbuf) > 0
	}
	var dones []*doneRec
	name := func(i int) string { return fmt.Sprintf("big%d.example.", i) }
	after := -1
	for i := 0; i < most && (after < 0 || i < after+5); i++ {
		d := newDoneRec()
		dones = append(dones, d)
		g.ExchangeAsync(bigQuery(t, name(i), uint16(i), size), time.Minute, d)
		if after < 0 && handedOver() {
			after = i
		}
	}
	if after < 0 {
		t.Fatalf("%d frames of %d bytes written inline without the socket ever filling", most, size)
	}
	t.Logf("the socket took no more at frame %d", after)
	close(release)
	for i, d := range dones {
		ans, err := d.wait(t)
		if err == nil {
			err = checkTXT(ans, name(i), uint16(i))
		}
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
	}
	if n := bad.Load(); n != 0 {
		t.Errorf("%d frames arrived broken", n)
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want the one", n)
	}
	settleOnce(t, g, nil, dones...)
}
