package daemon

// Benchmarks of the miss path through the daemon's own wiring (config.Parse
// with the production defaults, New, Start): a client's UDP query, the
// server, the cache's miss, the router, the forwarder, an in-process
// upstream on loopback and back. Every name is new, so every query misses.
//
//	BenchmarkMissTCP: cluster names, forwarded to kube-dns over pipelined TCP
//	BenchmarkMissUDP: external names, forwarded to the node's resolver over UDP
//	BenchmarkMissTCPSerial, BenchmarkMissUDPSerial: the same, one miss at a
//	time from one client, so ns/op is the latency of an isolated miss, where
//	hand-offs between goroutines and threads count rather than batching
//
// The upstream and the clients are written not to allocate per query, so
// allocs/op is the daemon's (go test -bench Miss -benchmem ./internal/daemon).

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// benchUpstream answers every query in wire format without allocating: the
// query's header and question, QR and RA set, one A record (TTL 30) and, if
// the query had one, an OPT record advertising 1232 bytes. It serves UDP and
// pipelined TCP on one loopback port and counts what it answered.
type benchUpstream struct {
	addr     netip.AddrPort
	udp      *net.UDPConn
	tcp      *net.TCPListener
	udpN     atomic.Int64
	tcpN     atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	tcpConns []net.Conn
}

// answerRecord: a pointer to the question name, A, IN, TTL 30, 192.0.2.1.
var answerRecord = []byte{0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 1}

// answerOPT: root name, OPT, 1232-byte payload, no flags, no options.
var answerOPT = []byte{0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0}

// cannedAnswer writes the answer to q into out[:0] and returns it; nil when
// q is not one query with one question.
func cannedAnswer(out, q []byte) []byte {
	if len(q) < 12 || q[2]&0x80 != 0 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	off := 12
	for off < len(q) && q[off] != 0 {
		off += 1 + int(q[off])
	}
	off += 5
	if off > len(q) {
		return nil
	}
	edns := binary.BigEndian.Uint16(q[10:]) > 0
	out = append(out[:0], q[:off]...)
	out[2] |= 0x80
	out[3] = 0x80
	binary.BigEndian.PutUint16(out[6:], 1)
	binary.BigEndian.PutUint16(out[8:], 0)
	binary.BigEndian.PutUint16(out[10:], 0)
	out = append(out, answerRecord...)
	if edns {
		binary.BigEndian.PutUint16(out[10:], 1)
		out = append(out, answerOPT...)
	}
	return out
}

func startBenchUpstream(tb testing.TB) *benchUpstream {
	tb.Helper()
	u := &benchUpstream{}
	// The UDP port may be taken for TCP on a busy host: try others.
	for try := 0; ; try++ {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			tb.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err == nil {
			u.udp, u.tcp = pc, ln
			u.addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
			break
		}
		_ = pc.Close()
		if try == 50 {
			tb.Fatal(err)
		}
	}
	// 4 MiB: room for the bursts of a parallel benchmark.
	_ = u.udp.SetReadBuffer(4 << 20)
	_ = u.udp.SetWriteBuffer(4 << 20)
	u.wg.Add(2)
	go u.serveUDP()
	go u.acceptTCP()
	tb.Cleanup(u.close)
	return u
}

func (u *benchUpstream) close() {
	_ = u.udp.Close()
	_ = u.tcp.Close()
	u.mu.Lock()
	for _, c := range u.tcpConns {
		_ = c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

func (u *benchUpstream) serveUDP() {
	defer u.wg.Done()
	in := make([]byte, 65535)
	out := make([]byte, 0, 1024)
	for {
		n, from, err := u.udp.ReadFromUDPAddrPort(in)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if a := cannedAnswer(out, in[:n]); a != nil {
			u.udpN.Add(1)
			_, _ = u.udp.WriteToUDPAddrPort(a, from)
		}
	}
}

func (u *benchUpstream) acceptTCP() {
	defer u.wg.Done()
	for {
		c, err := u.tcp.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.tcpConns = append(u.tcpConns, c)
		u.mu.Unlock()
		u.wg.Add(1)
		go u.serveTCP(c)
	}
}

// serveTCP answers pipelined queries in order, flushing when no further
// query is already buffered (one write per burst, as kube-dns's CoreDNS
// would not, but the upstream is not what is measured).
func (u *benchUpstream) serveTCP(c net.Conn) {
	defer u.wg.Done()
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	q := make([]byte, 65535)
	out := make([]byte, 0, 1024)
	var l [2]byte
	for {
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(r, q[:n]); err != nil {
			return
		}
		a := cannedAnswer(out, q[:n])
		if a == nil {
			return
		}
		u.tcpN.Add(1)
		binary.BigEndian.PutUint16(l[:], uint16(len(a)))
		_, _ = w.Write(l[:])
		_, _ = w.Write(a)
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// startMissDaemon starts a daemon as the bench's command line does (flags
// through config.Parse, so production defaults), kube-dns and the node's
// resolver both at u. It returns the daemon's UDP address.
func startMissDaemon(tb testing.TB, u *benchUpstream) netip.AddrPort {
	tb.Helper()
	dir := tb.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, fmt.Appendf(nil, "nameserver %s\n", u.addr.Addr()), 0o644); err != nil {
		tb.Fatal(err)
	}
	cfg, err := config.Parse([]string{
		"-localip", "127.0.0.1", "-port", "5353",
		"-kube-dns", u.addr.String(),
		"-resolv-conf", resolv,
		"-setupinterface=false", "-setupiptables=false",
		"-metrics-listen-address", "127.0.0.1:0", "-health-port", "0",
		"-state-dir", "", "-kubednscm", "", "-lameduck", "0",
	}, func(string) string { return "" }, io.Discard)
	if err != nil {
		tb.Fatal(err)
	}
	// resolv.conf has no ports: the node's resolver is set after parsing,
	// and no resolv.conf is watched to replace it.
	cfg.Nameservers, cfg.ResolvConf = []netip.AddrPort{u.addr}, ""
	// Parse wants a real port; the listener takes any free one.
	cfg.Port = 0
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		tb.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.shutdown(ctx, 0); err != nil {
			tb.Errorf("shutdown: %v", err)
		}
	})
	return d.Server.Addr()
}

// missNames numbers the names of every benchmark run in this process, so
// that no name is ever asked twice (a repeat would be a cache hit).
var missNames atomic.Uint64

// missQuery is a query for qN.<zone> (N ten digits) with an OPT record, as
// dnsperf sends: the name is rewritten in place per query.
type missQuery struct {
	buf []byte
	num int // offset of the ten digits
}

func newMissQuery(zone string) *missQuery {
	q := &missQuery{}
	b := []byte{0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1}
	b = append(b, 11, 'q')
	q.num = len(b)
	b = append(b, "0000000000"...)
	for _, l := range splitLabels(zone) {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	b = append(b, 0, 0, 1, 0, 1)        // root, A, IN
	b = append(b, 0, 0, 41, 0x04, 0xd0) // OPT, 1232 bytes
	b = append(b, 0, 0, 0, 0, 0, 0)     // no flags, no options
	q.buf = b
	return q
}

func splitLabels(zone string) []string {
	var out []string
	start := 0
	for i := 0; i < len(zone); i++ {
		if zone[i] == '.' {
			if i > start {
				out = append(out, zone[start:i])
			}
			start = i + 1
		}
	}
	if start < len(zone) {
		out = append(out, zone[start:])
	}
	return out
}

// next sets a fresh name and the id.
func (q *missQuery) next(id uint16) []byte {
	n := missNames.Add(1)
	for i := q.num + 9; i >= q.num; i-- {
		q.buf[i] = byte('0' + n%10)
		n /= 10
	}
	binary.BigEndian.PutUint16(q.buf, id)
	return q.buf
}

// benchMiss runs b.N misses for names in zone through the daemon, from
// parallel clients each with one query outstanding (as dnsperf's -q
// spreads over its -c sockets), and reports the upstream's count per
// transport so that a mistake in the routing shows.
func benchMiss(b *testing.B, zone string, wantTCP bool) {
	u := startBenchUpstream(b)
	addr := startMissDaemon(b, u)
	// 16 clients per GOMAXPROCS: enough misses in flight to batch, as
	// under dnsperf -q 100.
	b.SetParallelism(16)
	b.ReportAllocs()
	udp0, tcp0 := u.udpN.Load(), u.tcpN.Load()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		q := newMissQuery(zone)
		in := make([]byte, 2048)
		var id uint16
		for pb.Next() {
			id++
			if err := askMiss(c, q, id, in); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if err := checkUpstream(u, udp0, tcp0, int64(b.N), wantTCP); err != nil {
		b.Fatal(err)
	}
}

// askMiss sends q with a fresh name and id and waits for its answer: one A
// record, NOERROR.
func askMiss(c *net.UDPConn, q *missQuery, id uint16, in []byte) error {
	if _, err := c.Write(q.next(id)); err != nil {
		return err
	}
	for {
		// 5 s: far above any miss here; a lost query fails the run.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(in)
		if err != nil {
			return fmt.Errorf("query %d: %w", id, err)
		}
		if n < 12 || binary.BigEndian.Uint16(in) != id {
			continue // a late answer to an earlier query
		}
		if rcode := in[3] & 0xf; rcode != 0 || binary.BigEndian.Uint16(in[6:]) != 1 {
			return fmt.Errorf("answer rcode %d, %d answers", rcode, binary.BigEndian.Uint16(in[6:]))
		}
		return nil
	}
}

// checkUpstream: the upstream answered at least n more queries since
// (udp0, tcp0), all over the expected transport.
func checkUpstream(u *benchUpstream, udp0, tcp0, n int64, wantTCP bool) error {
	udp, tcp := u.udpN.Load()-udp0, u.tcpN.Load()-tcp0
	if wantTCP && udp > 0 || !wantTCP && tcp > 0 || udp+tcp < n {
		return fmt.Errorf("upstream answered %d over UDP and %d over TCP for %d misses", udp, tcp, n)
	}
	return nil
}

// BenchmarkMissTCP: unique cluster names, forwarded to kube-dns over TCP.
func BenchmarkMissTCP(b *testing.B) { benchMiss(b, "default.svc.cluster.local", true) }

// BenchmarkMissUDP: unique external names, forwarded to the node's resolver over UDP.
func BenchmarkMissUDP(b *testing.B) { benchMiss(b, "site-7.example.com", false) }

// benchMissSerial runs b.N misses one after the other from one client.
func benchMissSerial(b *testing.B, zone string, wantTCP bool) {
	u := startBenchUpstream(b)
	addr := startMissDaemon(b, u)
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	q := newMissQuery(zone)
	in := make([]byte, 2048)
	b.ReportAllocs()
	udp0, tcp0 := u.udpN.Load(), u.tcpN.Load()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := askMiss(c, q, uint16(i), in); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := checkUpstream(u, udp0, tcp0, int64(b.N), wantTCP); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkMissTCPSerial: isolated cluster-name misses (TCP to kube-dns).
func BenchmarkMissTCPSerial(b *testing.B) { benchMissSerial(b, "default.svc.cluster.local", true) }

// BenchmarkMissUDPSerial: isolated external-name misses (UDP to the node's resolver).
func BenchmarkMissUDPSerial(b *testing.B) { benchMissSerial(b, "site-7.example.com", false) }

// TestMissBenchmarksMiss runs the benchmarks' setup and queries: every
// query reaches the upstream over the transport the benchmark is named for,
// so the benchmarks measure misses and not the cache.
func TestMissBenchmarksMiss(t *testing.T) {
	for _, tc := range []struct {
		zone    string
		wantTCP bool
	}{{"default.svc.cluster.local", true}, {"site-7.example.com", false}} {
		u := startBenchUpstream(t)
		addr := startMissDaemon(t, u)
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			t.Fatal(err)
		}
		q := newMissQuery(tc.zone)
		in := make([]byte, 2048)
		const n = 200
		for id := uint16(1); id <= n; id++ {
			if err := askMiss(c, q, id, in); err != nil {
				t.Fatalf("%s: %v", tc.zone, err)
			}
		}
		_ = c.Close()
		if err := checkUpstream(u, 0, 0, n, tc.wantTCP); err != nil {
			t.Errorf("%s: %v", tc.zone, err)
		}
	}
}
