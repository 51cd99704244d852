package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

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
	if _, _, err := first.Resolve(context.Background(), q); err != nil {
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
	if _, _, err := first.Resolve(context.Background(), viewQuestion(t, "b.example.")); err != nil {
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
