package stubs_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// zone is the upstream's data: what kube-dns (cluster.local) and an
// external resolver (example.com, example.net) would answer. Every name
// has TTL 30 and every denial an SOA with MINIMUM 30, so all of it is
// cached for the whole test.
type zone struct {
	rrs  map[string][]dns.RR // by lower-case owner name
	fail map[string]bool     // names answered SERVFAIL
}

// newZone holds the same names in each Kubernetes namespace of nss (and
// under <ns>.example.com for external names), so that each client of a
// test can start from an empty cache by living in a namespace of its own.
func newZone(t testing.TB, nss ...string) *zone {
	t.Helper()
	z := &zone{rrs: map[string][]dns.RR{}, fail: map[string]bool{}}
	add := func(format string, a ...any) {
		rr, err := dns.NewRR(fmt.Sprintf(format, a...))
		if err != nil {
			t.Fatal(err)
		}
		name := strings.ToLower(rr.Header().Name)
		z.rrs[name] = append(z.rrs[name], rr)
	}
	for _, ns := range nss {
		svc := ns + ".svc.cluster.local."
		// A ClusterIP Service reached by its short name through the search list.
		add("api.%s 30 IN A 10.96.0.1", svc)
		// A headless Service of 100 pods: a 1.7 KB answer (1647 bytes in
		// namespace default).
		for i := 0; i < 100; i++ {
			add("web.%s 30 IN A 10.244.%d.%d", svc, i/50, i%50+1)
		}
		// 40 pods: a 690-byte answer, over 512 and under 1232.
		for i := 0; i < 40; i++ {
			add("mid.%s 30 IN A 10.245.0.%d", svc, i+1)
		}
		// AAAA only.
		add("v6only.%s 30 IN AAAA fd00::6", svc)
		// SRV records of the headless Service's named port.
		for i := 0; i < 20; i++ {
			add("_http._tcp.web.%s 30 IN SRV 0 5 80 web-%d.web.%s", svc, i, svc)
		}
		// External names: a CNAME chain, a plain name, an NXDOMAIN, a SERVFAIL.
		com, net := ns+".example.com.", ns+".example.net."
		add("www.%s 30 IN CNAME a.cdn.%s", com, net)
		add("a.cdn.%s 30 IN CNAME b.edge.%s", net, net)
		for i := 1; i <= 3; i++ {
			add("b.edge.%s 30 IN A 198.51.100.%d", net, i)
			add("b.edge.%s 30 IN AAAA 2001:db8::%d", net, i)
		}
		add("plain.%s 30 IN A 203.0.113.7", com)
		z.fail["fail."+com] = true
	}
	return z
}

// soa is the SOA of the zone name belongs to, for denials.
func (z *zone) soa(name string) dns.RR {
	apex := "cluster.local."
	switch {
	case dns.IsSubDomain("example.com.", name):
		apex = "example.com."
	case dns.IsSubDomain("example.net.", name):
		apex = "example.net."
	}
	rr, _ := dns.NewRR(apex + " 30 IN SOA ns." + apex + " hostmaster." + apex + " 1 7200 1800 86400 30")
	return rr
}

// answer resolves q in the zone, following CNAMEs as a recursive resolver
// would.
func (z *zone) answer(q dns.Question) *dns.Msg {
	m := new(dns.Msg)
	name := strings.ToLower(q.Name)
	if z.fail[name] {
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	for hops := 0; hops < 8; hops++ {
		rrs, ok := z.rrs[name]
		if !ok {
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{z.soa(name)}
			return m
		}
		var next string
		found := false
		for _, rr := range rrs {
			switch {
			case rr.Header().Rrtype == q.Qtype:
				m.Answer = append(m.Answer, dns.Copy(rr))
				found = true
			case rr.Header().Rrtype == dns.TypeCNAME:
				m.Answer = append(m.Answer, dns.Copy(rr))
				next = strings.ToLower(rr.(*dns.CNAME).Target)
			}
		}
		if found || next == "" {
			if !found {
				m.Ns = []dns.RR{z.soa(name)} // NODATA
			}
			return m
		}
		name = next
	}
	m.Rcode = dns.RcodeServerFailure
	return m
}

// upstream serves a zone over UDP and TCP on one address, truncating UDP
// answers to the asker's size as miekg/dns (and CoreDNS) do, and counts
// every query it gets.
type upstream struct {
	z       *zone
	queries atomic.Int64
	mu      sync.Mutex
	log     []string // "proto name type", for failure messages
}

func startUpstream(t *testing.T, addr string, z *zone) *upstream {
	t.Helper()
	u := &upstream{z: z}
	for _, proto := range []string{"udp", "tcp"} {
		srv := &dns.Server{Net: proto, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
			u.queries.Add(1)
			tcp := w.LocalAddr().Network() == "tcp"
			if len(req.Question) != 1 {
				return
			}
			q := req.Question[0]
			u.mu.Lock()
			u.log = append(u.log, fmt.Sprintf("%s %s %s", w.LocalAddr().Network(), q.Name, dns.TypeToString[q.Qtype]))
			u.mu.Unlock()
			r := u.z.answer(q)
			r.SetRcode(req, r.Rcode)
			r.Authoritative = true
			r.RecursionAvailable = true
			size := dns.MinMsgSize
			if o := req.IsEdns0(); o != nil {
				r.SetEdns0(1232, false)
				size = int(o.UDPSize())
			}
			if tcp {
				size = dns.MaxMsgSize
			}
			r.Truncate(size)
			r.Compress = true
			_ = w.WriteMsg(r)
		})}
		switch proto {
		case "udp":
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				t.Fatal(err)
			}
			srv.PacketConn = pc
		default:
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			srv.Listener = l
		}
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

// since returns the queries logged after the first n.
func (u *upstream) since(n int) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.log[n:]...)
}

func (u *upstream) logLen() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.log)
}
