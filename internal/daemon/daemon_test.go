package daemon

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// upstream is a DNS server written for the tests: it answers on UDP and
// TCP on loopback and counts what it receives per transport.
type upstream struct {
	udp, tcp    *dns.Server
	addr        netip.AddrPort
	udpN, tcpN  atomic.Int64
	mu          sync.Mutex
	names       []string
	truncateUDP atomic.Bool
}

func startUpstream(t *testing.T, h func(r *dns.Msg) *dns.Msg) *upstream {
	t.Helper()
	u := &upstream{}
	// The UDP port may be taken for TCP (a busy host's ephemeral ports):
	// try another.
	var pc net.PacketConn
	var ln net.Listener
	var port int
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		port = pc.LocalAddr().(*net.UDPAddr).Port
		if ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			break
		}
		_ = pc.Close()
		if try == 50 {
			t.Fatal(err)
		}
	}
	u.addr = netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", port))
	serve := func(tcp bool) dns.HandlerFunc {
		return func(w dns.ResponseWriter, r *dns.Msg) {
			if tcp {
				u.tcpN.Add(1)
			} else {
				u.udpN.Add(1)
			}
			u.mu.Lock()
			u.names = append(u.names, r.Question[0].Name)
			u.mu.Unlock()
			m := h(r)
			if m == nil {
				return // play dead
			}
			if !tcp && u.truncateUDP.Load() {
				m.Truncated = true
				m.Answer = nil
			}
			if !tcp {
				// As a real server: no bigger than the size the query advertises
				// (forward takes a bigger one for truncated, and asks over TCP).
				size := dns.MinMsgSize
				if o := r.IsEdns0(); o != nil {
					size = int(o.UDPSize())
				}
				m.Truncate(size)
			}
			_ = w.WriteMsg(m)
		}
	}
	u.udp = &dns.Server{PacketConn: pc, Handler: serve(false)}
	u.tcp = &dns.Server{Listener: ln, Handler: serve(true)}
	go func() { _ = u.udp.ActivateAndServe() }()
	go func() { _ = u.tcp.ActivateAndServe() }()
	t.Cleanup(func() {
		_ = u.udp.Shutdown()
		_ = u.tcp.Shutdown()
	})
	return u
}

func (u *upstream) count() int64 { return u.udpN.Load() + u.tcpN.Load() }

// records answers every question from a fixed zone: A records whose
// address encodes the name (so a mix-up shows), NXDOMAIN with an SOA for
// names starting with "nx", and 60 A records for names starting with "big".
func records(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	switch {
	case strings.HasPrefix(name, "nx"):
		m.Rcode = dns.RcodeNameError
		soaTTL, minimum := 60, 3
		if strings.HasPrefix(name, "nxlong") {
			minimum = 60
		}
		rr, _ := dns.NewRR(fmt.Sprintf("cluster.local. %d IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 %d", soaTTL, minimum))
		m.Ns = append(m.Ns, rr)
	case strings.HasPrefix(name, "big"):
		for i := 0; i < 60; i++ {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 300 IN A 10.1.%d.%d", q.Name, i/200, i%200))
			m.Answer = append(m.Answer, rr)
		}
	case q.Qtype == dns.TypeA:
		h := uint32(0)
		for _, c := range name {
			h = h*31 + uint32(c)
		}
		rr, _ := dns.NewRR(fmt.Sprintf("%s 20 IN A 10.%d.%d.%d", q.Name, byte(h>>16), byte(h>>8), byte(h)))
		m.Answer = append(m.Answer, rr)
	}
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(1232, opt.Do())
	}
	return m
}

func wantA(name string) string {
	h := uint32(0)
	for _, c := range strings.ToLower(name) {
		h = h*31 + uint32(c)
	}
	return fmt.Sprintf("10.%d.%d.%d", byte(h>>16), byte(h>>8), byte(h))
}

type env struct {
	d          *Daemon
	kube, node *upstream
	clock      *clock.Fake // TTLs, lame duck, retiring groups
	udp, tcp   string
}

func start(t *testing.T, mutate func(*config.Config)) *env {
	t.Helper()
	return startWith(t, records, mutate)
}

// startWith is start with kube-dns answering by kube.
func startWith(t *testing.T, kube func(r *dns.Msg) *dns.Msg, mutate func(*config.Config)) *env {
	t.Helper()
	e := &env{
		kube:  startUpstream(t, kube),
		node:  startUpstream(t, records),
		clock: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
	}
	cfg := testConfig(e.node.addr)
	cfg.LocalMode = false
	cfg.KubeDNS, cfg.KubeDNSSource = e.kube.addr, "test"
	cfg.UDPSockets = 1
	if mutate != nil {
		mutate(cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := New(cfg, log, Options{Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.shutdown(ctx, 0); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	e.d = d
	e.udp = d.Server.Addr().String()
	e.tcp = d.Server.TCPAddr().String()
	return e
}

func (e *env) ask(t *testing.T, name string, qtype uint16, edns bool, network string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(1232, false)
	}
	c := &dns.Client{Net: network, Timeout: 3 * time.Second, UDPSize: 65535}
	addr := e.udp
	if network == "tcp" {
		addr = e.tcp
	}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	if r.Id != m.Id {
		t.Fatalf("id %d, want %d", r.Id, m.Id)
	}
	return r
}

func TestRepeatedQueryIsServedFromCache(t *testing.T) {
	e := start(t, nil)
	for i := 0; i < 5; i++ {
		r := e.ask(t, "www.example.com.", dns.TypeA, i%2 == 0, "udp")
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != wantA("www.example.com.") {
			t.Fatalf("answer %v", r.Answer)
		}
	}
	if n := e.node.count(); n != 1 {
		t.Fatalf("upstream saw %d queries, want 1", n)
	}
}

func TestTTLDecreasesWithClock(t *testing.T) {
	e := start(t, nil)
	r := e.ask(t, "ttl.example.com.", dns.TypeA, false, "udp")
	if ttl := r.Answer[0].Header().Ttl; ttl != 20 {
		t.Fatalf("first ttl %d", ttl)
	}
	e.clock.Advance(7 * time.Second)
	r = e.ask(t, "ttl.example.com.", dns.TypeA, false, "udp")
	if ttl := r.Answer[0].Header().Ttl; ttl != 13 {
		t.Fatalf("ttl after 7s: %d, want 13", ttl)
	}
	e.clock.Advance(13 * time.Second)
	e.ask(t, "ttl.example.com.", dns.TypeA, false, "udp")
	if n := e.node.count(); n != 2 {
		t.Fatalf("expired entry: upstream saw %d queries, want 2", n)
	}
}

func TestNXDOMAINCachedForSOAMinimumWithinCap(t *testing.T) {
	e := start(t, nil)
	// SOA TTL 60, MINIMUM 3: cached 3 s.
	name := "nx-svc.default.svc.cluster.local."
	if r := e.ask(t, name, dns.TypeA, false, "udp"); r.Rcode != dns.RcodeNameError {
		t.Fatalf("rcode %d", r.Rcode)
	}
	e.clock.Advance(2 * time.Second)
	r := e.ask(t, name, dns.TypeA, false, "udp")
	if e.kube.count() != 1 || r.Rcode != dns.RcodeNameError {
		t.Fatalf("not served from cache at 2s: upstream %d", e.kube.count())
	}
	if ttl := r.Ns[0].Header().Ttl; ttl != 1 {
		t.Fatalf("SOA ttl %d at 2s, want 1 (min(60,3)-2)", ttl)
	}
	e.clock.Advance(1500 * time.Millisecond)
	e.ask(t, name, dns.TypeA, false, "udp")
	if e.kube.count() != 2 {
		t.Fatalf("denial outlived min(SOA TTL, MINIMUM): upstream %d", e.kube.count())
	}
	// SOA TTL 60, MINIMUM 60: capped by the cluster denial cap (5 s).
	name = "nxlong.default.svc.cluster.local."
	e.ask(t, name, dns.TypeA, false, "udp")
	e.clock.Advance(4 * time.Second)
	e.ask(t, name, dns.TypeA, false, "udp")
	if e.kube.count() != 3 {
		t.Fatalf("upstream %d at 4s", e.kube.count())
	}
	e.clock.Advance(1 * time.Second)
	e.ask(t, name, dns.TypeA, false, "udp")
	if e.kube.count() != 4 {
		t.Fatalf("denial outlived the 5s cap: upstream %d", e.kube.count())
	}
}

func TestClientCaseComesBack(t *testing.T) {
	e := start(t, nil)
	e.ask(t, "mixed.example.com.", dns.TypeA, false, "udp")
	for _, name := range []string{"MiXeD.ExAmPlE.CoM.", "MIXED.EXAMPLE.COM."} {
		r := e.ask(t, name, dns.TypeA, false, "udp")
		if r.Question[0].Name != name || r.Answer[0].Header().Name != name {
			t.Fatalf("asked %q, got question %q answer %q", name, r.Question[0].Name, r.Answer[0].Header().Name)
		}
	}
	if e.node.count() != 1 {
		t.Fatalf("case variants were not one cache entry: %d upstream queries", e.node.count())
	}
	e.node.mu.Lock()
	defer e.node.mu.Unlock()
	if e.node.names[0] != "mixed.example.com." {
		t.Fatalf("upstream asked %q", e.node.names[0])
	}
}

func TestLargeAnswerTruncatedOverUDPWholeOverTCP(t *testing.T) {
	e := start(t, nil)
	// Without EDNS: at most 512 bytes, TC set.
	m := new(dns.Msg)
	m.SetQuestion("big.example.com.", dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	conn, err := c.Dial(e.udp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if n > 512 {
		t.Fatalf("%d bytes to a client without EDNS", n)
	}
	r := new(dns.Msg)
	// It keeps the whole records that fit, as the upstream packed them
	// (compressed or not, depending on the transport it answered on): a
	// proper prefix of the 60 records, filled to within one record (31
	// bytes uncompressed) of 512.
	if err := r.Unpack(buf[:n]); err != nil || !r.Truncated || len(r.Answer) == 0 || len(r.Answer) >= 60 || n <= 512-31 {
		t.Fatalf("truncated answer (%d bytes): %v %v", n, err, r)
	}
	// Over TCP: the whole answer.
	r = e.ask(t, "big.example.com.", dns.TypeA, false, "tcp")
	if r.Truncated || len(r.Answer) != 60 {
		t.Fatalf("tcp: tc=%v %d records", r.Truncated, len(r.Answer))
	}
	if e.node.count() != 1 {
		t.Fatalf("upstream saw %d queries; the cached answer should serve both", e.node.count())
	}
}

func TestClusterToTCPUpstreamOthersToUDP(t *testing.T) {
	e := start(t, nil)
	for _, name := range []string{"x.default.svc.cluster.local.", "10.0.96.10.in-addr.arpa.", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa."} {
		e.ask(t, name, dns.TypeA, false, "udp")
	}
	if e.kube.tcpN.Load() != 3 || e.kube.udpN.Load() != 0 {
		t.Fatalf("kube-dns: tcp %d udp %d, want 3/0", e.kube.tcpN.Load(), e.kube.udpN.Load())
	}
	e.ask(t, "example.com.", dns.TypeA, false, "udp")
	e.ask(t, "xcluster.local.", dns.TypeA, false, "udp")
	if e.node.udpN.Load() != 2 || e.node.tcpN.Load() != 0 || e.kube.count() != 3 {
		t.Fatalf("node: udp %d tcp %d, kube %d", e.node.udpN.Load(), e.node.tcpN.Load(), e.kube.count())
	}
}

func TestTruncatedUpstreamAnswerIsReaskedOverTCP(t *testing.T) {
	e := start(t, nil)
	e.node.truncateUDP.Store(true)
	r := e.ask(t, "tc.example.com.", dns.TypeA, true, "udp")
	if r.Truncated || len(r.Answer) != 1 {
		t.Fatalf("answer %v", r)
	}
	if e.node.udpN.Load() != 1 || e.node.tcpN.Load() != 1 {
		t.Fatalf("upstream udp %d tcp %d, want 1/1", e.node.udpN.Load(), e.node.tcpN.Load())
	}
}

func TestTCPPipelinedQueries(t *testing.T) {
	e := start(t, nil)
	e.ask(t, "hit.example.com.", dns.TypeA, false, "udp") // one hit, one miss below
	conn, err := net.Dial("tcp", e.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	names := []string{"miss.example.com.", "hit.example.com."}
	var out []byte
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		m.Id = uint16(100 + i)
		b, _ := m.Pack()
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	if _, err := conn.Write(out); err != nil { // both in one segment
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := map[uint16]string{}
	for range names {
		var lb [2]byte
		if _, err := io.ReadFull(conn, lb[:]); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, binary.BigEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(conn, b); err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(b); err != nil {
			t.Fatal(err)
		}
		got[r.Id] = r.Answer[0].(*dns.A).A.String()
	}
	for i, n := range names {
		if got[uint16(100+i)] != wantA(n) {
			t.Fatalf("id %d: %q, want %q", 100+i, got[uint16(100+i)], wantA(n))
		}
	}
}

func TestBadQueriesGetErrorsAndServingGoesOn(t *testing.T) {
	e := start(t, nil)
	conn, err := net.Dial("udp", e.udp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	two := new(dns.Msg)
	two.Id = 7
	two.Question = []dns.Question{{Name: "a.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, {Name: "b.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}}
	twoB, _ := two.Pack()
	status := new(dns.Msg)
	status.SetQuestion("a.example.", dns.TypeA)
	status.Opcode = dns.OpcodeStatus
	status.Id = 8
	statusB, _ := status.Pack()
	badvers := new(dns.Msg)
	badvers.SetQuestion("a.example.", dns.TypeA)
	badvers.SetEdns0(1232, false)
	badvers.IsEdns0().SetVersion(1)
	badvers.Id = 9
	badversB, _ := badvers.Pack()
	cases := []struct {
		name  string
		pkt   []byte
		rcode int // -1: dropped
	}{
		{"two questions", twoB, dns.RcodeFormatError},
		{"opcode status", statusB, dns.RcodeNotImplemented},
		{"edns version 1", badversB, dns.RcodeBadVers},
		{"garbage after header", append([]byte{0, 10, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}, 0xC0, 0x0C, 0, 1), dns.RcodeFormatError},
		{"short", []byte{1, 2, 3}, -1},
		{"a response", []byte{0, 11, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0}, -1},
	}
	for _, tc := range cases {
		if _, err := conn.Write(tc.pkt); err != nil {
			t.Fatal(err)
		}
		if tc.rcode < 0 {
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatalf("%s: answer does not unpack: %v", tc.name, err)
		}
		if r.Rcode != tc.rcode || r.Id != binary.BigEndian.Uint16(tc.pkt) {
			t.Fatalf("%s: rcode %d id %d, want %d", tc.name, r.Rcode, r.Id, tc.rcode)
		}
	}
	// Still serving, and nothing reached an upstream.
	e.ask(t, "after.example.com.", dns.TypeA, false, "udp")
	if e.node.count() != 1 || e.kube.count() != 0 {
		t.Fatalf("upstreams saw %d/%d", e.node.count(), e.kube.count())
	}
}

func TestDeadUpstreamGetsPromptServfail(t *testing.T) {
	e := start(t, nil)
	_ = e.kube.udp.Shutdown()
	_ = e.kube.tcp.Shutdown()
	began := time.Now()
	r := e.ask(t, "dead.default.svc.cluster.local.", dns.TypeA, false, "udp")
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %d", r.Rcode)
	}
	if d := time.Since(began); d > 2500*time.Millisecond {
		t.Fatalf("SERVFAIL after %v", d)
	}
	// Nothing from the outage is cached: the next query goes upstream again.
	if st := e.d.Cache.Stats(); st.Entries[0]+st.Entries[1]+st.Entries[2] != 0 {
		t.Fatalf("outage cached: %+v", st)
	}
}
