package daemon

import (
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// A "." block forwarding to kube-dns (kops' forwardToKubeDNS, Gardener's
// disableForwardToUpstreamDNS) sends every name there, over the kube-dns
// group's TCP, as the stock does; an edit back to the node's resolvers
// (and forth again) applies within 2 s.
func TestCorefileRootToKubeDNS(t *testing.T) {
	kube := startUpstream(t, answerA("10.96.7.7"))
	node := startUpstream(t, answerA("10.150.7.7"))
	text := func(root string) string {
		return fmt.Sprintf("cluster.local:53 {\n  cache 30\n  bind 127.0.0.1\n  forward . %s {\n    force_tcp\n  }\n}\n"+
			".:53 {\n  cache 30\n  bind 127.0.0.1\n  forward . %s\n}\n", kube.addr, root)
	}
	dir := t.TempDir()
	conf, rc := filepath.Join(dir, "Corefile"), filepath.Join(dir, "resolv.conf")
	writeAtomic(t, conf, text(kube.addr.String()))
	writeAtomic(t, rc, "nameserver 127.0.0.2\n")
	parsed, err := config.Parse([]string{"-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm", "",
		"-localip", "127.0.0.1", "-kube-dns", kube.addr.String(), "-resolv-conf", rc}, config.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, func(c *config.Config) {
		c.KubeDNS = parsed.KubeDNS
		c.DropIn = parsed.DropIn
		c.DropIn.NodeCacheMetricsAddr = "127.0.0.1:0"
	})
	before := kube.tcpN.Load()
	if got := e.firstA(t, "www.example.org."); got != "10.96.7.7" {
		t.Fatalf("www.example.org. answered %s, want kube-dns' 10.96.7.7", got)
	}
	if kube.tcpN.Load() != before+1 || node.count() != 0 {
		t.Errorf("kube-dns asked over TCP %d times, the node's resolver %d: want once and never", kube.tcpN.Load()-before, node.count())
	}
	if r := e.ask(t, "4.3.2.1.in-addr.arpa.", dns.TypePTR, false, "udp"); r.Rcode == dns.RcodeServerFailure {
		t.Errorf("a reverse name: SERVFAIL")
	}
	writeAtomic(t, conf, text(node.addr.String()))
	e.eventually(t, "n", "example.org.", "10.150.7.7")
	writeAtomic(t, conf, text(kube.addr.String()))
	e.eventually(t, "k", "example.org.", "10.96.7.7")
}
