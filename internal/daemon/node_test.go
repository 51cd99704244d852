package daemon

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// nodeAddr is the node listener's bound address (the last of the
// server's, -node-listen's being the last sockets).
func (e *env) nodeAddr(t *testing.T) string {
	t.Helper()
	as := e.d.Server.UDPAddrs()
	if len(as) < 2 {
		t.Fatalf("no node listener among %v", as)
	}
	return as[len(as)-1].String()
}

// askAt asks name (type A) at addr over UDP.
func askAt(t *testing.T, addr, name string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	c := &dns.Client{Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s at %s: %v", name, addr, err)
	}
	return r
}

func firstAAt(t *testing.T, addr, name string) string {
	t.Helper()
	r := askAt(t, addr, name)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("%s at %s: %s, %d answers", name, addr, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	return r.Answer[0].(*dns.A).A.String()
}

// TestNodeListenerAsksOnlyTheNodeResolvers: -node-listen's address sends
// every name, the cluster domain's too, to resolv.conf's servers, even
// while the kube-dns ConfigMap's upstreamNameservers replace them for the
// pods; never to kube-dns or a stub domain. Its answers are cached apart
// from the pods' (the same name is asked again for it), and a repeat is
// answered from the cache.
func TestNodeListenerAsksOnlyTheNodeResolvers(t *testing.T) {
	ups := startUpstream(t, answerA("10.0.0.2")) // upstreamNameservers
	stub := startUpstream(t, answerA("10.0.0.3"))
	cm := t.TempDir()
	kubeletWrite(t, cm, map[string]string{
		config.KeyUpstreamNameservers: fmt.Sprintf("[%q]", ups.addr),
		config.KeyStubDomains:         fmt.Sprintf(`{"stub.example": [%q]}`, stub.addr),
	})
	e := start(t, func(c *config.Config) {
		c.KubeDNSConfigMap = cm
		c.Node.Listen = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	})
	node := e.nodeAddr(t)

	// The pods' address: upstreamNameservers, the stub, kube-dns.
	if got := e.firstA(t, "a.example.com."); got != "10.0.0.2" {
		t.Fatalf("pods, external: %s", got)
	}
	if got := e.firstA(t, "www.stub.example."); got != "10.0.0.3" {
		t.Fatalf("pods, stub: %s", got)
	}
	before := [3]int64{e.kube.count(), stub.count(), ups.count()}

	// The node's: resolv.conf's servers for all of them.
	for _, name := range []string{"a.example.com.", "www.stub.example.", "svc.default.svc.cluster.local.", "1.0.0.10.in-addr.arpa."} {
		r := askAt(t, node, name)
		if r.Rcode != dns.RcodeSuccess {
			t.Fatalf("node, %s: %s", name, dns.RcodeToString[r.Rcode])
		}
		if name != "1.0.0.10.in-addr.arpa." {
			if got := r.Answer[0].(*dns.A).A.String(); got != wantA(name) {
				t.Fatalf("node, %s: %s, want the node resolver's %s", name, got, wantA(name))
			}
		}
	}
	if after := [3]int64{e.kube.count(), stub.count(), ups.count()}; after != before {
		t.Fatalf("the node listener asked kube-dns, the stub or upstreamNameservers: %v -> %v", before, after)
	}
	asked := e.node.count()
	if asked != 4 {
		t.Fatalf("node resolvers asked %d times for 4 names", asked)
	}
	// Cached: the repeat asks nobody.
	for _, name := range []string{"a.example.com.", "svc.default.svc.cluster.local."} {
		if got := firstAAt(t, node, name); got != wantA(name) {
			t.Fatalf("node, %s again: %s", name, got)
		}
	}
	if n := e.node.count(); n != asked {
		t.Fatalf("a repeat went upstream: %d -> %d", asked, n)
	}
	if e.d.run.NodeGroupFor("svc.default.svc.cluster.local.") == e.d.run.KubeGroup() {
		t.Fatal("the node listener's table routes the cluster domain to kube-dns")
	}
}

// TestNodeListenerFollowsResolvConfAlone: without upstreamNameservers the
// node listener shares the pods' "." group; when they appear it gets one
// of its own for resolv.conf's servers, and the shared one again when they
// go.
func TestNodeListenerFollowsResolvConfAlone(t *testing.T) {
	ups := startUpstream(t, answerA("10.0.0.2"))
	cm := t.TempDir()
	e := start(t, func(c *config.Config) {
		c.KubeDNSConfigMap = cm
		c.Node.Listen = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	})
	node := e.nodeAddr(t)
	if e.d.run.NodeGroupFor("x.example.") != e.d.run.GroupFor("x.example.") {
		t.Fatal("without upstreamNameservers the node listener should share the pods' group")
	}
	kubeletWrite(t, cm, map[string]string{config.KeyUpstreamNameservers: fmt.Sprintf("[%q]", ups.addr)})
	e.eventually(t, "b", "example.com.", "10.0.0.2")
	if e.d.run.NodeGroupFor("x.example.") == e.d.run.GroupFor("x.example.") {
		t.Fatal("with upstreamNameservers the node listener shares the pods' group")
	}
	for i := range 3 {
		name := fmt.Sprintf("n%d.example.com.", i)
		if got := firstAAt(t, node, name); got != wantA(name) {
			t.Fatalf("node listener under upstreamNameservers: %s -> %s", name, got)
		}
	}
	kubeletWrite(t, cm, map[string]string{"federations": "{}"})
	deadline := time.Now().Add(3 * time.Second)
	for e.d.run.NodeGroupFor("x.example.") != e.d.run.GroupFor("x.example.") {
		if time.Now().After(deadline) {
			t.Fatal("the node listener kept a group of its own after upstreamNameservers went")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExternalToKubeDNS: -external-upstream=kube-dns sends the pods'
// every name to kube-dns (the ConfigMap's stub domains still to theirs);
// the node listener keeps the node's resolvers.
func TestExternalToKubeDNS(t *testing.T) {
	stub := startUpstream(t, answerA("10.0.0.3"))
	cm := t.TempDir()
	kubeletWrite(t, cm, map[string]string{config.KeyStubDomains: fmt.Sprintf(`{"stub.example": [%q]}`, stub.addr)})
	e := start(t, func(c *config.Config) {
		c.KubeDNSConfigMap = cm
		c.Node.ExternalToKubeDNS = true
		c.Node.Listen = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	})
	for _, name := range []string{"a.example.com.", "svc.default.svc.cluster.local.", "b.example.org."} {
		if got := e.firstA(t, name); got != wantA(name) {
			t.Fatalf("%s: %s", name, got)
		}
	}
	if k, n := e.kube.count(), e.node.count(); k != 3 || n != 0 {
		t.Fatalf("pods' names: kube-dns asked %d times, node resolvers %d; want 3 and 0", k, n)
	}
	if got := e.firstA(t, "www.stub.example."); got != "10.0.0.3" {
		t.Fatalf("stub domain: %s", got)
	}
	if got := firstAAt(t, e.nodeAddr(t), "c.example.com."); got != wantA("c.example.com.") || e.node.count() != 1 || e.kube.count() != 3 {
		t.Fatalf("node listener: %s, node resolvers %d, kube-dns %d", got, e.node.count(), e.kube.count())
	}
}
