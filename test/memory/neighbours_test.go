package memory

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The hostile-neighbour suite (issue 25): each attack one pod can make on
// the node's cache, then all of them at once, while a well-behaved pod
// resolves fresh cluster and external names. It runs in a network
// namespace of its own (the test re-runs itself under unshare -n), with
// the daemon's shipped bounds (-forward-timeout, -max-inflight,
// -max-tcp-conns at their defaults) and the manifest's memory settings.
// Every attacker comes from one source address, as one pod does.
//
// Per attack it logs the good client's answers (first try, and with the one
// retry a stub makes after a timeout), its p99, its TCP queries, and the
// peak RSS (VmHWM) of a daemon started for that attack.
// NLD_MEMORY_BINARY runs it against another build, for the figures before.

const (
	// neighbourPhase is how long each attack runs with the good client.
	neighbourPhase = 8 * time.Second
	// manifestLimitMiB is deploy/daemonset.yaml's memory limit; a peak
	// must leave it 25% (issue 25).
	manifestLimitMiB = 320
	// goodTimeout is how long the good client waits before its one retry
	// (glibc waits 5 s; a shorter wait only makes the test stricter).
	goodTimeout = 2 * time.Second
)

// answeringUpstreams are a node resolver (UDP and TCP on nodeIP:53) and a
// kube-dns (TCP) that answer every name with an A record, except names
// holding "silent", which they read and never answer.
func answeringUpstreams(t *testing.T) (nodeIP, kube string) {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		if len(r.Question) != 1 || strings.Contains(strings.ToLower(r.Question[0].Name), "silent") {
			return
		}
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 300 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	serve := func(net, addr string) {
		srv := &dns.Server{Addr: addr, Net: net, Handler: h}
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ListenAndServe() }()
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatalf("upstream %s %s did not start", net, addr)
		}
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	nodeIP, kube = "127.0.9.53", "127.0.9.54:53" // not 127.0.0.53: systemd-resolved's stub
	serve("udp", nodeIP+":53")
	serve("tcp", nodeIP+":53")
	serve("tcp", kube)
	return nodeIP, kube
}

// goodStats is what the well-behaved client saw in one phase.
type goodStats struct {
	mu        sync.Mutex
	sent      int // UDP questions
	first     int // answered on the first try
	answered  int // answered within the retry
	tcpSent   int
	tcpAnswer int
	lat       []time.Duration // of answered questions
	failures  []string        // the first few, for the log
}

func (g *goodStats) fail(format string, a ...any) {
	if len(g.failures) < 5 {
		g.failures = append(g.failures, fmt.Sprintf(format, a...))
	}
}

func (g *goodStats) p99() time.Duration {
	if len(g.lat) == 0 {
		return 0
	}
	l := slices.Clone(g.lat)
	slices.Sort(l)
	return l[(len(l)*99)/100]
}

// goodClient resolves fresh names (a new one each time, alternating a
// cluster name and an external one) from its own address, about 100 a
// second over UDP, every tenth also over TCP on a new connection (as glibc
// after a truncated answer), until ctx is done.
func goodClient(ctx context.Context, t *testing.T, addr, tag string) *goodStats {
	g := &goodStats{}
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP("127.0.0.10")}, dst)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("good%d-%s.default.svc.cluster.local.", i, tag)
			if i%2 == 1 {
				name = fmt.Sprintf("good%d-%s.example.net.", i, tag)
			}
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			m.Id = uint16(i)
			q, _ := m.Pack()
			t0 := time.Now()
			ok, tries := false, 0
			for tries < 2 && !ok {
				tries++
				_, _ = c.Write(q)
				deadline := time.Now().Add(goodTimeout)
				for time.Now().Before(deadline) {
					_ = c.SetReadDeadline(deadline)
					n, err := c.Read(buf)
					if err != nil {
						break
					}
					var r dns.Msg
					if r.Unpack(buf[:n]) != nil || r.Id != uint16(i) {
						continue // a late answer to an earlier try
					}
					if r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1 {
						ok = true
					} else {
						g.mu.Lock()
						g.fail("%s: rcode %s", name, dns.RcodeToString[r.Rcode])
						g.mu.Unlock()
					}
					break
				}
			}
			g.mu.Lock()
			g.sent++
			if ok {
				g.answered++
				if tries == 1 {
					g.first++
				}
				g.lat = append(g.lat, time.Since(t0))
			} else if len(g.failures) < 5 {
				g.fail("%s: no answer in %d tries", name, tries)
			}
			g.mu.Unlock()
			if i%10 == 0 {
				tcpOK := tcpAsk(addr, "tcp"+name)
				g.mu.Lock()
				g.tcpSent++
				if tcpOK {
					g.tcpAnswer++
				} else {
					g.fail("tcp%s: no answer over TCP", name)
				}
				g.mu.Unlock()
			}
			if d := 10*time.Millisecond - time.Since(t0); d > 0 {
				time.Sleep(d)
			}
		}
	}()
	t.Cleanup(func() { <-done })
	go func() { <-ctx.Done(); <-done }()
	return g
}

// tcpAsk asks one question over a new TCP connection from the good
// client's address and reports whether it was answered.
func tcpAsk(addr, name string) bool {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.10")}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, _ := m.Pack()
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
		return false
	}
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		return false
	}
	resp := make([]byte, binary.BigEndian.Uint16(lb[:]))
	if _, err := io.ReadFull(c, resp); err != nil {
		return false
	}
	var r dns.Msg
	return r.Unpack(resp) == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1
}

// attack is one hostile pod's doing, from its own address, until ctx is
// done; what it holds is released by the cleanup it returns.
type attack struct {
	name string
	run  func(ctx context.Context, t *testing.T, d *daemon) (cleanup func())
}

// udpFlood sends, every 4 s, n questions from src: distinct silent names
// (distinct) or n spread over 3 silent names, paced as sendMisses paces.
func udpFlood(src string, n int, distinct bool) func(context.Context, *testing.T, *daemon) func() {
	return func(ctx context.Context, t *testing.T, d *daemon) func() {
		dst, _ := net.ResolveUDPAddr("udp", d.addr)
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(src)}, dst)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for round := 0; ctx.Err() == nil; round++ {
				for i := range n {
					name := fmt.Sprintf("q%d-%d.silent.example.org.", round, i)
					if !distinct {
						name = fmt.Sprintf("stuck%d.silent.example.org.", i%3)
					}
					m := new(dns.Msg)
					m.SetQuestion(name, dns.TypeA)
					b, _ := m.Pack()
					_, _ = c.Write(b)
					if i%64 == 63 {
						time.Sleep(time.Millisecond)
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(4 * time.Second):
				}
			}
		}()
		go func() { // drain the SERVFAILs
			buf := make([]byte, 512)
			for {
				if _, err := c.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					return
				}
			}
		}()
		return func() { <-done; c.Close() }
	}
}

// dialMany opens n TCP connections from src to addr, each given first to
// hello; it returns them (what could be opened).
func dialMany(t *testing.T, src, addr string, n int, hello func(net.Conn)) []net.Conn {
	var conns []net.Conn
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		hello(c)
		conns = append(conns, c)
	}
	return conns
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// neighbourAttacks are issue 25's table, one pod each.
func neighbourAttacks() []attack {
	return []attack{
		{"8000 idle keep-alive HTTP connections", func(ctx context.Context, t *testing.T, d *daemon) func() {
			conns := dialMany(t, "127.0.1.1", d.metrics, 8000, func(c net.Conn) {
				fmt.Fprintf(c, "GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			<-ctx.Done()
			open := 0
			for _, c := range conns {
				_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
				if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
					open++
				}
			}
			t.Logf("  HTTP: %d of %d connections still open at the end of the phase", open, len(conns))
			return func() { closeAll(conns) }
		}},
		{"1100 unique never-answered names every 4 s", func(ctx context.Context, t *testing.T, d *daemon) func() {
			return udpFlood("127.0.2.1", 1100, true)(ctx, t, d)
		}},
		{"2100 queries over 3 never-answered names", func(ctx context.Context, t *testing.T, d *daemon) func() {
			return udpFlood("127.0.3.1", 2100, false)(ctx, t, d)
		}},
		{"1000 idle TCP connections, a query each per 10 s", func(ctx context.Context, t *testing.T, d *daemon) func() {
			ask := func(c net.Conn) {
				m := new(dns.Msg)
				m.SetQuestion("idle.example.net.", dns.TypeA)
				b, _ := m.Pack()
				_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
			}
			conns := dialMany(t, "127.0.4.1", d.addr, 1000, ask)
			tick := time.NewTicker(10 * time.Second)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return func() { closeAll(conns) }
				case <-tick.C:
					for _, c := range conns {
						ask(c)
					}
				}
			}
		}},
		{"900 TCP connections sending 65,000 bytes of a 65,535-byte query", func(ctx context.Context, t *testing.T, d *daemon) func() {
			body := make([]byte, 2+65000)
			binary.BigEndian.PutUint16(body, 65535)
			conns := dialMany(t, "127.0.5.1", d.addr, 900, func(c net.Conn) {
				_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				_, _ = c.Write(body)
			})
			<-ctx.Done()
			return func() { closeAll(conns) }
		}},
	}
}

// TestHostileNeighbours runs the suite (see the top of this file).
func TestHostileNeighbours(t *testing.T) {
	if os.Getenv("NLD_NEIGHBOURS_NETNS") == "" {
		if os.Geteuid() != 0 {
			if os.Getenv("CI") == "true" {
				t.Fatal("the hostile-neighbour suite needs root (a network namespace of its own)")
			}
			t.Skip("needs root: it runs in a network namespace of its own")
		}
		args := []string{"--net", "--", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
			os.Args[0], "-test.run=^TestHostileNeighbours$", "-test.v", "-test.count=1"}
		cmd := exec.Command("unshare", args...)
		cmd.Env = append(os.Environ(), "NLD_NEIGHBOURS_NETNS=1")
		// Streamed: the figures show as each attack ends.
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("the suite failed: %v", err)
		}
		return
	}
	nodeIP, kube := answeringUpstreams(t)
	// Each attack meets a daemon of its own, so its peak RSS is its own;
	// with the shipped bounds: the flags' defaults (startDaemon's 60 s
	// forward timeout would be no daemon's setting), -pprof on.
	start := func() *daemon {
		d := startDaemonArgs(t, nodeIP, kube, []string{"-forward-timeout", "4s", "-pprof"})
		t.Logf("RSS when ready %.1f MiB", float64(d.status(t, "VmRSS"))/1024)
		return d
	}

	attacks := neighbourAttacks()
	phase := func(name string, run []attack) *daemon {
		d := start()
		ctx, cancel := context.WithTimeout(context.Background(), neighbourPhase)
		defer cancel()
		g := goodClient(ctx, t, d.addr, strings.ReplaceAll(strings.Fields(name)[0], ",", ""))
		var cleanups []func()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, a := range run {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := a.run(ctx, t, d)
				mu.Lock()
				cleanups = append(cleanups, c)
				mu.Unlock()
			}()
		}
		<-ctx.Done()
		wg.Wait()
		time.Sleep(2 * goodTimeout) // the good client's last question
		hwm := d.status(t, "VmHWM")
		for _, c := range cleanups {
			c()
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		rate := 100 * float64(g.answered) / float64(max(g.sent, 1))
		t.Logf("%s: good client %d/%d answered (%.2f%%; %d on the first try), p99 %v, TCP %d/%d; peak RSS %.1f MiB (budget %d, limit %d)",
			name, g.answered, g.sent, rate, g.first, g.p99().Round(10*time.Microsecond), g.tcpAnswer, g.tcpSent, float64(hwm)/1024, budgetHostile, manifestLimitMiB)
		if g.sent < 100 || rate < 99.9 {
			t.Errorf("%s: the good client got %.2f%% answers (%d questions), want >= 99.9%%: %v", name, rate, g.sent, g.failures)
		}
		if g.tcpAnswer != g.tcpSent {
			t.Errorf("%s: %d of %d TCP questions answered: %v", name, g.tcpAnswer, g.tcpSent, g.failures)
		}
		if hwm > budgetHostile*1024 || hwm > manifestLimitMiB*1024*3/4 {
			t.Errorf("%s: peak RSS %.1f MiB over the budget (%d MiB) or the limit less 25%%", name, float64(hwm)/1024, budgetHostile)
		}
		return d
	}
	for _, a := range attacks {
		phase(a.name, []attack{a})
	}
	d := phase("all at once", attacks)

	// pprof (-pprof, or a Corefile's `pprof` line) is never on the
	// metrics address every pod reaches.
	if resp, err := http.Get("http://" + d.metrics + "/debug/pprof/"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ on the metrics address: HTTP %d, want 404", resp.StatusCode)
	}

	// The HTTP connections the attacks left are closed after the idle
	// timeout (15 s from each one's answer), and the memory they held comes
	// back. Each is read until the server closes it, for at most 15 s plus
	// 10 s of slack: under load the last answers of 200 can come seconds
	// after the last dial (a fixed 17 s wait once saw one still open).
	conns := dialMany(t, "127.0.1.2", d.metrics, 200, func(c net.Conn) {
		fmt.Fprintf(c, "GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
	})
	dialed := time.Now()
	time.Sleep(15 * time.Second)
	open := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(dialed.Add(25 * time.Second))
		for {
			if _, err := c.Read(make([]byte, 4096)); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					open++
				}
				break
			}
		}
	}
	closeAll(conns)
	t.Logf("after the idle timeout: %d of %d idle HTTP connections open %v after the last dial; RSS %.1f MiB", open, len(conns), time.Since(dialed).Round(time.Millisecond), float64(d.status(t, "VmRSS"))/1024)
	if open != 0 {
		t.Errorf("%d idle HTTP connections outlived the idle timeout", open)
	}
}
