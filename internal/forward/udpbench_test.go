package forward

import (
	"context"
	"net"
	"net/netip"
	"testing"
)

// BenchmarkUDPExchange measures a query through a UDP group against an upstream that echoes
// the query as a NODATA answer (cheap, so the client side dominates): socket reuse, the receive
// buffer and the answer's validation.
func BenchmarkUDPExchange(b *testing.B) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			buf[2] |= 0x80 // QR
			pc.WriteTo(buf[:n], from)
		}
	}()
	b.Cleanup(func() { pc.Close(); <-done })
	addr := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	g := newGroup(b, GroupConfig{Name: "bench", Servers: []netip.AddrPort{addr}, Proto: UDP}, nil)
	q := query(b, "www.example.com.", 1)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := g.Exchange(ctx, q); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
