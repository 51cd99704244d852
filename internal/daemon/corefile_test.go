package daemon

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// A Corefile's blocks route as CoreDNS would: every zone whose forward
// targets the cluster DNS goes to kube-dns whatever its name, another
// forward block gets its own group (TCP with force_tcp), the rest goes to
// the "." block's servers, and a zone no block names (here the reverse
// zones) is not sent to kube-dns.
func TestCorefileRoutes(t *testing.T) {
	kube := startUpstream(t, records)
	corp := startUpstream(t, answerA("10.9.9.9"))
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	text := fmt.Sprintf("cluster.local:53 example.internal:53 {\n  cache 30\n  bind 127.0.0.1\n  forward . %s {\n    force_tcp\n  }\n}\n"+
		"corp.example:53 {\n  bind 127.0.0.1\n  forward . %s {\n    force_tcp\n  }\n}\n"+
		".:53 {\n  cache 30\n  bind 127.0.0.1\n  forward . 127.0.0.1:9\n}\n", kube.addr, corp.addr)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parsed, err := config.Parse([]string{"-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm", "",
		"-localip", "127.0.0.1", "-kube-dns", kube.addr.String(), "-resolv-conf", rc}, config.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(parsed.DropIn.KubeDNSZones, []string{"cluster.local.", "example.internal."}) {
		t.Fatalf("kube-dns zones %v", parsed.DropIn.KubeDNSZones)
	}
	e := start(t, func(c *config.Config) {
		c.KubeDNS = parsed.KubeDNS
		c.DropIn = parsed.DropIn
	})
	e.kube = kube
	for _, tc := range []struct {
		name string
		up   *upstream
		tcp  bool
	}{
		{"a.default.svc.cluster.local.", kube, true},
		{"www.example.internal.", kube, true},
		{"host.corp.example.", corp, true},
		{"www.example.org.", e.node, false},
		{"4.3.2.1.in-addr.arpa.", e.node, false},
	} {
		before, beforeTCP := tc.up.count(), tc.up.tcpN.Load()
		m := e.ask(t, tc.name, dns.TypeA, false, "udp")
		if m.Rcode == dns.RcodeServerFailure {
			t.Fatalf("%s: SERVFAIL", tc.name)
		}
		if tc.up.count() != before+1 {
			t.Errorf("%s: did not reach its upstream", tc.name)
		}
		if tc.tcp && tc.up.tcpN.Load() != beforeTCP+1 {
			t.Errorf("%s: not asked over TCP", tc.name)
		}
	}
}
