package forward

import (
	"context"
	"net/netip"
	"testing"
)

// BenchmarkUDPExchange measures a query through a UDP group against an upstream that echoes
// the query as a NODATA answer (cheap, so the client side dominates): socket reuse, the receive
// buffer and the answer's validation.
func BenchmarkUDPExchange(b *testing.B) {
	addr := echoUDP(b)
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
