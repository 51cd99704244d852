package forward

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
)

// emulated stretches a bound on the real clock under user-mode emulation
// (make crossarch runs these tests under qemu-ARCH-static and says so in
// NLD_TEST_EMULATOR): the emulated CPU runs the same code several times
// slower, more so on a loaded machine, and a bound that holds natively
// with room does not. Five times, natively unchanged.
func emulated(d time.Duration) time.Duration {
	if os.Getenv("NLD_TEST_EMULATOR") != "" {
		return 5 * d
	}
	return d
}

// TestMain fails the run if any goroutine of the package outlives its Group (see
// leakedGoroutines).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaks := waitNoLeaks(5 * time.Second); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", strings.Join(leaks, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// pkgDir is the directory of the package's source files.
var pkgDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}()

// ownFile reports whether file is one of the package's non-test source files.
func ownFile(file string) bool {
	return filepath.Dir(file) == pkgDir && !strings.HasSuffix(file, "_test.go")
}

// leakedGoroutines returns the stacks of the goroutines the package started that still run:
// every goroutine whose outermost function is the package's (non-test) code (the connection
// reader and writer, health probes, whoever started them), and every goroutine started
// elsewhere (timer and context.AfterFunc callbacks) that runs the package's code. The tests'
// own goroutines (whose outermost function is in a _test.go file or the testing package: test
// upstreams, concurrent callers of Exchange) are not. It names no function, so a goroutine
// added later is covered too; TestLeakCheckKnowsEveryGoroutine proves it on each kind.
func leakedGoroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var leaks []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if packageGoroutine(g) {
			leaks = append(leaks, g)
		}
	}
	return leaks
}

// packageGoroutine reads one goroutine's stack as runtime.Stack prints it: a header line, then
// per frame a function line and a tab-indented "file:line +0x.." line, innermost first, the
// last pair being "created by".
func packageGoroutine(stack string) bool {
	lines := strings.Split(stack, "\n")
	own, entryFn, entryFile := false, "", ""
	for i := 1; i+1 < len(lines); i += 2 {
		fn, file := lines[i], strings.TrimSpace(lines[i+1])
		if j := strings.LastIndex(file, ":"); j >= 0 {
			file = file[:j]
		}
		if strings.HasPrefix(fn, "created by ") {
			break
		}
		entryFn, entryFile = fn, file
		if ownFile(file) {
			own = true
		}
	}
	switch {
	case ownFile(entryFile):
		return true
	case strings.HasSuffix(entryFile, "_test.go"), strings.HasPrefix(entryFn, "testing."):
		return false // a test's goroutine, maybe inside Exchange
	}
	return own
}
func waitNoLeaks(d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		leaks := leakedGoroutines()
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newFake returns a fake clock for a group's tries, probes and dial backoff.
func newFake() *clock.Fake { return clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) }

// advanceWhen moves clk by d once it has at least timers waiting (the code under test has
// started waiting), so a timer set a moment later is not skipped.
func advanceWhen(t testing.TB, clk *clock.Fake, timers int, d time.Duration) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%d timers on the fake clock", timers), func() bool { return clk.Timers() >= timers })
	clk.Advance(d)
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recorder is an Observer that records every call.
type recorder struct {
	mu          sync.Mutex
	failures    map[string]int // "upstream kind" and "* kind"
	exchanges   map[string]int // upstream → answers
	rcodes      map[int]int
	health      []string // "upstream up|down"
	conns       map[string]int
	opened      int
	connsMax    int
	inflight    int
	inflightMax int
	sockets     map[string]int // "upstream proto hit|miss" → queries
}

func newRecorder() *recorder {
	return &recorder{failures: map[string]int{}, exchanges: map[string]int{}, rcodes: map[int]int{}, conns: map[string]int{}, sockets: map[string]int{}}
}

func (r *recorder) Exchange(group, upstream string, rcode int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exchanges[upstream]++
	r.rcodes[rcode]++
}

func (r *recorder) Failure(group, upstream, kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures[upstream+" "+kind]++
	r.failures["* "+kind]++
}

func (r *recorder) Health(group, upstream string, healthy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	state := "down"
	if healthy {
		state = "up"
	}
	r.health = append(r.health, upstream+" "+state)
}

func (r *recorder) Conns(group, upstream string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns[upstream] += delta
	if delta > 0 {
		r.opened += delta
	}
	total := 0
	for _, n := range r.conns {
		total += n
	}
	r.connsMax = max(r.connsMax, total)
}

func (r *recorder) Inflight(group string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight += delta
	r.inflightMax = max(r.inflightMax, r.inflight)
}

func (r *recorder) SocketUse(group, upstream, proto string, reused bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := "miss"
	if reused {
		k = "hit"
	}
	r.sockets[upstream+" "+proto+" "+k]++
}

// socketUses returns the hits and misses counted for upstream's proto sockets.
func (r *recorder) socketUses(upstream, proto string) (hits, misses int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sockets[upstream+" "+proto+" hit"], r.sockets[upstream+" "+proto+" miss"]
}

func (r *recorder) failuresOf(upstream, kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if upstream == "" {
		upstream = "*"
	}
	return r.failures[upstream+" "+kind]
}

func (r *recorder) openConns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	for _, n := range r.conns {
		total += n
	}
	return total
}

func (r *recorder) healthEvents() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.health...)
}

func (r *recorder) hasHealth(event string) bool {
	for _, e := range r.healthEvents() {
		if e == event {
			return true
		}
	}
	return false
}

func (r *recorder) connStats() (maxOpen, opened int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connsMax, r.opened
}

func (r *recorder) exchangesAt(upstream string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exchanges[upstream]
}

// healthTransitions returns upstream's health events after the initial "up".
func (r *recorder) healthTransitions(upstream string) []string {
	var out []string
	for _, e := range r.healthEvents() {
		if up, state, _ := strings.Cut(e, " "); up == upstream {
			out = append(out, state)
		}
	}
	if len(out) > 0 {
		out = out[1:]
	}
	return out
}

func (r *recorder) inflightNow() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight
}

var _ Observer = (*recorder)(nil)

// newGroup builds a group closed at the end of the test.
func newGroup(t testing.TB, cfg GroupConfig, obs Observer) *Group {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	g, err := NewGroup(cfg, obs)
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// query packs a TXT query for name with id.
func query(t testing.TB, name string, id uint16) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeTXT)
	m.Id = id
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answerFor answers a query with a TXT record holding its qname, so a mixed-up answer shows.
func answerFor(q []byte) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q); err != nil || len(m.Question) != 1 {
		return nil
	}
	r := new(dns.Msg)
	r.SetReply(m)
	name := m.Question[0].Name
	r.Answer = append(r.Answer, &dns.TXT{
		Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30},
		Txt: []string{strings.ToLower(name)},
	})
	b, _ := r.Pack()
	return b
}

// replyWith answers q with rcode and no records.
func replyWith(q []byte, rcode int) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q); err != nil {
		return nil
	}
	r := new(dns.Msg)
	r.SetRcode(m, rcode)
	b, _ := r.Pack()
	return b
}

// checkTXT verifies ans is answerFor's answer for name with the caller's id.
func checkTXT(ans []byte, name string, id uint16) error {
	m := new(dns.Msg)
	if err := m.Unpack(ans); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	if m.Id != id {
		return fmt.Errorf("ID %d, want %d", m.Id, id)
	}
	if m.Rcode != dns.RcodeSuccess || m.Truncated {
		return fmt.Errorf("rcode %d truncated %v", m.Rcode, m.Truncated)
	}
	if len(m.Answer) != 1 {
		return fmt.Errorf("%d answers, want 1", len(m.Answer))
	}
	txt, ok := m.Answer[0].(*dns.TXT)
	if !ok || len(txt.Txt) != 1 || txt.Txt[0] != strings.ToLower(name) {
		return fmt.Errorf("answer %v, want TXT %q", m.Answer[0], name)
	}
	return nil
}

func readFrame(c net.Conn) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(c, b)
	return b, err
}

func writeFrame(c net.Conn, msg []byte) error {
	b := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(b, uint16(len(msg)))
	copy(b[2:], msg)
	_, err := c.Write(b)
	return err
}

// tcpServer is a test upstream on loopback that counts connections and queries; serve runs
// once per accepted connection (conn numbers from 0).
type tcpServer struct {
	ln       net.Listener
	addr     netip.AddrPort
	accepted atomic.Int32
	queries  atomic.Int32
	serve    func(s *tcpServer, c net.Conn, conn int)

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startTCP(t testing.TB, serve func(s *tcpServer, c net.Conn, conn int)) *tcpServer {
	t.Helper()
	return startTCPOn(t, "127.0.0.1:0", serve)
}

func startTCPOn(t testing.TB, addr string, serve func(s *tcpServer, c net.Conn, conn int)) *tcpServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &tcpServer{ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort(), serve: serve}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(s.accepted.Add(1)) - 1
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				s.serve(s, c, n)
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *tcpServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// read reads one query frame and counts it.
func (s *tcpServer) read(c net.Conn) ([]byte, error) {
	q, err := readFrame(c)
	if err == nil {
		s.queries.Add(1)
	}
	return q, err
}

// servePipelined answers every query concurrently after a random short delay: out of order.
func servePipelined(s *tcpServer, c net.Conn, _ int) {
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
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			wmu.Lock()
			defer wmu.Unlock()
			writeFrame(c, answerFor(q))
		}()
	}
}

// serveInOrder answers one query at a time, as a miekg/dns server does per connection.
func serveInOrder(delay time.Duration) func(s *tcpServer, c net.Conn, _ int) {
	return func(s *tcpServer, c net.Conn, _ int) {
		for {
			q, err := s.read(c)
			if err != nil {
				return
			}
			time.Sleep(delay)
			if writeFrame(c, answerFor(q)) != nil {
				return
			}
		}
	}
}

// serveWith answers each query with reply(q); nil reply sends nothing.
func serveWith(reply func(q []byte) []byte) func(s *tcpServer, c net.Conn, _ int) {
	return func(s *tcpServer, c net.Conn, _ int) {
		for {
			q, err := s.read(c)
			if err != nil {
				return
			}
			if a := reply(q); a != nil {
				if writeFrame(c, a) != nil {
					return
				}
			}
		}
	}
}

// deadAddr returns a loopback address where nothing listens (connections are refused).
func deadAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// udpServer is a UDP test upstream; handle answers through reply (which may be called several
// times per query, or never).
type udpServer struct {
	pc      net.PacketConn
	addr    netip.AddrPort
	queries atomic.Int32
	wg      sync.WaitGroup
	mu      sync.Mutex
	sources []netip.AddrPort // the source of every query, in order
}

func startUDPOn(t testing.TB, addr string, handle func(q []byte, reply func([]byte))) *udpServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &udpServer{pc: pc, addr: pc.LocalAddr().(*net.UDPAddr).AddrPort()}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.queries.Add(1)
			s.mu.Lock()
			s.sources = append(s.sources, from.(*net.UDPAddr).AddrPort())
			s.mu.Unlock()
			q := append([]byte(nil), buf[:n]...)
			handle(q, func(b []byte) { pc.WriteTo(b, from) })
		}
	}()
	t.Cleanup(func() { pc.Close(); s.wg.Wait() })
	return s
}

// ports returns the source ports the queries came from: port → queries.
func (s *udpServer) ports() map[uint16]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[uint16]int{}
	for _, a := range s.sources {
		out[a.Port()]++
	}
	return out
}

func startUDP(t testing.TB, handle func(q []byte, reply func([]byte))) *udpServer {
	t.Helper()
	return startUDPOn(t, "127.0.0.1:0", handle)
}
