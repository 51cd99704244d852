package dropin

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// TestDualKubeDNSFailover: kubespray's coredns_dual, two kube-dns servers
// in the cluster domain's forward. With the first down (nothing listens),
// both CoreDNS 1.15 and nodelocaldns answer every name through the second,
// with every policy.
func TestDualKubeDNSFailover(t *testing.T) {
	for _, policy := range []string{"", "policy random", "policy round_robin", "policy sequential"} {
		name := strings.TrimPrefix(policy, "policy ")
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			dead := fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))
			corefile := `cluster.local:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . ` + dead + ` %[3]s {
        force_tcp
        ` + policy + `
    }
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[2]s
}
`
			aOurs, aCore, _, _ := pair(t, corefile, false)
			for i := range 12 {
				name := fmt.Sprintf("web%d.default.svc.cluster.local.", i)
				o, c := askFull(t, aOurs, name, dns.TypeA), askFull(t, aCore, name, dns.TypeA)
				if o.String() != c.String() || o.rcode != "NOERROR" {
					t.Errorf("%s: ours %s, coredns %s", name, o, c)
				}
			}
		})
	}
}

// TestForceTCPOnResolvConf: `forward . /etc/resolv.conf { force_tcp }`
// (an RKE1 template) asks the node's resolvers over TCP, as CoreDNS 1.15
// does. The resolver stand-in (port 53 of a loopback address of its own,
// as resolv.conf has no port) answers with the transport it was asked on.
func TestForceTCPOnResolvConf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("port 53 needs root")
	}
	const ns = "127.29.0.1"
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		txt, _ := dns.NewRR(r.Question[0].Name + ` 60 IN TXT "` + w.RemoteAddr().Network() + `"`)
		m.Answer = append(m.Answer, txt)
		_ = w.WriteMsg(m)
	})
	for _, n := range []string{"udp", "tcp"} {
		s := &dns.Server{Addr: ns + ":53", Net: n, Handler: h}
		started := make(chan error, 1)
		s.NotifyStartedFunc = func() { started <- nil }
		go func() { started <- s.ListenAndServe() }()
		if err := <-started; err != nil {
			t.Skipf("%s %s:53: %v", n, ns, err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+ns+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ opt, want string }{{"force_tcp", "tcp"}, {"", "udp"}} {
		t.Run("with"+tc.opt, func(t *testing.T) {
			corefile := `.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . ` + resolv + ` {
        ` + tc.opt + `
    }
}
`
			aOurs, aCore, _, _ := pair(t, corefile, true)
			o, c := askFull(t, aOurs, "proto.example.org.", dns.TypeTXT), askFull(t, aCore, "proto.example.org.", dns.TypeTXT)
			if o.String() != c.String() || len(o.answer) != 1 || !strings.Contains(o.answer[0], `"`+tc.want+`"`) {
				t.Errorf("ours %s, coredns %s; want the resolver asked over %s", o, c, tc.want)
			}
		})
	}
}

// TestFailFastAllUnhealthyUpstreams: with failfast_all_unhealthy_upstreams
// and the only upstream silent, once it is marked down both CoreDNS 1.15
// and nodelocaldns answer SERVFAIL at once instead of waiting on it.
func TestFailFastAllUnhealthyUpstreams(t *testing.T) {
	silent := serveDNS(t, dns.HandlerFunc(func(dns.ResponseWriter, *dns.Msg) {}))
	corefile := `.:%[1]d {
    bind 127.0.0.1
    forward . ` + silent + ` {
        max_fails 1
        health_check 100ms
        failfast_all_unhealthy_upstreams
    }
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true, "-forward-timeout", "2s")
	for _, a := range []string{aOurs, aCore} {
		fast := false
		deadline := time.Now().Add(15 * time.Second)
		for i := 0; !fast && time.Now().Before(deadline); i++ {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("q%d.example.org.", i), dns.TypeA)
			c := &dns.Client{Timeout: 8 * time.Second}
			start := time.Now()
			r, _, err := c.Exchange(m, a)
			if err == nil && r.Rcode == dns.RcodeServerFailure && time.Since(start) < 300*time.Millisecond {
				fast = true
			}
		}
		if !fast {
			t.Errorf("%s: no fast SERVFAIL with the upstream down", a)
		}
	}
}

// startDoTCoreDNS starts CoreDNS 1.15 serving DNS over TLS on a free port
// of 127.0.0.1 (a certificate for dns.example.test, made here), forwarding
// to the stand-in upstream, and returns its address once it answers, with
// the certificate's file (the CA a client verifies it with).
func startDoTCoreDNS(t *testing.T) (addr, caFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile, _ := testhost.Cert(t, dir, "dns.example.test")
	dot := fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1"))
	conf := filepath.Join(dir, "dot.Corefile")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("tls://.:%s {\n  bind 127.0.0.1\n  tls %s %s\n  forward . %s\n}\n",
		dot[strings.LastIndexByte(dot, ':')+1:], certFile, keyFile, upstream(t, "192.0.2.53"))), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs testhost.SyncBuffer
	start(t, []string{buildCoreDNS(t), "-conf", conf, "-quiet"}, &logs)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := &dns.Client{Net: "tcp-tls", Timeout: time.Second, TLSConfig: &tls.Config{InsecureSkipVerify: true}}
		m := new(dns.Msg)
		m.SetQuestion("up.example.org.", dns.TypeA)
		if _, _, err := c.Exchange(m, dot); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the DoT server does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return dot, certFile
}

// TestForwardTLSToCoreDNS: `forward . tls://ADDR { tls CA; tls_servername
// NAME }` asks a real DNS-over-TLS server (CoreDNS 1.15 serving tls://
// with the tls directive, in front of the stand-in upstream) with the
// server's certificate checked: nodelocaldns answers as CoreDNS does; with
// a server name the certificate does not hold, both answer SERVFAIL.
func TestForwardTLSToCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dot, certFile := startDoTCoreDNS(t)
	ip, port, _ := strings.Cut(dot, ":")
	for _, tc := range []struct {
		server, want, target string
	}{
		{"dns.example.test", "NOERROR", ""},
		{"other.example.test", "SERVFAIL", ""},
		// CoreDNS's per-target server name, in both places of the port.
		{"dns.example.test", "NOERROR", ip + "%dns.example.test:" + port},
		{"dns.example.test", "NOERROR", dot + "%dns.example.test"},
		{"other.example.test", "SERVFAIL", ip + "%other.example.test:" + port},
	} {
		t.Run(tc.server+tc.target, func(t *testing.T) {
			target, servername := dot, "\n        tls_servername "+tc.server
			if tc.target != "" {
				target, servername = tc.target, ""
			}
			corefile := `.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . tls://` + strings.ReplaceAll(target, "%", "%%") + ` {
        tls ` + certFile + servername + `
    }
}
`
			aOurs, aCore, _, _ := pair(t, corefile, true, "-forward-timeout", "3s")
			for _, name := range []string{"www.example.org.", "nx.example.org."} {
				o, c := askFull(t, aOurs, name, dns.TypeA), askFull(t, aCore, name, dns.TypeA)
				if o.String() != c.String() {
					t.Errorf("%s: ours %s, coredns %s", name, o, c)
				}
				if name == "www.example.org." && o.rcode != tc.want {
					t.Errorf("%s: %s, want %s", name, o.rcode, tc.want)
				}
			}
		})
	}
}

// TestForwardTLSAndPlainToCoreDNS: one forward with a tls:// target (a
// real DNS-over-TLS server: CoreDNS 1.15 serving tls://, in front of an
// upstream answering 192.0.2.53) and a plain one (answering
// 93.184.216.34) asks each over its own transport, as CoreDNS 1.15 does:
// with policy sequential the first healthy one answers, and a dead first
// server of either kind fails over to the other. Compared with CoreDNS,
// each case checked for the server that answered.
func TestForwardTLSAndPlainToCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dot, certFile := startDoTCoreDNS(t)
	dead := fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")) // nothing listens there
	for _, tc := range []struct {
		name, to, want string
	}{
		{"tls first", "tls://" + dot + " %[2]s", "192.0.2.53"},
		{"plain first", "%[2]s tls://" + dot, "93.184.216.34"},
		{"dead tls first", "tls://" + dead + " %[2]s", "93.184.216.34"},
		{"dead plain first", dead + " tls://" + dot, "192.0.2.53"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			corefile := `.:%[1]d {
    bind 127.0.0.1
    forward . ` + tc.to + ` {
        tls ` + certFile + `
        tls_servername dns.example.test
        policy sequential
    }
}
`
			aOurs, aCore, _, _ := pair(t, corefile, true, "-forward-timeout", "3s")
			for i := range 3 {
				name := fmt.Sprintf("www%d.example.org.", i)
				o, c := askFull(t, aOurs, name, dns.TypeA), askFull(t, aCore, name, dns.TypeA)
				if o.String() != c.String() {
					t.Errorf("%s: ours %s, coredns %s", name, o, c)
				}
				if len(o.answer) != 1 || !strings.HasSuffix(o.answer[0], "\t"+tc.want) {
					t.Errorf("%s: %s, want %s", name, o, tc.want)
				}
			}
		})
	}
}

// TestForwardTLSAndPlainWithStockNodeCache: one forward with tls:// and
// plain targets, policy sequential, run by the stock node-cache (CoreDNS
// 1.13) and ours in network namespaces, each with a DNS-over-TLS server at
// 10.150.0.55 (answering 192.0.2.55; the node's resolver answers these
// names NXDOMAIN): the same answers, from the DoT server when it is first,
// from the plain one when a dead tls:// target (no route) is first.
func TestForwardTLSAndPlainWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock, ours := stockBinary(t), buildNodelocaldns(t)
	const dotIP, deadIP = "10.150.0.55", "10.150.0.56"
	certFile, keyFile, _ := testhost.Cert(t, t.TempDir(), "dns.example.test")
	ca, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	block := func(zone, first string) string {
		return zone + `:53 {
    errors
    bind 169.254.20.10 10.96.0.10
    forward . tls://` + first + " " + oracleNodeDNS + ` {
        tls /etc/dot-ca.pem
        tls_servername dns.example.test
        policy sequential
    }
}
`
	}
	corefile := referenceCorefile(t, false) + block("example.net", dotIP) + block("example.com", deadIP)
	var nss []string
	for range 2 {
		ns, in := oracleNamespace(t)
		mustRun(t, in("ip", "addr", "add", dotIP+"/32", "dev", "lo"))
		var l net.Listener
		if err := inNetns(ns, func() (err error) {
			l, err = net.Listen("tcp", dotIP+":853")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		s := &dns.Server{Listener: tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}}), Net: "tcp-tls",
			Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetReply(r)
				if r.Question[0].Qtype == dns.TypeA {
					rr, _ := dns.NewRR(r.Question[0].Name + " 300 IN A 192.0.2.55")
					m.Answer = append(m.Answer, rr)
				}
				_ = w.WriteMsg(m)
			})}
		go func() { _ = s.ActivateAndServe() }()
		t.Cleanup(func() { _ = s.Shutdown() })
		nss = append(nss, ns)
	}
	etc := map[string]string{"dot-ca.pem": string(ca)}
	for i, bin := range []string{stock, ours} {
		startReferenceCorefileEtc(t, nss[i], bin, corefile, etc, "-setupiptables=false")
	}
	for _, tc := range []struct{ name, want string }{
		{"www.example.net.", "192.0.2.55"}, // the DoT server, first
		{"www.example.com.", "NXDOMAIN"},   // the dead tls:// target, then the plain one
	} {
		for round := range 2 {
			var got [2]string
			for i, ns := range nss {
				m, err := exchange(ns, tc.name, dns.TypeA, variant{name: "udp", net: "udp"})
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				got[i] = dns.RcodeToString[m.Rcode]
				for _, rr := range m.Answer {
					got[i] += " " + rr.(*dns.A).A.String()
				}
			}
			if got[0] != got[1] {
				t.Errorf("%s (round %d): stock %s, ours %s", tc.name, round, got[0], got[1])
			}
			if !strings.Contains(got[1], tc.want) {
				t.Errorf("%s (round %d): %s, want %s", tc.name, round, got[1], tc.want)
			}
		}
	}
}

// TestForwardExceptAndNext: `except` for a zone without a block of its own
// answers its names SERVFAIL (CoreDNS: no plugin after forward), the rest
// forwarded; a zone with a block of its own is that block's; `next` with
// one forward per block returns the upstream's answer as it is. Compared
// with CoreDNS 1.15, misses and hits.
func TestForwardExceptAndNext(t *testing.T) {
	corefile := `corp.example:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[3]s
}
.:%[1]d {
    bind 127.0.0.1
    cache 30
    rewrite name exact www.moved.example www.example.org
    forward . %[2]s {
        except blocked.example corp.example www.example.org
        next NXDOMAIN SERVFAIL
    }
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true)
	for range 2 {
		for _, name := range []string{"www.blocked.example.", "blocked.example.", "a.corp.example.", "www.example.org.", "www.moved.example.", "nx.example.net.", "sf.example.net.", "www.example.net."} {
			o, c := askFull(t, aOurs, name, dns.TypeA), askFull(t, aCore, name, dns.TypeA)
			if o.String() != c.String() {
				t.Errorf("%s: ours %s, coredns %s", name, o, c)
			}
			if want := strings.Contains(name, "blocked") || strings.HasPrefix(name, "sf.") || strings.Contains(name, "www.") && !strings.HasSuffix(name, ".net."); want != (o.rcode == "SERVFAIL") {
				t.Errorf("%s: %s", name, o.rcode)
			}
		}
	}
}

// TestSeveralForwardsHandOn: a block with several forwards runs them in
// order, as CoreDNS 1.15 chains them: a name outside a forward's FROM, or
// under its except, goes on to the next forward; an answer whose rcode the
// forward's next lists, or a NODATA with next_on_nodata, is asked again of
// the next forward; the last forward's answer is returned as it is, its
// next notwithstanding; an rcode not listed is returned. Three upstreams
// that answer apart (the first and second differ in their A record, the
// third answers what the others deny), compared with CoreDNS 1.15, misses
// and hits, and each case checked for the upstream that must answer it.
func TestSeveralForwardsHandOn(t *testing.T) {
	third := serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case strings.HasPrefix(strings.ToLower(q.Name), "nxall."):
			m.Rcode = dns.RcodeNameError // no SOA: told apart from the others' NXDOMAIN
		case q.Qtype == dns.TypeAAAA:
			rr, _ := dns.NewRR(q.Name + " 300 IN AAAA 2001:db8::3")
			m.Answer = append(m.Answer, rr)
		default:
			rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.3")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	}))
	corefile := `.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . %[2]s {
        except skip.example
        next NXDOMAIN
        next_on_nodata
    }
    forward example.net %[3]s {
        next NXDOMAIN
    }
    forward . ` + third + ` {
        next NXDOMAIN
    }
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true) // the second forward's is kube-dns: a group of its own
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  string // the answer's A or AAAA address, or its rcode
	}{
		{"www.example.org.", dns.TypeA, "93.184.216.34"},  // the first forward's
		{"www.example.org.", dns.TypeAAAA, "2001:db8::3"}, // NODATA: on, past example.net's, to the third
		{"www.example.net.", dns.TypeAAAA, "NOERROR"},     // NODATA, on to example.net's, which returns it
		{"nx.example.net.", dns.TypeA, "192.0.2.3"},       // NXDOMAIN, NXDOMAIN again, the third answers
		{"nx.example.org.", dns.TypeA, "192.0.2.3"},       // NXDOMAIN, not example.net's: the third
		{"nxall.example.net.", dns.TypeA, "NXDOMAIN"},     // the last forward's NXDOMAIN, as it is
		{"sf.example.org.", dns.TypeA, "SERVFAIL"},        // SERVFAIL is not in next
		{"www.skip.example.", dns.TypeA, "192.0.2.3"},     // except: on, to the third
		{"skip.example.", dns.TypeA, "192.0.2.3"},
	} {
		for round := range 2 {
			o, c := askFull(t, aOurs, tc.name, tc.qtype), askFull(t, aCore, tc.name, tc.qtype)
			if o.String() != c.String() {
				t.Errorf("%s %s (round %d): ours %s, coredns %s", tc.name, dns.TypeToString[tc.qtype], round, o, c)
			}
			got := o.rcode
			if len(o.answer) > 0 {
				f := strings.Fields(o.answer[0])
				got = f[len(f)-1]
			}
			if got != tc.want {
				t.Errorf("%s %s (round %d): %s, want %s", tc.name, dns.TypeToString[tc.qtype], round, o, tc.want)
			}
		}
	}
}

// TestSeveralForwardsWithStockNodeCache: the stock node-cache (CoreDNS
// 1.13, which has next but not next_on_nodata) and ours run the reference
// Corefile with the "." block's forward made three, in network
// namespaces: the same answers, misses and hits, and each from the
// upstream CoreDNS's chaining picks (a third upstream, 10.150.0.54, answers
// apart from the node's resolver).
func TestSeveralForwardsWithStockNodeCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs two daemons")
	}
	stock, ours := stockBinary(t), buildNodelocaldns(t)
	const third = "10.150.0.54"
	corefile := referenceCorefile(t, false)
	fwd := "    forward . " + oracleNodeDNS + ` {
        except skip.example
        next NXDOMAIN
    }
    forward example.net ` + third + ` {
        next NXDOMAIN
    }
    forward . ` + third + ` {
        next NXDOMAIN
    }
`
	if !strings.Contains(corefile, "    forward . __PILLAR__UPSTREAM__SERVERS__\n") {
		t.Fatal("the reference Corefile's . forward moved")
	}
	corefile = strings.Replace(corefile, "    forward . __PILLAR__UPSTREAM__SERVERS__\n", fwd, 1)
	thirdHandler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case strings.HasPrefix(strings.ToLower(q.Name), "nxall."):
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.54")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	var nss []string
	for range 2 {
		ns, in := oracleNamespace(t)
		mustRun(t, in("ip", "addr", "add", third+"/32", "dev", "lo"))
		var pc net.PacketConn
		var l net.Listener
		if err := inNetns(ns, func() (err error) {
			if pc, err = net.ListenPacket("udp", third+":53"); err != nil {
				return err
			}
			l, err = net.Listen("tcp", third+":53")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for _, s := range []*dns.Server{{PacketConn: pc, Handler: thirdHandler}, {Listener: l, Handler: thirdHandler}} {
			go func() { _ = s.ActivateAndServe() }()
			t.Cleanup(func() { _ = s.Shutdown() })
		}
		nss = append(nss, ns)
	}
	startReferenceCorefile(t, nss[0], stock, corefile, "-setupiptables=false")
	startReferenceCorefile(t, nss[1], ours, corefile, "-setupiptables=false")
	show := func(m *dns.Msg) string {
		var rrs []string
		for _, rr := range append(append([]dns.RR{}, m.Answer...), m.Ns...) {
			rr.Header().Ttl = 0
			rrs = append(rrs, strings.ToLower(rr.String()))
		}
		return dns.RcodeToString[m.Rcode] + " " + strings.Join(rrs, " | ")
	}
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  string // in the answer shown
	}{
		{"www.example.org.", dns.TypeA, "93.184.216.34"},           // the first forward's
		{"www.example.org.", dns.TypeAAAA, "NOERROR "},             // NODATA: no next_on_nodata, returned
		{"nx.example.org.", dns.TypeA, "192.0.2.54"},               // NXDOMAIN: on, past example.net's, to the third
		{"nx.example.net.", dns.TypeA, "192.0.2.54"},               // NXDOMAIN: on to example.net's, which answers
		{"nxall.example.net.", dns.TypeA, "NXDOMAIN"},              // the last forward's NXDOMAIN, as it is
		{"www.skip.example.", dns.TypeA, "192.0.2.54"},             // except: on to the third
		{"web.default.svc.cluster.local.", dns.TypeA, "10.96.1.1"}, // another block, as before
	} {
		for round := range 2 {
			var got [2]string
			for i, ns := range nss {
				m, err := exchange(ns, tc.name, tc.qtype, variant{name: "udp", net: "udp"})
				if err != nil {
					t.Fatalf("%s %s: %v", tc.name, dns.TypeToString[tc.qtype], err)
				}
				got[i] = show(m)
			}
			if got[0] != got[1] {
				t.Errorf("%s %s (round %d): stock %s, ours %s", tc.name, dns.TypeToString[tc.qtype], round, got[0], got[1])
			}
			if !strings.Contains(got[1], tc.want) {
				t.Errorf("%s %s (round %d): %s, want %s", tc.name, dns.TypeToString[tc.qtype], round, got[1], tc.want)
			}
		}
	}
}

// TestMaxConcurrentRefusedAsCoreDNS: past a forward's max_concurrent the
// query is answered REFUSED, as CoreDNS 1.15 answers it (not SERVFAIL),
// and not cached: once the queries in flight end, the same name is
// answered.
func TestMaxConcurrentRefusedAsCoreDNS(t *testing.T) {
	slow := serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		time.Sleep(600 * time.Millisecond)
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 300 IN A 192.0.2.1")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	}))
	corefile := `.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . ` + slow + ` {
        max_concurrent 2
    }
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true)
	for _, a := range []string{aOurs, aCore} {
		rcodes := make(chan string, 6)
		for i := range 6 {
			go func() {
				if i > 0 {
					time.Sleep(100 * time.Millisecond) // the first two are in flight
				}
				m := new(dns.Msg)
				m.SetQuestion(fmt.Sprintf("q%d.mc.example.org.", min(i, 5)), dns.TypeA)
				r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, a)
				if err != nil {
					rcodes <- err.Error()
					return
				}
				rcodes <- dns.RcodeToString[r.Rcode]
			}()
		}
		got := map[string]int{}
		for range 6 {
			got[<-rcodes]++
		}
		if got["NOERROR"] != 2 || got["REFUSED"] != 4 {
			t.Errorf("%s: %v, want 2 NOERROR and 4 REFUSED", a, got)
		}
		// Not cached: asked again once the flights are over, answered.
		m := new(dns.Msg)
		m.SetQuestion("q5.mc.example.org.", dns.TypeA)
		if r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, a); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: after the flights: %v %v", a, r, err)
		}
	}
}

// TestForwardFailoverAndMaxConnectAttempts: `failover RCODE...` moves an
// answer with such an rcode on to the next upstream, and
// `max_connect_attempts N` caps the tries of one query, as CoreDNS 1.15
// (and the stock node-cache, which takes both): with sequential upstreams
// where the first answers badly, the answer is the second's, or the
// first's failure when the cap is one try.
func TestForwardFailoverAndMaxConnectAttempts(t *testing.T) {
	bad := func(rcode int) string {
		return serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetRcode(r, rcode)
			_ = w.WriteMsg(m)
		}))
	}
	good := serveDNS(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 300 IN A 192.0.2.7")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	}))
	nx, sf := bad(dns.RcodeNameError), bad(dns.RcodeServerFailure)
	dead := fmt.Sprintf("127.0.0.1:%d", testhost.FreePort(t, "127.0.0.1")) // nothing listens: refused at once
	for _, tc := range []struct {
		name, first, opts, want string
	}{
		{"nxdomain without failover", nx, "", "NXDOMAIN"},
		{"failover nxdomain", nx, "failover NXDOMAIN", "NOERROR"},
		{"failover servfail", sf, "failover SERVFAIL REFUSED", "NOERROR"},
		{"failover servfail one attempt", sf, "failover SERVFAIL\n        max_connect_attempts 1", "NOERROR"}, // an rcode's failover is no connect attempt
		{"dead first", dead, "", "NOERROR"},
		// max_fails 0: the dead one is never marked down (when each
		// marks it down differs), so every query tries it first.
		{"dead first one attempt", dead, "max_fails 0\n        max_connect_attempts 1", "SERVFAIL"},
		{"dead first two attempts", dead, "max_fails 0\n        max_connect_attempts 2", "NOERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			corefile := `.:%[1]d {
    bind 127.0.0.1
    forward . ` + tc.first + ` ` + good + ` {
        policy sequential
        ` + tc.opts + `
    }
}
`
			aOurs, aCore, _, _ := pair(t, corefile, true)
			for i := range 3 {
				name := fmt.Sprintf("f%d.example.org.", i)
				o, c := askFull(t, aOurs, name, dns.TypeA), askFull(t, aCore, name, dns.TypeA)
				if o.rcode != c.rcode || o.rcode != tc.want {
					t.Errorf("%s: ours %s, coredns %s, want %s", name, o, c, tc.want)
				}
			}
		})
	}
}
