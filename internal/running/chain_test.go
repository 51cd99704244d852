package running

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/blocks"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// templateCorefile is internal/daemon's chain_test's Corefile: a template
// answering one name, another answering AAAA NOERROR.
func templateCorefile(addr string) string {
	return fmt.Sprintf(".:53 {\n  bind 127.0.0.1\n  cache 30\n  template IN A pinned.test {\n    answer \"{{ .Name }} 300 IN A %s\"\n  }\n  template IN AAAA {\n    rcode NOERROR\n  }\n  forward . /etc/resolv.conf\n}\n", addr)
}

// BenchmarkChainFetch is the cost the chain adds to a miss: the query
// unpacked, the block's chain (here a template answering AAAA NOERROR, or
// passing A on to the forward), the answer packed.
func BenchmarkChainFetch(b *testing.B) {
	cfg := &config.Config{}
	srv, err := corefile.Build("Corefile", mustParse(b, templateCorefile("10.0.0.1")), corefile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cfg.DropIn.Corefile = &config.CorefileConfig{Servers: srv}
	d := &State{cfg: cfg, log: slog.New(slog.DiscardHandler), clock: clock.Real}
	ans := new(dns.Msg)
	ans.SetQuestion("www.example.org.", dns.TypeA)
	ans.Response = true
	a, _ := dns.NewRR("www.example.org. 60 IN A 10.0.0.1")
	ans.Answer = []dns.RR{a}
	wire, _ := ans.Pack()
	next := func(context.Context, string, []byte) ([]byte, error) { return wire, nil }
	if err := d.initChain(next); err != nil {
		b.Fatal(err)
	}
	c := d.chain.Load()
	run := c.Run("www.example.org.") // the block's chain, as its View's Block carries it
	fetch := func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		return blocks.RunChain(ctx, run, qname, query)
	}
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeA} {
		q := new(dns.Msg)
		q.SetQuestion("www.example.org.", qt)
		q.SetEdns0(1232, false)
		qw, _ := q.Pack()
		b.Run(dns.TypeToString[qt], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fetch(context.Background(), "www.example.org.", qw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("no-chain", func(b *testing.B) {
		q := new(dns.Msg)
		q.SetQuestion("www.example.org.", dns.TypeA)
		qw, _ := q.Pack()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := next(context.Background(), "www.example.org.", qw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func mustParse(b *testing.B, text string) []*corefile.Block {
	bs, err := corefile.Parse("Corefile", []byte(text), func(string) string { return "" })
	if err != nil {
		b.Fatal(err)
	}
	return bs
}

// The fetch-side directives are registered by their packages (the chain
// is built from the registry alone).
func TestFetchSideDirectivesRegistered(t *testing.T) {
	if got, want := directive.Names(), []string{"dns64", "hosts", "rewrite", "template"}; !slices.Equal(got, want) {
		t.Fatalf("registered %v, want %v", got, want)
	}
}

// BenchmarkChainForwards is what a block with two forwards costs a miss
// (internal/blocks/links.go) over a block with one: "first" is answered
// by the first forward (the walk, the message unpacked and packed, as any
// chain), "handed-on" gets NXDOMAIN there and asks the second forward's
// group, a real UDP group to an upstream on loopback; "group-alone" is
// that group's exchange without a chain (what handed-on adds to it is the
// first forward's answer and the walk).
func BenchmarkChainForwards(b *testing.B) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		a, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 10.0.0.2")
		m.Answer = []dns.RR{a}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	up := netip.MustParseAddrPort(pc.LocalAddr().String())
	cfg := &config.Config{ForwardTimeout: 2 * time.Second}
	servers, err := corefile.Build("Corefile", mustParse(b, ".:53 {\n  bind 127.0.0.1\n  forward . 10.0.0.1 {\n    next NXDOMAIN\n  }\n  forward . "+up.String()+"\n}\n"), corefile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cc := &config.CorefileConfig{Servers: servers, Links: map[*corefile.Server][]config.ForwardLink{
		servers[0]: {{Route: config.ZoneRoute{Zone: ".", Servers: []netip.AddrPort{up}}}},
	}}
	cfg.DropIn.Corefile = cc
	d := &State{cfg: cfg, log: slog.New(slog.DiscardHandler), clock: clock.Real}
	answer := func(rcode int) []byte {
		m := new(dns.Msg)
		m.SetQuestion("www.example.org.", dns.TypeA)
		m.Response, m.Rcode = true, rcode
		if rcode == dns.RcodeSuccess {
			a, _ := dns.NewRR("www.example.org. 60 IN A 10.0.0.1")
			m.Answer = []dns.RR{a}
		}
		w, _ := m.Pack()
		return w
	}
	var first []byte
	next := func(context.Context, string, []byte) ([]byte, error) { return first, nil }
	if err := d.initChain(next); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	run := d.chain.Load().Run("www.example.org.")
	q := new(dns.Msg)
	q.SetQuestion("www.example.org.", dns.TypeA)
	q.SetEdns0(1232, false)
	qw, _ := q.Pack()
	for _, tc := range []struct {
		name  string
		first []byte
		want  string
		chain bool
	}{
		{"first", answer(dns.RcodeSuccess), "10.0.0.1", true},
		{"handed-on", answer(dns.RcodeNameError), "10.0.0.2", true},
		{"group-alone", nil, "10.0.0.2", false},
	} {
		first = tc.first
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var ans []byte
				var err error
				if tc.chain {
					ans, err = blocks.RunChain(context.Background(), run, "www.example.org.", qw)
				} else {
					ans, err = d.chain.Load().Groups()[0].Exchange(context.Background(), qw)
				}
				if err != nil {
					b.Fatal(err)
				}
				m := new(dns.Msg)
				if err := m.Unpack(ans); err != nil || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != tc.want {
					b.Fatalf("answer %v %v, want %s", m, err, tc.want)
				}
			}
		})
	}
}
