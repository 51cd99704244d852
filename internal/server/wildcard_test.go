package server

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// askFrom sends a query for name to dst from a fresh unconnected socket
// and returns the answer and the address it came from.
func askFrom(t *testing.T, network string, dst netip.AddrPort, name string, id uint16) (*dns.Msg, netip.AddrPort) {
	t.Helper()
	c, err := net.ListenUDP(network, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	b, _ := m.Pack()
	if _, err := c.WriteToUDPAddrPort(b, dst); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("%s %s: %v", dst, name, err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil || r.Id != id {
		t.Fatalf("%s %s: %v %v", dst, name, r, err)
	}
	return r, netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
}

// freeWildPort is a UDP and TCP port free on every address when it was
// asked, outside the kernel's ephemeral range.
func freeWildPort(t testing.TB) int { return testhost.FreeWildcardPort(t) }

// TestWildcardAnswersFromTheAddressAsked: the wildcard socket (listen
// address 0.0.0.0) answers on addresses nobody listed (127.0.0.2, which
// lo routes, and ::1), each answer, miss or hit, leaving from the address
// the query was sent to; a specific socket on the same port keeps its own
// queries; TCP answers there too.
func TestWildcardAnswersFromTheAddressAsked(t *testing.T) {
	port := freeWildPort(t)
	counted := countByBlocks(t, []CDZone{{Name: ".", Plugin: "errors"}})
	s, _ := startServer(t, func(c *Config) {
		counted(c)
		c.Addrs = []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("127.0.0.3")}
		c.Port = port
	})
	if !s.udp[0].wild || s.udp[1].wild {
		t.Fatalf("wild flags %v %v", s.udp[0].wild, s.udp[1].wild)
	}
	dsts := []netip.AddrPort{
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port)),
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)),
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), uint16(port)), // the specific socket's
	}
	if s.udp[0].local.Addr().Is6() { // dual-stack: IPv6 too
		dsts = append(dsts, netip.AddrPortFrom(netip.IPv6Loopback(), uint16(port)))
	}
	for i, dst := range dsts {
		for j, what := range []string{"miss", "hit"} {
			network := "udp4"
			if dst.Addr().Is6() {
				network = "udp6"
			}
			r, from := askFrom(t, network, dst, "w.example.", uint16(10*i+j+1))
			if from != dst || len(r.Answer) != 1 {
				t.Fatalf("%s %s: answer from %s (%d records)", dst, what, from, len(r.Answer))
			}
		}
	}
	spec := s.udp[1].stats.RequestsUDP.Load()
	if spec != 2 {
		t.Fatalf("the specific socket got %d queries, want its 2", spec)
	}
	cl := &dns.Client{Net: "tcp", Timeout: 3 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion("w.example.", dns.TypeA)
	r, _, err := cl.Exchange(m, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port)).String())
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("tcp 127.0.0.2: %v %v", r, err)
	}
	// CoreDNS's labels: the server is the listen address as written
	// (dns://0.0.0.0:PORT, as the stock's), the family the client's.
	want := map[string][2][2]uint64{ // server → [proto][family] requests
		fmt.Sprintf("dns://0.0.0.0:%d", port):   {{uint64(2 * (len(dsts) - 2)), 0}, {1, 0}},
		fmt.Sprintf("dns://127.0.0.3:%d", port): {{2, 0}, {0, 0}},
	}
	if len(dsts) == 4 {
		w := want[fmt.Sprintf("dns://0.0.0.0:%d", port)]
		w[0] = [2]uint64{4, 2}
		want[fmt.Sprintf("dns://0.0.0.0:%d", port)] = w
	}
	got := map[string][2][2]uint64{}
	misses := uint64(0)
	for _, b := range s.CDSnapshot() {
		misses += b.CacheMisses
		var pf [2][2]uint64
		for p := range 2 {
			for f := range 2 {
				for _, n := range b.Requests[p][f] {
					pf[p][f] += n
				}
			}
		}
		got[b.Server] = pf
	}
	if misses != 1 {
		t.Errorf("%d cache misses, want 1 (every other answer a hit)", misses)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests by server, [proto][family]: %v, want %v", got, want)
	}
}

// BenchmarkUDPHitWildcard is BenchmarkUDPHit on the wildcard socket
// (every datagram's destination read and written back as the answer's
// source): compare the two within one run.
func BenchmarkUDPHitWildcard(b *testing.B) {
	port := freeWildPort(b)
	benchmarkUDPHitTo(b, func(c *Config) {
		c.Addrs = []netip.Addr{netip.IPv4Unspecified()}
		c.Port = port
	}, nil, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
}

// BenchmarkPktDst is what the wildcard socket adds in user space per
// datagram: reading the destination recvmmsg reported (an IPv4 query on
// the dual-stack socket: IPV6_PKTINFO with a v4-mapped address) and
// writing the answer's control message.
func BenchmarkPktDst(b *testing.B) {
	var in [ctlInLen]byte
	var out [pktinfoLen]byte
	n, _ := pktDst(nil, &out)
	if n != 0 {
		b.Fatal("a control message from nothing")
	}
	// What the kernel writes: a cmsghdr and an in6_pktinfo.
	h := (*unix.Cmsghdr)(unsafe.Pointer(&in[0]))
	h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	a := netip.MustParseAddr("::ffff:127.0.0.2").As16()
	copy(in[unix.CmsgLen(0):], a[:])
	ctl := in[:unix.CmsgSpace(unix.SizeofInet6Pktinfo)]
	if n, dst := pktDst(ctl, &out); n == 0 || dst != netip.MustParseAddr("127.0.0.2") {
		b.Fatalf("%d %s", n, dst)
	}
	b.ReportAllocs()
	for b.Loop() {
		pktDst(ctl, &out)
	}
}

// TestWildcardLogsTheAddressAsked: the Corefile's log on the wildcard
// socket shows, as {local}, the address each query was sent to, for a
// miss (answered later) and a hit.
func TestWildcardLogsTheAddressAsked(t *testing.T) {
	port := freeWildPort(t)
	var out syncBuf
	blog := dnslog.NewSink(&out).Compile([]dnslog.Rule{{Scope: ".", Classes: dnslog.All, Format: "{local} {name}"}})
	startServer(t, func(c *Config) {
		c.Addrs = []netip.Addr{netip.IPv4Unspecified()}
		c.Port = port
	}, newChained([]string{"log"}, dnslog.Handler{Log: blog}).rmut)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port))
	askFrom(t, "udp4", dst, "l.example.", 1) // a miss
	askFrom(t, "udp4", dst, "l.example.", 2) // a hit
	want := "[INFO] 127.0.0.2 l.example.\n[INFO] 127.0.0.2 l.example.\n"
	for deadline := time.Now().Add(2 * time.Second); out.String() != want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := out.String(); got != want {
		t.Errorf("log lines %q, want %q", got, want)
	}
}

// syncBuf is a bytes.Buffer safe for the serving goroutines' writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
