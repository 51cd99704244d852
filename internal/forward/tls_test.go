package forward

import (
	"context"
	"crypto/tls"
	"net/netip"
	"testing"

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
