package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// panicZone is where the tests below make the serving path panic: names
// under it have a policy of their own, which the injected parts recognise.
const panicZone = "boom.example."

// panicking is a server whose block (an answer-side handler, run after a
// hit and before a miss's answer is delivered) and upstream (Fetch) panic
// for names under panicZone while armed, and answer as usual otherwise.
// Nothing else is changed: real sockets, the real resolver and cache.
type panicking struct {
	s              *Server
	z              *zoneForward
	armBlock       atomic.Bool // the block's handler panics for panicZone
	armFetch       atomic.Bool // the upstream fetch panics for panicZone
	fetches        atomic.Int64
	releaseFetches atomic.Pointer[chan struct{}] // closed: a fetch of panicZone goes on
	logs           *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startPanicking(t *testing.T) *panicking {
	t.Helper()
	p := &panicking{logs: &syncBuffer{}}
	open := make(chan struct{})
	close(open)
	p.releaseFetches.Store(&open)
	panics.SetLogger(slog.New(slog.NewTextHandler(p.logs, nil)))
	panics.ForgetLogged()
	t.Cleanup(func() { panics.SetLogger(nil) })
	pol := resolve.Policy{TTL: cache.Policy{SuccessMax: time.Minute, DenialMax: time.Minute}}
	def := &resolve.Block{Policy: pol, Metric: -1, Answer: answer.NewChain([]string{"loadbalance"}, []answer.Handler{panicHandler{}})}
	boom := &resolve.Block{Zone: panicZone, Policy: pol, Metric: -1, Answer: answer.NewChain([]string{"loadbalance"}, []answer.Handler{panicHandler{&p.armBlock}})}
	zone, _ := wire.AppendNameWire(nil, panicZone)
	blocks := func(name []byte) *resolve.Block {
		if wire.InZone(name, zone) {
			return boom
		}
		return def
	}
	p.s, p.z = startServer(t, nil, func(c *resolve.Config) {
		c.Blocks = blocks
		fwd := c.Fetch
		c.Fetch = func(ctx context.Context, name string, q []byte) ([]byte, error) {
			if strings.HasSuffix(name, panicZone) {
				p.fetches.Add(1)
				<-*p.releaseFetches.Load()
				if p.armFetch.Load() {
					panic("test: a panic injected in an upstream fetch")
				}
			}
			return fwd(ctx, name, q)
		}
	})
	return p
}

// panicHandler is a block's answer-side handler that panics on every
// answer while armed (nil: never).
type panicHandler struct{ armed *atomic.Bool }

func (panicHandler) Query(_ *answer.Request, out []byte) ([]byte, answer.Verdict) {
	return out, answer.Pass
}

func (h panicHandler) Answer(_ *answer.Request, out []byte, _ int) []byte {
	if h.armed != nil && h.armed.Load() {
		panic("test: a panic injected in what the block does to an answer")
	}
	return out
}

// askUDP sends queries for names over one UDP socket, back to back (one
// receive batch, mostly), and returns each answer's rcode by name (a name
// asked twice: the last answer's).
func askUDP(t *testing.T, s *Server, names ...string) map[string]int {
	t.Helper()
	c, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids := map[uint16]string{}
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		m.Id = uint16(100 + i)
		ids[m.Id] = n
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range names {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("answers %v of %v: %v", got, names, err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		name, ok := ids[r.Id]
		if !ok || len(r.Question) != 1 || r.Question[0].Name != name || !r.Response {
			t.Fatalf("answer %v matches no query", r)
		}
		got[name] = r.Rcode
	}
	return got
}

// askTCP sends the queries pipelined on one connection and returns the
// rcodes in the order asked; the connection must stay open.
func askTCP(t *testing.T, s *Server, names ...string) []int {
	t.Helper()
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []byte
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		m.Id = uint16(200 + i)
		b, _ := m.Pack()
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	rc := make([]int, len(names))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range names {
		var lb [2]byte
		if _, err := c.Read(lb[:]); err != nil {
			t.Fatalf("tcp: %v", err)
		}
		b := make([]byte, binary.BigEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("tcp: %v", err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(b); err != nil {
			t.Fatal(err)
		}
		rc[r.Id-200] = r.Rcode
	}
	return rc
}

// TestPanicInHitPathAnswersServfail: a panic after a cache hit (in what
// the block does to the answer) answers that query SERVFAIL, over UDP and
// TCP, and nothing else changes: the other queries of the same batch or
// connection are answered, the loop does not restart, the connection stays
// open, and the same name is answered from the cache once the cause is
// gone. Counted, and logged once with the query's shape, never its name.
func TestPanicInHitPathAnswersServfail(t *testing.T) {
	p := startPanicking(t)
	hit := "zq7xw." + panicZone
	if got := askUDP(t, p.s, hit, "ok.example."); got[hit] != dns.RcodeSuccess || got["ok.example."] != dns.RcodeSuccess {
		t.Fatalf("before: %v", got)
	}
	udp0, tcp0 := panics.Count(panics.UDP), panics.Count(panics.TCP)
	p.armBlock.Store(true)
	got := askUDP(t, p.s, "a.example.", hit, "b.example.", hit, "c.example.")
	want := map[string]int{"a.example.": dns.RcodeSuccess, hit: dns.RcodeServerFailure, "b.example.": dns.RcodeSuccess, "c.example.": dns.RcodeSuccess}
	for n, rc := range want {
		if got[n] != rc {
			t.Errorf("udp %s: rcode %d, want %d (all: %v)", n, got[n], rc, got)
		}
	}
	if rc := askTCP(t, p.s, "a.example.", hit, "b.example."); rc[0] != dns.RcodeSuccess || rc[1] != dns.RcodeServerFailure || rc[2] != dns.RcodeSuccess {
		t.Errorf("tcp rcodes %v, want NOERROR SERVFAIL NOERROR on one connection", rc)
	}
	if d := panics.Count(panics.UDP) - udp0; d < 2 {
		t.Errorf("udp panics counted %d, want 2 (the hit asked twice)", d)
	}
	if d := panics.Count(panics.TCP) - tcp0; d != 1 {
		t.Errorf("tcp panics counted %d, want 1", d)
	}
	p.armBlock.Store(false)
	before := p.z.n.Load()
	if got := askUDP(t, p.s, hit); got[hit] != dns.RcodeSuccess {
		t.Errorf("after: %v", got)
	}
	if p.z.n.Load() != before {
		t.Error("the cached name was asked upstream again: the panic cost the entry")
	}
	if err := p.s.CheckLoops(context.Background()); err != nil {
		t.Errorf("loops after the panics: %v", err)
	}
	logs := p.logs.String()
	if !strings.Contains(logs, "recovered a panic while serving") || !strings.Contains(logs, "where=udp") ||
		!strings.Contains(logs, "name of 20 bytes in 3 labels, type 1, class 1") {
		t.Errorf("log %q: want a line with the query's shape", logs)
	}
	if strings.Contains(logs, "zq7xw") || strings.Contains(logs, "boom") {
		t.Errorf("log %q names the query", logs)
	}
	if n := strings.Count(logs, "where=udp"); n != 1 {
		t.Errorf("%d udp lines logged, want 1 (one per place per 10 s)", n)
	}
}

// TestPanicInMissPathAnswersServfail: a panic while a miss is answered
// (what the block does to its answer, before it is delivered) or while
// its upstream answer is fetched answers every client of it SERVFAIL,
// coalesced ones too; the flight ends (the next asker starts a new one,
// which answers), and serving goes on.
func TestPanicInMissPathAnswersServfail(t *testing.T) {
	p := startPanicking(t)
	miss0, res0 := panics.Count(panics.Miss), panics.Count(panics.Resolve)

	// The block panics while the miss's answer is decorated.
	p.armBlock.Store(true)
	m1 := "miss1." + panicZone
	if got := askUDP(t, p.s, m1, "ok.example."); got[m1] != dns.RcodeServerFailure || got["ok.example."] != dns.RcodeSuccess {
		t.Errorf("miss with a panicking block: %v, want SERVFAIL and NOERROR", got)
	}
	if rc := askTCP(t, p.s, "miss2."+panicZone, "ok.example."); rc[0] != dns.RcodeServerFailure || rc[1] != dns.RcodeSuccess {
		t.Errorf("tcp miss with a panicking block: %v, want SERVFAIL NOERROR", rc)
	}
	if d := panics.Count(panics.Miss) - miss0; d < 2 {
		t.Errorf("miss panics counted %d, want 2", d)
	}
	p.armBlock.Store(false)

	// The fetch panics with three clients waiting on it.
	p.armFetch.Store(true)
	release := make(chan struct{})
	p.releaseFetches.Store(&release)
	m3 := "miss3." + panicZone
	done := make(chan map[string]int, 3)
	for range 3 {
		go func() { done <- askUDPNoFatal(p.s, m3) }()
	}
	for deadline := time.Now().Add(3 * time.Second); p.fetches.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no fetch started")
		}
	}
	time.Sleep(50 * time.Millisecond) // the other two join the flight
	close(release)
	for range 3 {
		if got := <-done; got[m3] != dns.RcodeServerFailure {
			t.Errorf("a client of the panicking fetch got %v, want SERVFAIL", got)
		}
	}
	if d := panics.Count(panics.Resolve) - res0; d != 1 {
		t.Errorf("resolve panics counted %d, want 1 (one fetch for three clients)", d)
	}
	if n := p.s.res.InFlight(); n != 0 {
		t.Errorf("%d flights left open after the panic", n)
	}
	p.armFetch.Store(false)
	if got := askUDP(t, p.s, m3, "ok2.example."); got[m3] != dns.RcodeSuccess || got["ok2.example."] != dns.RcodeSuccess {
		t.Errorf("after: %v, want the name answered by a new flight", got)
	}
}

// askUDPNoFatal is askUDP for one name from another goroutine: -1 on a
// failure.
func askUDPNoFatal(s *Server, name string) map[string]int {
	c, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		return map[string]int{name: -1}
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, _ := m.Pack()
	_, _ = c.Write(b)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return map[string]int{name: -1}
	}
	r := new(dns.Msg)
	if r.Unpack(buf[:n]) != nil {
		return map[string]int{name: -1}
	}
	return map[string]int{name: r.Rcode}
}

// TestServfailFromAnyBytes: the SERVFAIL after a panic is built from the
// raw query alone and never fails, whatever the bytes.
func TestServfailFromAnyBytes(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("x.example.", dns.TypeAAAA)
	m.SetEdns0(1232, true)
	m.Id = 77
	q, _ := m.Pack()
	out := appendServfail([]byte{1, 2}, q, 1232)
	r := new(dns.Msg)
	if err := r.Unpack(out[2:]); err != nil || r.Id != 77 || r.Rcode != dns.RcodeServerFailure || len(r.Question) != 1 || r.IsEdns0() == nil {
		t.Errorf("SERVFAIL %v, %v", r, err)
	}
	for _, raw := range [][]byte{nil, {1}, q[:12], q[:15], append(append([]byte(nil), q[:2]...), 0x80, 0, 0, 1)} {
		out := appendServfail(nil, raw, 1232)
		if len(raw) < 12 || raw[2]&0x80 != 0 {
			if len(out) != 0 {
				t.Errorf("%x: answered %x, want nothing (no query)", raw, out)
			}
			continue
		}
		if len(out) < 12 || out[3]&0xF != dns.RcodeServerFailure || out[0] != raw[0] || out[1] != raw[1] {
			t.Errorf("%x: answered %x", raw, out)
		}
	}
}

// BenchmarkAnswerGuardedHit is the cost of the hit path's guard: one
// cached query answered without the socket by answerLocal alone (bare) and
// by answerGuarded (guarded, what the loops call). Compare the two within
// one run.
func BenchmarkAnswerGuardedHit(b *testing.B) {
	s, _ := startServer(b, nil)
	m := new(dns.Msg)
	m.SetQuestion("bench.example.", dns.TypeA)
	raw, _ := m.Pack()
	c, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(raw)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1500)); err != nil {
		b.Fatal(err)
	}
	var st Stats
	req := &request{raw: raw, st: &st, now: time.Now().UnixNano()}
	out := make([]byte, 0, 1500)
	for _, guarded := range []bool{false, true, false, true} {
		name := "bare"
		if guarded {
			name = "guarded"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if guarded {
					out, _ = s.answerGuarded(req, out[:0])
				} else {
					out, _ = s.answerLocal(req, out[:0])
				}
			}
		})
	}
}
