package dropin

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// tapCollector is a dnstap collector (our own Frame Streams reader and
// protobuf decoder, internal/dnstap) listening in a namespace.
type tapCollector struct {
	ln    net.Listener
	mu    sync.Mutex
	got   []dnstap.Decoded
	conns []net.Conn
}

func startTapCollector(t *testing.T, ns, network, addr string) *tapCollector {
	t.Helper()
	c := &tapCollector{}
	err := inNetns(ns, func() (err error) {
		c.ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("collector %s in %s: %v", addr, ns, err)
	}
	go func() {
		for {
			conn, err := c.ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
			go func() {
				defer conn.Close()
				_ = dnstap.Collect(conn, func(p []byte) {
					d, err := dnstap.Decode(bytes.Clone(p))
					if err != nil {
						t.Errorf("collector: %v", err)
						return
					}
					c.mu.Lock()
					c.got = append(c.got, d)
					c.mu.Unlock()
				})
			}()
		}
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *tapCollector) stop() {
	c.ln.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
}

// of are the frames of the query from port, in the order received.
func (c *tapCollector) of(port uint16) []dnstap.Decoded {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []dnstap.Decoded
	for _, d := range c.got {
		if d.Query.Port() == port {
			out = append(out, d)
		}
	}
	return out
}

// waitOf polls until the query from port has n frames (or the deadline).
func (c *tapCollector) waitOf(port uint16, n int, d time.Duration) []dnstap.Decoded {
	deadline := time.Now().Add(d)
	for {
		f := c.of(port)
		if len(f) >= n || time.Now().After(deadline) {
			return f
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tapAsk asks name over network from a socket of its own in ns, to the
// local address, and returns the answer and the socket's port.
func tapAsk(t *testing.T, ns, network, name string, qtype uint16, id uint16) (*dns.Msg, uint16) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = id
	m.SetEdns0(1232, false)
	var r *dns.Msg
	var port uint16
	err := inNetns(ns, func() error {
		c, err := net.DialTimeout(network, net.JoinHostPort(oracleLocal, "53"), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		port = uint16(c.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort().Port())
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		co := &dns.Conn{Conn: c}
		if err := co.WriteMsg(m); err != nil {
			return err
		}
		r, err = co.ReadMsg()
		return err
	})
	if err != nil {
		t.Fatalf("%s %s: %v", network, name, err)
	}
	return r, port
}

// tapShape is what is compared of one query's frames: per frame its type,
// protocol, family, the query address and port (the port as "P"), the
// response address and port, which times are set, identity, version and
// extra, the query message's bytes and the response message (its rcode,
// question and records, TTLs out: a hit's TTL has counted down).
func tapShape(frames []dnstap.Decoded, port uint16) []string {
	var out []string
	for _, d := range frames {
		var b strings.Builder
		fmt.Fprintf(&b, "%s tcp=%v from=%s", d.Type, d.TCP, strings.Replace(d.Query.String(), fmt.Sprint(port), "P", 1))
		if d.Response.IsValid() {
			fmt.Fprintf(&b, " to=%s", d.Response)
		}
		fmt.Fprintf(&b, " qtime=%v rtime=%v id=%q ver=%q extra=%q", !d.QueryTime.IsZero(), !d.ResponseTime.IsZero(), d.Identity, d.Version, d.Extra)
		switch {
		case d.HasQueryMessage && d.Type == dnstap.ForwarderQuery:
			// Our upstream query is our own (its ID, our EDNS size): the
			// question is compared.
			m := new(dns.Msg)
			if err := m.Unpack(d.QueryMessage); err != nil || len(m.Question) != 1 {
				fmt.Fprintf(&b, " query=unparsable(%v)", err)
			} else {
				fmt.Fprintf(&b, " query=%s", m.Question[0].String())
			}
		case d.HasQueryMessage:
			fmt.Fprintf(&b, " query=%x", d.QueryMessage)
		}
		if d.HasResponseMessage {
			m := new(dns.Msg)
			if err := m.Unpack(d.ResponseMessage); err != nil {
				fmt.Fprintf(&b, " response=unparsable(%v)", err)
			} else {
				fmt.Fprintf(&b, " response=%s %s", dns.RcodeToString[m.Rcode], m.Question[0].String())
				for _, rr := range append(append(append([]dns.RR{}, m.Answer...), m.Ns...), m.Extra...) {
					if rr.Header().Rrtype == dns.TypeOPT {
						continue
					}
					rr.Header().Ttl = 0
					b.WriteString(" | " + rr.String())
				}
			}
		}
		out = append(out, b.String())
	}
	return out
}

// TestDnstapParityWithStockNodeCache: the reference manifest's Corefile
// with a dnstap (full, identity, version, extra) in every block, run by the
// stock node-cache and by nodelocaldns in network namespaces, each with a
// collector of ours on TCP: for a miss and then a hit of a cluster name,
// an NXDOMAIN, an external name and a TCP query, the same messages in the
// same order for each query (CLIENT_QUERY, for a miss FORWARDER_QUERY and
// FORWARDER_RESPONSE, CLIENT_RESPONSE), with the same fields (the client's
// address and port as the query address, the upstream's as the response
// address, the transport, the client's query bytes, the forwarded
// question, the answers' records and rcode).
func TestDnstapParityWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock := stockBinary(t)
	ours := buildNodelocaldns(t)
	const collector = "10.150.0.99:6000"
	tap := "    dnstap tcp://" + collector + " full {\n        identity node-a\n        version v-test\n        extra hello\n    }\n"
	corefile := strings.ReplaceAll(referenceCorefile(t, false), "    errors\n", "    errors\n"+tap)
	type run struct {
		ns string
		c  *tapCollector
	}
	var runs []run
	for _, bin := range []string{stock, ours} {
		ns, in := oracleNamespace(t)
		mustRun(t, in("ip", "addr", "add", "10.150.0.99/32", "dev", "lo"))
		c := startTapCollector(t, ns, "tcp", collector)
		startReferenceCorefile(t, ns, bin, corefile, "-setupiptables=false")
		runs = append(runs, run{ns, c})
	}
	// taken: the frames each run's earlier queries had, by client port:
	// the kernel may give a later query the port of an earlier one (seen
	// once in CI), whose frames the collector still holds.
	taken := [2]map[uint16]int{{}, {}}
	id := uint16(4000)
	for _, q := range []struct {
		name, network string
		qtype         uint16
		frames        int // a miss 4, a hit 2
	}{
		{"alias.default.svc.cluster.local.", "udp", dns.TypeA, 4}, // a miss
		{"alias.default.svc.cluster.local.", "udp", dns.TypeA, 2}, // a hit
		{"nx.default.svc.cluster.local.", "udp", dns.TypeA, 4},
		{"nx.default.svc.cluster.local.", "udp", dns.TypeA, 2},
		{"www.example.org.", "udp", dns.TypeA, 4},
		{"www.example.org.", "tcp", dns.TypeA, 2},
		{"txt.default.svc.cluster.local.", "tcp", dns.TypeTXT, 4},
		{"txt.default.svc.cluster.local.", "tcp", dns.TypeTXT, 2},
		{"10.0.96.10.in-addr.arpa.", "udp", dns.TypePTR, 4},
	} {
		id++
		var shapes [2][]string
		for i, r := range runs {
			_, port := tapAsk(t, r.ns, q.network, q.name, q.qtype, id)
			// CoreDNS flushes every second; ours when its queue runs empty.
			frames := r.c.waitOf(port, taken[i][port]+q.frames, 3*time.Second)
			time.Sleep(100 * time.Millisecond) // nothing more comes
			if more := r.c.of(port); len(more) > len(frames) {
				frames = more
			}
			frames = frames[min(taken[i][port], len(frames)):]
			taken[i][port] += len(frames)
			shapes[i] = tapShape(frames, port)
		}
		who := fmt.Sprintf("%s %s %s (id %d)", q.network, q.name, dns.TypeToString[q.qtype], id)
		if len(shapes[0]) != q.frames {
			t.Errorf("%s: the stock sent %d frames:\n%s", who, len(shapes[0]), strings.Join(shapes[0], "\n"))
		}
		if strings.Join(shapes[0], "\n") != strings.Join(shapes[1], "\n") {
			t.Errorf("%s:\nstock:\n  %s\nours:\n  %s", who, strings.Join(shapes[0], "\n  "), strings.Join(shapes[1], "\n  "))
		} else {
			t.Logf("%s: %d frames alike:\n  %s", who, len(shapes[0]), strings.Join(shapes[0], "\n  "))
		}
	}
}

// startOursTapped runs nodelocaldns alone on loopback with a Corefile
// whose one block taps to the unix socket sock (full); it returns the DNS
// and metrics addresses.
func startOursTapped(t *testing.T, sock string) (dnsAddr, metricsAddr string) {
	t.Helper()
	bin := buildNodelocaldns(t)
	up, kube := upstream(t, "93.184.216.34"), upstream(t, "10.96.1.1")
	dir := t.TempDir()
	p := testhost.FreePort(t, "127.0.0.1")
	conf := filepath.Join(dir, "Corefile")
	corefile := fmt.Sprintf(".:%d {\n    bind 127.0.0.1\n    cache 30\n    dnstap unix://%s full\n    forward . %s\n}\n", p, sock, up)
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	metricsAddr = fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))
	start(t, []string{bin, "-localip", "127.0.0.1", "-conf", conf, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown", "-kube-dns", kube,
		"-metrics-listen-address", metricsAddr, "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))}, &testhost.SyncBuffer{})
	dnsAddr = fmt.Sprintf("127.0.0.1:%d", p)
	waitDNS(t, dnsAddr)
	return dnsAddr, metricsAddr
}

// tapMetric reads one of our unlabelled counters from the metrics endpoint.
func tapMetric(t *testing.T, metricsAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// TestDnstapCollectorThatStopsReading: a collector that takes the
// handshake and then reads nothing costs no answer: 20,000 queries (hits
// and misses, UDP and TCP) are all answered, and what the tap could not
// send is counted in nodelocaldns_dnstap_dropped_total.
func TestDnstapCollectorThatStopsReading(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary")
	}
	sock := filepath.Join(t.TempDir(), "tap.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			// Frame Streams' handshake (READY, ACCEPT, START), then nothing.
			go func() { _ = dnstap.Collect(stalled{c, new(int)}, func([]byte) {}) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	addr, metricsAddr := startOursTapped(t, sock)
	answered, asked := 0, 0
	for _, network := range []string{"udp", "tcp"} {
		c, err := net.Dial(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		co := &dns.Conn{Conn: c}
		for i := range tapQueries {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("n%d.example.org.", i%500), dns.TypeA) // 500 misses, then hits
			asked++
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			if err := co.WriteMsg(m); err != nil {
				t.Fatal(err)
			}
			r, err := co.ReadMsg()
			if err == nil && r.Id == m.Id && r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1 {
				answered++
			} else if asked-answered < 5 {
				t.Logf("%s query %d: %v %v", network, i, r, err)
			}
		}
		c.Close()
	}
	if answered != asked {
		t.Errorf("%d of %d queries answered with a collector that reads nothing", answered, asked)
	}
	if d := tapMetric(t, metricsAddr, "nodelocaldns_dnstap_dropped_total"); d == 0 {
		t.Errorf("nothing counted dropped with a collector that reads nothing")
	} else {
		t.Logf("%d queries answered, %.0f dnstap messages dropped", answered, d)
	}
}

var tapQueries = 10000

// stalled reads the handshake and then blocks every read until the
// connection is closed: a collector that stopped reading.
type stalled struct {
	net.Conn
	n *int // bytes read
}

func (s stalled) Read(b []byte) (int, error) {
	// READY and START carry the content type: 12+8+len bytes each. Read
	// them byte by byte (Collect's reader asks for more at once), then
	// read nothing more.
	if *s.n >= 2*(12+8+len(dnstap.ContentType)) {
		select {}
	}
	n, err := s.Conn.Read(b[:1])
	*s.n += n
	return n, err
}

// TestDnstapCollectorComesBack: a collector that goes away loses the
// messages of that time (the answers are unaffected) and gets frames
// again when it comes back on the same socket.
func TestDnstapCollectorComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "tap.sock")
	listen := func() (*tapCollector, func()) {
		c := &tapCollector{}
		var err error
		if c.ln, err = net.Listen("unix", sock); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				conn, err := c.ln.Accept()
				if err != nil {
					return
				}
				c.mu.Lock()
				c.conns = append(c.conns, conn)
				c.mu.Unlock()
				go func() {
					_ = dnstap.Collect(conn, func(p []byte) {
						d, err := dnstap.Decode(bytes.Clone(p))
						if err == nil {
							c.mu.Lock()
							c.got = append(c.got, d)
							c.mu.Unlock()
						}
					})
				}()
			}
		}()
		return c, c.stop
	}
	c, stop := listen()
	addr, _ := startOursTapped(t, sock)
	ask := func(name string) uint16 {
		t.Helper()
		conn, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		co := &dns.Conn{Conn: conn}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		if err := co.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		if r, err := co.ReadMsg(); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s: %v %v", name, r, err)
		}
		return uint16(conn.LocalAddr().(*net.UDPAddr).Port)
	}
	if f := c.waitOf(ask("before.example.org."), 4, 5*time.Second); len(f) != 4 { // a miss: the client's and the forwarder's
		t.Fatalf("before: %d frames", len(f))
	}
	stop()
	os.Remove(sock)
	for i := range 20 {
		ask(fmt.Sprintf("gone%d.example.org.", i)) // answered with no collector
		time.Sleep(20 * time.Millisecond)
	}
	c2, _ := listen()
	t.Cleanup(c2.stop)
	deadline := time.Now().Add(20 * time.Second) // the redial backs off to 10 s at most
	for time.Now().Before(deadline) {
		if f := c2.waitOf(ask("after.example.org."), 2, 500*time.Millisecond); len(f) >= 2 {
			if f[0].Type != dnstap.ClientQuery || f[len(f)-1].Type != dnstap.ClientResponse {
				t.Errorf("after: %v ... %v", f[0].Type, f[len(f)-1].Type)
			}
			return
		}
	}
	t.Fatal("no frames after the collector came back")
}
