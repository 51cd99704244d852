package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// zoneForward answers every query itself, the way an upstream would, and
// counts the queries it gets.
type zoneForward struct{ n atomic.Int64 }

func (z *zoneForward) forward(_ context.Context, _ string, query []byte) ([]byte, error) {
	z.n.Add(1)
	m := new(dns.Msg)
	if err := m.Unpack(query); err != nil {
		return nil, err
	}
	r := new(dns.Msg)
	r.SetReply(m)
	rr, _ := dns.NewRR(m.Question[0].Name + " 300 IN A 192.0.2.7")
	r.Answer = append(r.Answer, rr)
	return r.Pack()
}

// newResolver is a Resolver over a fresh cache, with one minute TTL caps
// everywhere; rmut may change its Config.
func newResolver(t testing.TB, fetch resolve.FetchFunc, rmut ...func(*resolve.Config)) *resolve.Resolver {
	t.Helper()
	pol, err := resolve.Zones(resolve.Policy{TTL: cache.Policy{SuccessMax: time.Minute, DenialMax: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := resolve.Config{Cache: cache.New(cache.Config{}), Fetch: fetch, Blocks: pol}
	for _, f := range rmut {
		f(&cfg)
	}
	r, err := resolve.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// emulated stretches a bound on the real clock under user-mode emulation
// (make crossarch runs these tests under qemu-ARCH-static and says so in
// NLD_TEST_EMULATOR): the emulated CPU runs the same code several times
// slower, more so on a loaded machine. Five times, natively unchanged.
func emulated(d time.Duration) time.Duration {
	if os.Getenv("NLD_TEST_EMULATOR") != "" {
		return 5 * d
	}
	return d
}

// startServer serves on 127.0.0.1 (one UDP socket, any port) with a
// Resolver over zoneForward; mutate changes the server's Config, rmut the
// Resolver's.
func startServer(t testing.TB, mutate func(*Config), rmut ...func(*resolve.Config)) (*Server, *zoneForward) {
	t.Helper()
	z := &zoneForward{}
	rmut = append([]func(*resolve.Config){func(c *resolve.Config) { c.Fetch = z.forward }}, rmut...)
	cfg := Config{
		Addrs:      []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		UDPSockets: 1,
		Resolver:   newResolver(t, z.forward, rmut...),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	s.Serve()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s, z
}

func TestIdleTCPConnectionIsClosed(t *testing.T) {
	s, _ := startServer(t, func(c *Config) { c.TCPIdleTimeout = 200 * time.Millisecond })
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	began := time.Now()
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read: %v, want EOF", err)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("closed after %v", d)
	}
}

func TestSlowLorisIsCutOff(t *testing.T) {
	s, _ := startServer(t, func(c *Config) { c.TCPReadTimeout = 200 * time.Millisecond })
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte{0, 40, 1}) // a length and one byte of 40, then nothing
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read: %v, want EOF", err)
	}
}

// TestTCPConnectionBound: a full table makes room by closing the
// longest-idle connection, and refuses a new one only when none is idle.
func TestTCPConnectionBound(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s, _ := startServer(t, func(c *Config) { c.MaxTCPConns = 2 }, func(c *resolve.Config) {
		c.Fetch = func(ctx context.Context, _ string, q []byte) ([]byte, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, context.Canceled
		}
	})
	dial := func() net.Conn { return tcpFrom(t, s, "127.0.0.1") }
	waitConns := func(n int64) { waitTCPConns(t, s, n) }
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err != nil
	}
	first := dial()
	waitConns(1)
	time.Sleep(10 * time.Millisecond) // first is the longest idle
	second := dial()
	waitConns(2)
	third := dial()
	if !closed(first) {
		t.Fatal("the longest-idle connection was not closed for the new one")
	}
	waitConns(2)
	if c := s.Snapshot(); c.TCPEvicted != 1 || c.TCPRefused != 0 {
		t.Fatalf("evicted %d refused %d, want 1 and 0", c.TCPEvicted, c.TCPRefused)
	}
	// Both open connections wait for a miss: none is idle, so a new one
	// is refused.
	for i, c := range []net.Conn{second, third} {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("busy%d.example.", i), dns.TypeA)
		b, _ := m.Pack()
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(3 * time.Second); s.Snapshot().CacheMisses < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two misses did not start")
		}
	}
	fourth := dial()
	if !closed(fourth) {
		t.Fatal("a connection was served with none idle to close")
	}
	if c := s.Snapshot(); c.TCPRefused != 1 || c.TCPEvicted != 1 {
		t.Fatalf("refused %d evicted %d, want 1 and 1", c.TCPRefused, c.TCPEvicted)
	}
}

// TestTCPShareEvictsTheClientsOwn: a client holding its share of a full
// table loses its own longest-idle connection to a new one of its own,
// never another client's; a newcomer takes the heaviest client's.
func TestTCPShareEvictsTheClientsOwn(t *testing.T) {
	const max = 40
	sh := fair.New(max) // the node's pool 5; the pods' 35: reserve 8, share 1
	pods := sh.Max() - sh.NodeMax()
	s, _ := startServer(t, func(c *Config) { c.MaxTCPConns = max })
	dialFrom := func(src string) net.Conn { return tcpFrom(t, s, src) }
	waitConns := func(n int64) { waitTCPConns(t, s, n) }
	other := dialFrom("127.0.0.3")
	waitConns(1)
	var hog []net.Conn
	held := pods - sh.Reserve() // the pods' pool less the reserve: other's 1 and the hog's
	for i := range held {       // the last one: full of its own
		hog = append(hog, dialFrom("127.0.0.2"))
		waitConns(int64(min(i+2, held)))
	}
	// The last one took the hog's own longest-idle connection: the count
	// stays, so wait for the eviction itself.
	for deadline := time.Now().Add(3 * time.Second); s.Snapshot().TCPEvicted == 0 && time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
	}
	if c := s.Snapshot(); c.TCPConns != int64(held) || c.ShareRejectsTCP != 0 || c.TCPEvicted != 1 {
		t.Fatalf("conns %d share rejects %d evicted %d, want %d, 0, 1", c.TCPConns, c.ShareRejectsTCP, c.TCPEvicted, held)
	}
	_ = other.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := other.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the other client's connection: %v, want it open", err)
	}
	_ = hog[0].SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := hog[0].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the hog's longest-idle connection: %v, want it closed", err)
	}
	// Newcomers get in at once, from the reserve.
	for i := range sh.Reserve() {
		dialFrom(fmt.Sprintf("127.0.1.%d", i+1))
	}
	waitConns(int64(pods))
	// The pods' pool is full: one more newcomer takes the heaviest
	// client's longest-idle connection.
	dialFrom("127.0.2.1")
	_ = hog[1].SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := hog[1].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the heaviest client's longest-idle connection: %v, want it closed", err)
	}
	// The evicted connection may close before the newcomer is counted in
	// its place (one less for a moment): wait for the count, then check.
	waitConns(int64(pods))
	if c := s.Snapshot(); c.TCPConns != int64(pods) || c.TCPEvicted != 2 || c.TCPRefused != 0 {
		t.Fatalf("conns %d evicted %d refused %d, want %d, 2, 0", c.TCPConns, c.TCPEvicted, c.TCPRefused, pods)
	}
}

func TestAdmissionBoundAnswersServfail(t *testing.T) {
	release := make(chan struct{})
	s, _ := startServer(t, nil, func(c *resolve.Config) {
		c.MaxFlights = 1
		c.Fetch = func(ctx context.Context, _ string, q []byte) ([]byte, error) {
			<-release
			return nil, context.Canceled
		}
	})
	defer close(release)
	conn, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i, name := range []string{"one.example.", "two.example."} {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.Id = uint16(i + 1)
		b, _ := m.Pack()
		_, _ = conn.Write(b)
		// The first question must hold the one flight before the second
		// asks.
		for deadline := time.Now().Add(3 * time.Second); s.res.InFlight() == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no flight started")
			}
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil || r.Id != 2 || r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("got %v %v", r, err)
	}
	if s.Snapshot().Rejected != 1 {
		t.Fatalf("rejected %d", s.Snapshot().Rejected)
	}
}

// BenchmarkUDPHit measures cache hits through a real loopback socket: a
// client sends queries in bursts of 32 and reads the answers. It counts
// the whole round trip, client included, so compare runs, not absolutes.
func BenchmarkUDPHit(b *testing.B) { benchmarkUDPHit(b, nil, nil) }

// BenchmarkUDPHitCoreDNS is BenchmarkUDPHit with the CoreDNS-named
// counters on (the reference Corefile's four zones), as the daemon runs:
// compare the two within one run.
func BenchmarkUDPHitCoreDNS(b *testing.B) {
	benchmarkUDPHit(b, countByBlocks(b, []CDZone{{Name: "cluster.local.", Plugin: "errors"}, {Name: "in-addr.arpa.", Plugin: "errors"},
		{Name: "ip6.arpa.", Plugin: "errors"}, {Name: ".", Plugin: "errors"}}), nil)
}

// benchmarkUDPHit asks one cached name over and over, over UDP: mutate
// changes the server's Config, rmut (nil: none) the Resolver's, then runs
// on the started server first.
func benchmarkUDPHit(b *testing.B, mutate func(*Config), rmut func(*resolve.Config), then ...func(*Server)) {
	benchmarkUDPHitTo(b, mutate, rmut, netip.AddrPort{}, then...)
}

// benchmarkUDPHitTo is benchmarkUDPHit asking dst (invalid: the server's
// first socket); then runs on the started server first.
func benchmarkUDPHitTo(b *testing.B, mutate func(*Config), rmut func(*resolve.Config), dst netip.AddrPort, then ...func(*Server)) {
	var rmuts []func(*resolve.Config)
	if rmut != nil {
		rmuts = append(rmuts, rmut)
	}
	s, _ := startServer(b, mutate, rmuts...)
	for _, f := range then {
		f(s)
	}
	if !dst.IsValid() {
		dst = s.Addr()
	}
	conn, err := net.Dial("udp", dst.String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion("bench.example.", dns.TypeA)
	q, _ := m.Pack()
	buf := make([]byte, 1500)
	_, _ = conn.Write(q)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(buf); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	const burst = 32
	for i := 0; i < b.N; i += burst {
		n := min(burst, b.N-i)
		for j := 0; j < n; j++ {
			_, _ = conn.Write(q)
		}
		for j := 0; j < n; j++ {
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Read(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestTCPPipelinedHitsAllAnswered: 200 queries in one write (hits and a
// few misses) all get their answers, the hits batched into few writes.
func TestTCPPipelinedHitsAllAnswered(t *testing.T) {
	s, z := startServer(t, nil)
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []byte
	for i := 0; i < 200; i++ {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.example.", i%10), dns.TypeA) // 10 misses, 190 hits or coalesced
		m.Id = uint16(i)
		b, _ := m.Pack()
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	seen := map[uint16]bool{}
	for len(seen) < 200 {
		var lb [2]byte
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		b := make([]byte, binary.BigEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(b); err != nil || len(r.Answer) != 1 || r.Question[0].Name != fmt.Sprintf("n%d.example.", r.Id%10) {
			t.Fatalf("answer %v %v", r, err)
		}
		if seen[r.Id] {
			t.Fatalf("id %d answered twice", r.Id)
		}
		seen[r.Id] = true
	}
	if n := z.n.Load(); n > 10 {
		t.Fatalf("%d upstream queries for 10 names", n)
	}
}

// TestCountsSayTheTruth: every query that reaches the cache is one hit,
// one stale answer or one miss; a stale answer is not also a miss, and
// health checks are neither.
func TestCountsSayTheTruth(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var failing atomic.Bool
	z := &zoneForward{}
	var c *cache.Cache
	s, _ := startServer(t, func(cfg *Config) { cfg.Clock = clk }, func(rc *resolve.Config) {
		rc.Clock = clk
		c = rc.Cache
		pol, _ := resolve.Zones(resolve.Policy{
			TTL:         cache.Policy{SuccessMax: time.Minute, DenialMax: time.Minute},
			StaleWindow: time.Hour,
		})
		rc.Blocks = pol
		rc.Fetch = func(ctx context.Context, name string, q []byte) ([]byte, error) {
			if failing.Load() {
				return nil, errors.New("upstream down")
			}
			return z.forward(ctx, name, q)
		}
	})
	conn, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(name string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		b, _ := m.Pack()
		_, _ = conn.Write(b)
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatal(err)
		}
		return r
	}
	ask("count.example.") // miss
	ask("count.example.") // hit
	clk.Advance(2 * time.Minute)
	failing.Store(true)
	if r := ask("count.example."); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("outage: %v, want the stale answer", r)
	}
	ask("count.example.")                     // stale at once (recheck interval)
	ask("health-check.nodelocaldns.invalid.") // neither
	ask("HEALTH-check.nodelocaldns.invalid.") // neither
	snap := s.Snapshot()
	hits := c.Stats().Hits
	if snap.CacheMisses != 1 || snap.StaleServed != 2 || hits[cache.Success] != 1 || snap.HealthChecks != 2 {
		t.Fatalf("misses %d stale %d hits %d health %d; want 1, 2, 1, 2",
			snap.CacheMisses, snap.StaleServed, hits[cache.Success], snap.HealthChecks)
	}
}

// chained makes every name's block run the answer-side handlers of a
// chain (the one-minute policy of newResolver), as a Corefile block with
// them would; off turns them off (a reload to blocks without them).
type chained struct {
	off           atomic.Bool
	with, without resolve.Block
}

func newChained(names []string, hs ...answer.Handler) *chained {
	pol := resolve.Policy{TTL: cache.Policy{SuccessMax: time.Minute, DenialMax: time.Minute}}
	return &chained{with: resolve.Block{Policy: pol, Metric: -1, Answer: answer.NewChain(names, hs)}, without: resolve.Block{Policy: pol, Metric: -1}}
}

// rmut is startServer's resolver mutation.
func (c *chained) rmut(rc *resolve.Config) {
	rc.Blocks = func([]byte) *resolve.Block {
		if c.off.Load() {
			return &c.without
		}
		return &c.with
	}
}
