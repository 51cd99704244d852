package memory

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

const (
	// maxInflight is the daemon's default -max-inflight (resolve.DefaultMaxInflight).
	maxInflight = 1024
	// maxTCPConns is the daemon's default -max-tcp-conns.
	maxTCPConns = 1000
	// bigAnswer is the size of the large answers kube-dns sends (close to
	// the 65,535 a TCP frame can hold).
	bigAnswer = 60000
	// The budgets, MiB of peak RSS (VmHWM), with the measured peaks and
	// the arithmetic in docs/design.md ("Memory per query in flight"):
	// the misses alone, per path, and everything hostile at once. The
	// manifest's 320 MiB limit holds the last with its kernel-side margin.
	budgetMisses  = 64
	budgetHostile = 128
	// bigClients TCP clients fetch large answers, bigPipeline at a time.
	bigClients  = 8
	bigPipeline = 8
)

// binary builds cmd/nodelocaldns once for the package's tests.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

func daemonBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("NLD_MEMORY_BINARY"); bin != "" {
		// Another build (an earlier commit's), for before-and-after figures.
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nld-mem")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "nodelocaldns")
		if out, err := exec.Command("go", "build", "-o", builtBin, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// silentUDP is a node resolver on ip:53 that reads every query and never
// answers. It returns the count of queries read.
func silentUDP(t *testing.T, ip string) *atomic.Int64 {
	t.Helper()
	pc, err := net.ListenPacket("udp", ip+":53")
	if err != nil {
		t.Skipf("cannot listen on %s:53 (%v): needs root", ip, err)
	}
	t.Cleanup(func() { pc.Close() })
	var n atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	return &n
}

// silentUpstreams starts a node resolver that reads UDP and never answers
// and a kube-dns over TCP that never answers names holding "silent"
// (kubeDNS), each on a loopback address of its own; it returns their
// addresses and how many queries each read.
func silentUpstreams(t *testing.T) (nodeIP, kube string, udpSeen, tcpSeen *atomic.Int64) {
	t.Helper()
	nodeIP = testhost.Loopback()
	udpSeen = silentUDP(t, nodeIP)
	kubeIP := testhost.Loopback()
	kube = fmt.Sprintf("%s:%d", kubeIP, testhost.FreePort(t, kubeIP))
	tcpSeen = kubeDNS(t, kube)
	return nodeIP, kube, udpSeen, tcpSeen
}

// kubeDNS is a TCP upstream on addr: questions whose name holds "silent"
// are read and never answered; others get an answer of about bigAnswer
// bytes (TXT records). It returns the count of queries read.
func kubeDNS(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				go func() { <-t.Context().Done(); c.Close() }()
				r := bufio.NewReader(c)
				var wmu sync.Mutex
				for {
					var size [2]byte
					if _, err := io.ReadFull(r, size[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(size[:]))
					if _, err := io.ReadFull(r, q); err != nil {
						return
					}
					n.Add(1)
					m := new(dns.Msg)
					if m.Unpack(q) != nil || len(m.Question) != 1 || strings.Contains(m.Question[0].Name, "silent") {
						continue
					}
					ans := bigReply(m)
					wmu.Lock()
					_, _ = c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(ans))))
					_, _ = c.Write(ans)
					wmu.Unlock()
				}
			}()
		}
	}()
	return &n
}

func bigReply(q *dns.Msg) []byte {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Compress = true
	chunk := strings.Repeat("x", 250)
	for m.Len() < bigAnswer-300 {
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{chunk}})
	}
	b, _ := m.Pack()
	return b
}

// daemon is a running nodelocaldns binary.
type daemon struct {
	cmd     *exec.Cmd
	addr    string // ip:port it serves
	metrics string
	stderr  *testhost.SyncBuffer
}

// startDaemon runs the binary with the manifest's memory-relevant settings
// (-cache-max-bytes 64Mi, -udp-sockets 4, GOMEMLIMIT 168MiB, no GOGC: the
// daemon's own garbage-collector policy) and env against the node resolver
// nodeIP:53 and kube-dns at kube, with a forward timeout long enough that
// misses stay outstanding while the test measures.
func startDaemon(t *testing.T, nodeIP, kube string, env ...string) *daemon {
	t.Helper()
	return startDaemonArgs(t, nodeIP, kube, []string{"-forward-timeout", "60s"}, env...)
}

// startDaemonArgs is startDaemon with args after the common ones (a flag
// given twice takes the last value).
func startDaemonArgs(t *testing.T, nodeIP, kube string, args []string, env ...string) *daemon {
	t.Helper()
	bin := daemonBinary(t)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+nodeIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ip := testhost.Loopback()
	port := testhost.FreePort(t, ip)
	metrics := fmt.Sprintf("%s:%d", ip, testhost.FreePort(t, ip))
	cmd := exec.Command(bin, "-localip", ip, "-port", fmt.Sprint(port),
		"-kube-dns", kube, "-resolv-conf", rc,
		"-setupinterface=false", "-setupiptables=false", "-metrics-listen-address", metrics,
		"-state-dir", t.TempDir(), "-lameduck", "100ms",
		"-cache-max-bytes", "64Mi", "-udp-sockets", "4",
		"-max-inflight", strconv.Itoa(maxInflight))
	cmd.Args = append(cmd.Args, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, "GOMEMLIMIT=168MiB"), env...)
	d := &daemon{cmd: cmd, addr: fmt.Sprintf("%s:%d", ip, port), metrics: metrics, stderr: &testhost.SyncBuffer{}}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once Wait returns, with waitErr
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("daemon exited: %v\n%s", waitErr, d.stderr.String())
		default:
		}
		if resp, err := http.Get("http://" + metrics + "/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 20s\n%s", d.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// status returns a field of /proc/PID/status in KiB.
func (d *daemon) status(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/PID/status", field)
	return 0
}

// inflight returns the daemon's upstream queries in flight, summed over groups.
func (d *daemon) inflight(t *testing.T) float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "nodelocaldns_upstream_inflight_queries{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clientAddr is the source address of the i-th hostile pod of a kind
// (kind picks the second octet: each kind's pods are different ones), on
// the pod network of the tests' network namespace (inNeighbourNetns).
func clientAddr(kind, i int) string {
	return fmt.Sprintf("10.%d.%d.%d", 64+kind, i/250, 1+i%250)
}

// sources hands out the source addresses of misses that fill the flight
// bound: the daemon apportions its bounds by client (internal/fair), and
// a client that holds some gets none of a bound's last units (its
// newcomers' part, an eighth of its pods' pool), nor of the node's pool (an
// eighth of the bound), so filling one takes a pod per miss for the pods'
// pool (pods), then a socket of the node's (loopback: "") per miss for
// the node's (node).
type sources struct {
	kind, n    int
	pods, node int // what is left of each pool
}

func newSources(kind int) *sources {
	sh := fair.New(maxInflight)
	return &sources{kind: kind, pods: sh.Max() - sh.NodeMax(), node: sh.NodeMax()}
}

// next is the next miss's source: a new pod, or "" for a new socket of
// the node's.
func (s *sources) next() string {
	if s.pods > 0 {
		s.pods--
		s.n++
		return clientAddr(s.kind, s.n-1)
	}
	s.node--
	return ""
}

// sendMisses sends n distinct questions under suffix over UDP, each from
// a source of src's, without waiting for answers (there are none).
func sendMisses(t *testing.T, addr, suffix string, n int, src *sources) {
	t.Helper()
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		var laddr *net.UDPAddr
		if a := src.next(); a != "" {
			laddr = &net.UDPAddr{IP: net.ParseIP(a)}
		}
		c, err := net.DialUDP("udp", laddr, dst)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("q%d.%s", i, suffix), dns.TypeA)
		m.SetEdns0(1232, false)
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if i%64 == 63 {
			time.Sleep(time.Millisecond) // within the daemon's socket buffers
		}
	}
}

// holdMisses makes -max-inflight misses outstanding against a silent
// upstream (the metric of upstream queries in flight says when).
func holdMisses(t *testing.T, d *daemon, suffix string) {
	t.Helper()
	sendMisses(t, d.addr, suffix, maxInflight, newSources(1))
	waitFor(t, 30*time.Second, fmt.Sprintf("%d misses in flight", maxInflight), func() bool {
		return d.inflight(t) >= maxInflight
	})
}

func report(t *testing.T, d *daemon, ready int64, budgetMiB int64) {
	t.Helper()
	hwm := d.status(t, "VmHWM")
	t.Logf("RSS when ready %.1f MiB; peak RSS (VmHWM) %.1f MiB; RSS now %.1f MiB; budget %d MiB",
		float64(ready)/1024, float64(hwm)/1024, float64(d.status(t, "VmRSS"))/1024, budgetMiB)
	if hwm > budgetMiB*1024 {
		t.Errorf("peak RSS %.1f MiB over the budget of %d MiB", float64(hwm)/1024, budgetMiB)
	}
}

// -max-inflight misses to external names, outstanding against a node
// resolver that never answers (UDP).
func TestPeakRSSMissesUDP(t *testing.T) {
	if !inNeighbourNetns(t, "TestPeakRSSMissesUDP") {
		return
	}
	nodeIP, kube, seen, _ := silentUpstreams(t)
	d := startDaemon(t, nodeIP, kube)
	ready := d.status(t, "VmRSS")
	holdMisses(t, d, "silent.example.com.")
	t.Logf("node resolver read %d queries", seen.Load())
	report(t, d, ready, budgetMisses)
}

// -max-inflight misses to cluster names, outstanding against kube-dns that
// reads them over TCP and never answers.
func TestPeakRSSMissesTCP(t *testing.T) {
	if !inNeighbourNetns(t, "TestPeakRSSMissesTCP") {
		return
	}
	nodeIP, kube, _, seen := silentUpstreams(t)
	d := startDaemon(t, nodeIP, kube)
	ready := d.status(t, "VmRSS")
	holdMisses(t, d, "silent.default.svc.cluster.local.")
	t.Logf("kube-dns read %d queries", seen.Load())
	report(t, d, ready, budgetMisses)
}

// Everything hostile at once: the flight bound held (half to a silent node
// resolver over UDP, half to a silent kube-dns over TCP) but for the
// newcomers' part of its pods' pool and the large answers' flights, the
// client TCP connection table full but for 10 (each announcing a
// 2,048-byte query and sending 2 bytes of it), and clients fetching ~60 KB
// answers from kube-dns over TCP.
func TestPeakRSSEverythingHostile(t *testing.T) {
	if !inNeighbourNetns(t, "TestPeakRSSEverythingHostile") {
		return
	}
	nodeIP, kube, _, _ := silentUpstreams(t)
	d := startDaemon(t, nodeIP, kube)
	ready := d.status(t, "VmRSS")

	// The hostile TCP clients: a pod each, 10 short of the pods' pool, and
	// as many as the node may hold of its pool from loopback.
	conns := fair.New(maxTCPConns)
	podConns := conns.Max() - conns.NodeMax() - 10
	for i := range podConns + conns.NodeMax()*3/4 {
		var dl net.Dialer
		if i < podConns {
			dl.LocalAddr = &net.TCPAddr{IP: net.ParseIP(clientAddr(50, i))}
		}
		c, err := dl.Dial("tcp", d.addr)
		if err != nil {
			t.Fatalf("hostile connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte{2048 >> 8, 2048 & 0xff, 0x12, 0x34}); err != nil {
			t.Fatal(err)
		}
	}

	// The misses: a pod each in the pods' pool but for its newcomers' part
	// and the 64 the large answers use, and the node's pool, half each
	// way.
	src := newSources(1)
	src.pods -= fair.New(maxInflight).Fresh() + bigClients*bigPipeline
	silent := src.pods + src.node
	sendMisses(t, d.addr, "silent.example.com.", silent/2, src)
	sendMisses(t, d.addr, "silent.default.svc.cluster.local.", silent-silent/2, src)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d misses in flight", silent), func() bool {
		return d.inflight(t) >= float64(silent)
	})

	// Large answers: bigClients TCP clients, a pod each (within
	// -max-tcp-conns with the hostile ones), each fetch distinct ~60 KB
	// answers from kube-dns, bigPipeline at a time, for 8 rounds.
	var got atomic.Int64
	var wg sync.WaitGroup
	for c := range bigClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientAddr(3, c))}}
			conn, err := dl.Dial("tcp", d.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
			r := bufio.NewReader(conn)
			for round := range 8 {
				for i := range bigPipeline {
					m := new(dns.Msg)
					m.SetQuestion(fmt.Sprintf("big%d-%d-%d.default.svc.cluster.local.", c, round, i), dns.TypeTXT)
					b, _ := m.Pack()
					if _, err := conn.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
						t.Error(err)
						return
					}
				}
				for range bigPipeline {
					var size [2]byte
					if _, err := io.ReadFull(r, size[:]); err != nil {
						t.Error(err)
						return
					}
					if _, err := io.CopyN(io.Discard, r, int64(binary.BigEndian.Uint16(size[:]))); err != nil {
						t.Error(err)
						return
					}
					got.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d large answers read", got.Load())
	if got.Load() != bigClients*bigPipeline*8 {
		t.Errorf("%d large answers read, want %d", got.Load(), bigClients*bigPipeline*8)
	}
	report(t, d, ready, budgetHostile)
}
