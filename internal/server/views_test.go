package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// viewQuestion is a parsed A query for name.
func viewQuestion(t *testing.T, name string) *wire.Query {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q := new(wire.Query)
	if err := wire.ParseQuery(raw, q); err != nil {
		t.Fatal(err)
	}
	return q
}

// A resolver replaced by SetViews keeps counting for one generation (its
// misses may still finish), then its counts move into the server's
// retired total and it is let go: counters never go back, and reloads do
// not keep every old resolver alive.
func TestSetViewsRetiresReplacedResolvers(t *testing.T) {
	z := &zoneForward{}
	first := newResolver(t, z.forward)
	s, err := New(Config{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Resolver: first})
	if err != nil {
		t.Fatal(err)
	}
	q := viewQuestion(t, "a.example.")
	if _, _, err := first.Resolve(context.Background(), q, nil); err != nil {
		t.Fatal(err)
	}
	if got := s.Snapshot().CacheMisses; got != 1 {
		t.Fatalf("misses %d, want 1", got)
	}
	second, third := newResolver(t, z.forward), newResolver(t, z.forward)
	if err := s.SetViews([]*resolve.Resolver{second}, nil); err != nil {
		t.Fatal(err)
	}
	// A miss that was in flight on the replaced resolver still counts.
	if _, _, err := first.Resolve(context.Background(), viewQuestion(t, "b.example."), nil); err != nil {
		t.Fatal(err)
	}
	if got, n := s.Snapshot().CacheMisses, len(s.allRes); got != 2 || n != 2 {
		t.Fatalf("after one swap: misses %d, resolvers kept %d; want 2 and 2", got, n)
	}
	if err := s.SetViews([]*resolve.Resolver{third}, nil); err != nil {
		t.Fatal(err)
	}
	if got, n := s.Snapshot().CacheMisses, len(s.allRes); got != 2 || n != 2 {
		t.Fatalf("after two swaps: misses %d, resolvers kept %d; want 2 and 2 (second and third)", got, n)
	}
	for _, r := range s.allRes {
		if r == first {
			t.Fatal("the resolver replaced two swaps ago is still kept")
		}
	}
}

// freePort is a port free for both UDP and TCP on 127.0.0.1 when it was
// asked.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		_ = u.Close()
		if err == nil {
			_ = l.Close()
			return p
		}
	}
	t.Fatal("no port free for UDP and TCP")
	return 0
}

// One address on two ports (a Corefile's blocks on other ports): one socket
// per port, each with its own view and CoreDNS server label, over UDP and
// TCP; the same address and port twice is refused.
func TestViewsPerPort(t *testing.T) {
	p1, p2 := freePort(t), freePort(t)
	for p2 == p1 {
		p2 = freePort(t)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	other := newResolver(t, func(_ context.Context, _ string, query []byte) ([]byte, error) {
		m := new(dns.Msg)
		if err := m.Unpack(query); err != nil {
			return nil, err
		}
		r := new(dns.Msg)
		r.SetReply(m)
		rr, _ := dns.NewRR(m.Question[0].Name + " 300 IN A 192.0.2.8")
		r.Answer = append(r.Answer, rr)
		return r.Pack()
	})
	s, _ := startServer(t, func(c *Config) {
		c.Addrs, c.Port, c.Ports = []netip.Addr{lo, lo}, p1, []int{0, p2}
	})
	if err := s.SetViews([]*resolve.Resolver{s.cfg.Resolver, other}, []uint8{0, 1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		port int
		want string
	}{{p1, "192.0.2.7"}, {p2, "192.0.2.8"}} {
		for _, netw := range []string{"udp", "tcp"} {
			m := new(dns.Msg)
			m.SetQuestion("a.example.", dns.TypeA)
			c := &dns.Client{Net: netw, Timeout: 3 * time.Second}
			r, _, err := c.Exchange(m, fmt.Sprintf("127.0.0.1:%d", tc.port))
			if err != nil {
				t.Fatalf("%s port %d: %v", netw, tc.port, err)
			}
			if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != tc.want {
				t.Errorf("%s port %d: %v, want %s", netw, tc.port, r.Answer, tc.want)
			}
		}
	}
	if got := s.CDServers(); len(got) != 2 || got[0] != fmt.Sprintf("dns://127.0.0.1:%d", p1) || got[1] != fmt.Sprintf("dns://127.0.0.1:%d", p2) {
		t.Errorf("server labels %v", got)
	}
	if _, err := New(Config{Addrs: []netip.Addr{lo, lo}, Port: p1, Ports: []int{p2, p2}, Resolver: other}); err == nil {
		t.Error("the same address and port twice: accepted")
	}
	if _, err := New(Config{Addrs: []netip.Addr{lo, lo}, Port: p1, Ports: []int{p2}, Resolver: other}); err == nil {
		t.Error("Ports shorter than Addrs: accepted")
	}
}

// answerA is a resolver whose upstream answers every A question with ip.
func answerA(t *testing.T, ip string) *resolve.Resolver {
	return newResolver(t, func(_ context.Context, _ string, query []byte) ([]byte, error) {
		m := new(dns.Msg)
		if err := m.Unpack(query); err != nil {
			return nil, err
		}
		r := new(dns.Msg)
		r.SetReply(m)
		rr, _ := dns.NewRR(m.Question[0].Name + " 300 IN A " + ip)
		r.Answer = append(r.Answer, rr)
		return r.Pack()
	})
}

// askA asks 127.0.0.1:port for a.example. A over netw and returns the
// address answered.
func askA(t *testing.T, netw string, port int) string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	c := &dns.Client{Net: netw, Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("%s port %d: %v", netw, port, err)
	}
	if len(r.Answer) != 1 {
		t.Fatalf("%s port %d: %v", netw, port, r.Answer)
	}
	return r.Answer[0].(*dns.A).A.String()
}

// The handover of sockets on two ports: a twin serving both adopts all of
// them (keyed by address and port), opens none, and answers each port with
// its own view once the old one is gone; a twin serving one port adopts
// that port's sockets only.
func TestHandoverPerPort(t *testing.T) {
	p1, p2 := freePort(t), freePort(t)
	for p2 == p1 {
		p2 = freePort(t)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	mk := func(ports []int, views ...*resolve.Resolver) *Server {
		addrs := make([]netip.Addr, len(ports))
		for i := range addrs {
			addrs[i] = lo
		}
		s, err := New(Config{Addrs: addrs, Port: p1, Ports: ports, UDPSockets: 2, Resolver: views[0]})
		if err != nil {
			t.Fatal(err)
		}
		av := make([]uint8, len(ports))
		for i := range av {
			av[i] = uint8(i)
		}
		if err := s.SetViews(views, av); err != nil {
			t.Fatal(err)
		}
		return s
	}
	shut := func(s *Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	}
	old := mk([]int{0, p2}, answerA(t, "192.0.2.1"), answerA(t, "192.0.2.2"))
	if err := old.Listen(); err != nil {
		t.Fatal(err)
	}
	old.Serve()
	if askA(t, "udp", p1) != "192.0.2.1" || askA(t, "udp", p2) != "192.0.2.2" {
		t.Fatal("the old server's views")
	}

	one := mk([]int{0}, answerA(t, "192.0.2.5"))
	files, err := old.Files()
	if err != nil {
		t.Fatal(err)
	}
	if nu, nt, err := one.Adopt(files); err != nil || nu != 4 || nt != 2 {
		t.Fatalf("adopt: udp %d tcp %d err %v", nu, nt, err)
	}
	if err := one.Listen(); err != nil {
		t.Fatal(err)
	}
	if got := one.UDPAddrs(); len(got) != 1 || int(got[0].Port()) != p1 || len(one.udp) != 2 || len(one.tcp) != 1 {
		t.Fatalf("one port: sockets %v, %d udp %d tcp", got, len(one.udp), len(one.tcp))
	}
	shut(one)

	nu := mk([]int{0, p2}, answerA(t, "192.0.2.3"), answerA(t, "192.0.2.4"))
	if files, err = old.Files(); err != nil {
		t.Fatal(err)
	}
	if nu, nt, err := nu.Adopt(files); err != nil || nu != 4 || nt != 2 {
		t.Fatalf("adopt: udp %d tcp %d err %v", nu, nt, err)
	}
	if err := nu.Listen(); err != nil {
		t.Fatal(err)
	}
	nu.Serve()
	defer shut(nu)
	if len(nu.adoptedUDP) != 0 || len(nu.udp) != 4 || len(nu.tcp) != 2 {
		t.Fatalf("two ports: %d udp %d tcp", len(nu.udp), len(nu.tcp))
	}
	// The same sockets, not new ones: a dup is the same sockfs inode (both
	// servers' sockets are open here, so no number is reused). Not
	// SO_COOKIE: QEMU 7.2's user-mode emulation does not pass that option
	// through (getsockopt(SOL_SOCKET, 57) = EINVAL under qemu-*-static),
	// and this test runs there too (docs/crossarch.md).
	cookie := func(fd int) uint64 {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		return uint64(st.Ino)
	}
	oldCookies := map[uint64]netip.AddrPort{}
	for _, l := range old.udp {
		oldCookies[cookie(l.fd)] = l.local
	}
	for _, l := range nu.udp {
		if ap, ok := oldCookies[cookie(l.fd)]; !ok || ap != l.local {
			t.Errorf("udp %s: not the old server's socket (%v)", l.local, ap)
		}
	}
	shut(old)
	for _, netw := range []string{"udp", "tcp"} {
		if a, b := askA(t, netw, p1), askA(t, netw, p2); a != "192.0.2.3" || b != "192.0.2.4" {
			t.Errorf("%s after the handover: port %d %s, port %d %s", netw, p1, a, p2, b)
		}
	}
}
