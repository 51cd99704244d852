package dropin

import (
	"crypto/tls"
	"fmt"
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

// TestForwardTLSToCoreDNS: `forward . tls://ADDR { tls CA; tls_servername
// NAME }` asks a real DNS-over-TLS server (CoreDNS 1.15 serving tls://
// with the tls directive, in front of the stand-in upstream) with the
// server's certificate checked: nodelocaldns answers as CoreDNS does; with
// a server name the certificate does not hold, both answer SERVFAIL.
func TestForwardTLSToCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
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
	for _, tc := range []struct {
		server, want string
	}{{"dns.example.test", "NOERROR"}, {"other.example.test", "SERVFAIL"}} {
		t.Run(tc.server, func(t *testing.T) {
			corefile := `.:%[1]d {
    bind 127.0.0.1
    cache 30
    forward . tls://` + dot + ` {
        tls ` + certFile + `
        tls_servername ` + tc.server + `
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
