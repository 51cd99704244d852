package forward

import (
	"context"
	"crypto/tls"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// A TLS group asks a DNS-over-TLS server (miekg's tcp-tls) with the
// server name checked against its certificate; a wrong name is refused by
// the handshake, and a plain TCP server is not asked in clear.
func TestTLSGroup(t *testing.T) {
	certFile, keyFile, pool := testhost.Cert(t, t.TempDir(), "dns.example.test")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(testhost.FreePort(t, "127.0.0.1")))
	srv := &dns.Server{Addr: addr.String(), Net: "tcp-tls", TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			b, _ := r.Pack()
			m := new(dns.Msg)
			_ = m.Unpack(answerFor(b))
			_ = w.WriteMsg(m)
		})}
	started := make(chan error, 1)
	srv.NotifyStartedFunc = func() { started <- nil }
	go func() { started <- srv.ListenAndServe() }()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown() })

	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{addr}, Proto: TCP, TLS: &tls.Config{RootCAs: pool, ServerName: "dns.example.test"}}, nil)
	for i := range 20 {
		ans, err := g.Exchange(context.Background(), query(t, "a.example.", uint16(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkTXT(ans, "a.example.", uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	bad := newGroup(t, GroupConfig{Name: "bad", Servers: []netip.AddrPort{addr}, Proto: TCP, TLS: &tls.Config{RootCAs: pool, ServerName: "other.example.test"}}, nil)
	if _, err := bad.Exchange(context.Background(), query(t, "a.example.", 1)); err == nil {
		t.Fatal("a certificate for another name was accepted")
	}
	if _, err := NewGroup(GroupConfig{Name: "udp", Servers: []netip.AddrPort{addr}, Proto: UDP, TLS: &tls.Config{}}, nil); err == nil {
		t.Fatal("TLS over UDP accepted")
	}
}

// serveDoT serves DNS over TLS at addr with cert, answering as answerFor
// and counting the queries; stop shuts it down.
func serveDoT(t *testing.T, addr netip.AddrPort, cert tls.Certificate, n *atomic.Int64) (stop func()) {
	t.Helper()
	srv := &dns.Server{Addr: addr.String(), Net: "tcp-tls", TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			n.Add(1)
			b, _ := r.Pack()
			m := new(dns.Msg)
			_ = m.Unpack(answerFor(b))
			_ = w.WriteMsg(m)
		})}
	started := make(chan error, 1)
	srv.NotifyStartedFunc = func() { started <- nil }
	go func() { started <- srv.ListenAndServe() }()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = srv.Shutdown() }) }
	t.Cleanup(stop)
	return stop
}

// A TLS group with plain servers (a forward's tls:// and dns:// targets
// together) asks each server over its own transport: the tls:// one over
// DNS over TLS, the plain one over UDP (over TCP with PlainTCP); the
// policy spreads queries over both, a TLS server that stops answering is
// marked down and its queries fail over to the plain one, and its health
// probe, over TLS, marks it up again once it answers.
func TestMixedTLSAndPlainGroup(t *testing.T) {
	certFile, keyFile, pool := testhost.Cert(t, t.TempDir(), "dns.example.test")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	dot := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(testhost.FreePort(t, "127.0.0.1")))
	var dotN atomic.Int64
	stop := serveDoT(t, dot, cert, &dotN)
	plain := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	plainTCP := startTCP(t, servePipelined)
	for _, tc := range []struct {
		name     string
		plain    netip.AddrPort
		plainTCP bool
	}{{"tcp", plainTCP.addr, true}, {"udp", plain.addr, false}} { // udp last: it stops the TLS server
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			g := newGroup(t, GroupConfig{Name: "mixed-" + tc.name, Servers: []netip.AddrPort{dot, tc.plain}, Proto: TCP, Spread: true, MaxFails: 1, ProbeInterval: 50 * time.Millisecond,
				TLS: &tls.Config{RootCAs: pool, ServerName: "dns.example.test"}, Plain: map[netip.AddrPort]bool{tc.plain: true}, PlainTCP: tc.plainTCP}, rec)
			dot0 := dotN.Load()
			for i := range 20 {
				ans, err := g.Exchange(context.Background(), query(t, "a.example.", uint16(i)))
				if err != nil {
					t.Fatal(err)
				}
				if err := checkTXT(ans, "a.example.", uint16(i)); err != nil {
					t.Fatal(err)
				}
			}
			if got, plainN := dotN.Load()-dot0, rec.exchangesAt(tc.plain.String()); got != 10 || plainN != 10 {
				t.Fatalf("round robin: %d over TLS, %d plain; want 10 and 10", got, plainN)
			}
			if tc.plainTCP {
				return
			}
			stop()
			for i := range 6 {
				if _, err := g.Exchange(context.Background(), query(t, "b.example.", uint16(i))); err != nil {
					t.Fatalf("with the TLS server gone: %v", err)
				}
			}
			if tr := rec.healthTransitions(dot.String()); len(tr) == 0 || tr[0] != "down" {
				t.Fatalf("the stopped TLS server's health: %v", tr)
			}
			stop = serveDoT(t, dot, cert, &dotN)
			waitFor(t, 5*time.Second, "the TLS server probed up again (over TLS)", func() bool {
				tr := rec.healthTransitions(dot.String())
				return len(tr) > 0 && tr[len(tr)-1] == "up"
			})
		})
	}
	if _, err := NewGroup(GroupConfig{Name: "plain", Servers: []netip.AddrPort{plain.addr}, Proto: UDP, Plain: map[netip.AddrPort]bool{plain.addr: true}}, nil); err == nil {
		t.Fatal("plain servers without TLS accepted")
	}
}
