package server

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/autopath"
	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// wireCheck is the daemon's hook without the watch: the name test alone.
type wireCheck struct{ ap *autopath.Autopath }

func (w wireCheck) Candidate(q *wire.Query) bool { return w.ap.CandidateWire(q.Name, q.Type) }
func (w wireCheck) Answer(ctx context.Context, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error) {
	return w.ap.Answer(ctx, src, qname, qtype)
}

type noPods struct{}

func (noPods) Lookup(netip.Addr) (*podwatch.Pod, podwatch.State) { return nil, kubewatch.Synced }

// BenchmarkAnswerLocalHit is the hot path of one cached query without the
// socket: with autopath off (one nil check more than before autopath), and
// on for an A query that is not a candidate (the wire check walks its
// labels).
func BenchmarkAnswerLocalHit(b *testing.B) {
	ap, err := autopath.New(autopath.Config{Pods: noPods{}, ClusterDomain: "cluster.local",
		Resolve: func(context.Context, string, uint16) (autopath.Result, error) { return autopath.Result{}, nil }})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		ap   Autopath
		q    string
	}{
		{"autopath-off", nil, "bench.example."},
		{"autopath-on/external-name", wireCheck{ap}, "bench.example."},
		{"autopath-on/long-external-name", wireCheck{ap}, "a.b.c.d.e.f.example.com."},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, _ := startServer(b, nil)
			m := new(dns.Msg)
			m.SetQuestion(bc.q, dns.TypeA) // not under svc.cluster.local: the cache answers
			raw, _ := m.Pack()
			c, err := net.Dial("udp", s.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			_, _ = c.Write(raw)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1500)); err != nil {
				b.Fatal(err)
			}
			s.cfg.Autopath = bc.ap
			var st Stats // no CoreDNS counters: the autopath check alone
			req := &request{raw: raw, st: &st, now: time.Now().UnixNano()}
			out := make([]byte, 0, 1500)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				out, _ = s.answerLocal(req, out[:0])
			}
		})
	}
}
