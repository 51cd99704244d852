package server

import (
	"bytes"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// tapSink is a collector on a unix socket that keeps (keep) or discards
// what it gets.
type tapSink struct {
	mu  sync.Mutex
	got []dnstap.Decoded
	n   int
}

func startTapSink(t testing.TB, keep bool) (*dnstap.Tap, *tapSink) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tap.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &tapSink{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = dnstap.Collect(c, func(p []byte) {
					k.mu.Lock()
					defer k.mu.Unlock()
					k.n++
					if keep {
						d, err := dnstap.Decode(bytes.Clone(p))
						if err == nil {
							k.got = append(k.got, d)
						}
					}
				})
			}()
		}
	}()
	tap := dnstap.New(dnstap.Config{Network: "unix", Address: path, Full: true, Identity: "n", Version: "v"}, nil, nil)
	t.Cleanup(func() { tap.Close(); ln.Close() })
	return tap, k
}

func (k *tapSink) frames() []dnstap.Decoded {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]dnstap.Decoded(nil), k.got...)
}

// tapped makes every name's block tap to tap.
func tapped(tap *dnstap.Tap) func(*resolve.Config) {
	return newChained([]string{"dnstap"}, &dnstap.Handler{Taps: []*dnstap.Tap{tap}}).rmut
}

// TestTapClientMessages: a miss and a hit, over UDP and TCP, each give
// CLIENT_QUERY then CLIENT_RESPONSE with the client's address and port,
// the query as sent and the answer as received; the health name is not
// tapped.
func TestTapClientMessages(t *testing.T) {
	tap, sink := startTapSink(t, true)
	s, _ := startServer(t, nil, tapped(tap))
	type asked struct {
		port uint16
		tcp  bool
		q, r []byte
		hit  bool
	}
	var all []asked
	for _, network := range []string{"udp", "tcp"} {
		addr := s.Addr().String()
		if network == "tcp" {
			addr = s.TCPAddr().String()
		}
		for i := 0; i < 2; i++ {
			c, err := net.Dial(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			co := &dns.Conn{Conn: c}
			m := new(dns.Msg)
			m.SetQuestion("tap-"+network+".example.", dns.TypeA)
			q, _ := m.Pack()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if err := co.WriteMsg(m); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			n, err := co.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			rb := buf[:n]
			all = append(all, asked{port: c.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort().Port(), tcp: network == "tcp", q: q, r: rb, hit: i == 1})
			c.Close()
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.frames()) < 2*len(all) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := sink.frames()
	if len(got) != 2*len(all) {
		t.Fatalf("%d frames for %d queries", len(got), len(all))
	}
	for _, a := range all {
		var mine []dnstap.Decoded
		for _, d := range got {
			if d.Query.Port() == a.port {
				mine = append(mine, d)
			}
		}
		if len(mine) != 2 || mine[0].Type != dnstap.ClientQuery || mine[1].Type != dnstap.ClientResponse {
			t.Fatalf("port %d: %+v", a.port, mine)
		}
		for _, d := range mine {
			if d.TCP != a.tcp || d.Query.Addr() != netip.MustParseAddr("127.0.0.1") || d.QueryTime.IsZero() || string(d.Identity) != "n" || string(d.Version) != "v" || d.Response.IsValid() {
				t.Errorf("port %d hit=%v: %+v", a.port, a.hit, d)
			}
		}
		if !bytes.Equal(mine[0].QueryMessage, a.q) || mine[0].HasResponseMessage || !mine[0].ResponseTime.IsZero() {
			t.Errorf("port %d: query frame %+v", a.port, mine[0])
		}
		if !bytes.Equal(mine[1].ResponseMessage, a.r) || mine[1].HasQueryMessage || mine[1].ResponseTime.Before(mine[1].QueryTime) {
			t.Errorf("port %d: response frame %+v", a.port, mine[1])
		}
	}
	// The health name is the daemon's own probe.
	c, _ := net.Dial("udp", s.Addr().String())
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("health-check.nodelocaldns.invalid.", dns.TypeA)
	co := &dns.Conn{Conn: c}
	_ = co.WriteMsg(m)
	_, _ = co.ReadMsg()
	time.Sleep(200 * time.Millisecond)
	if n := len(sink.frames()); n != len(got) {
		t.Errorf("the health name was tapped: %d frames, %d before", n, len(got))
	}
}

// BenchmarkUDPHitTapped is BenchmarkUDPHit with every name's block
// tapping (full) to a collector that reads everything: compare with
// BenchmarkUDPHit within one run.
func BenchmarkUDPHitTapped(b *testing.B) {
	tap, _ := startTapSink(b, false)
	benchmarkUDPHit(b, nil, tapped(tap))
}
