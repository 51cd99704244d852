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
		c.DropIn.NodeCacheMetricsAddr = "127.0.0.1:0"
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

// startCorefile starts a daemon whose routes come from the Corefile text
// (written to conf), as config.Parse maps it.
func startCorefile(t *testing.T, conf, text string) *env {
	t.Helper()
	dir := filepath.Dir(conf)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parsed, err := config.Parse([]string{"-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm", "",
		"-localip", "127.0.0.1", "-kube-dns", "127.0.0.1:9", "-resolv-conf", rc}, config.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, func(c *config.Config) {
		c.KubeDNS = parsed.KubeDNS
		c.DropIn = parsed.DropIn
		c.DropIn.NodeCacheMetricsAddr = "127.0.0.1:0"
	})
}

func corpCorefile(u *upstream) string {
	return fmt.Sprintf("corp.example:53 {\n  bind 127.0.0.1\n  forward . %s\n}\n.:53 {\n  bind 127.0.0.1\n  forward . /etc/resolv.conf\n}\n", u.addr)
}

// A Corefile edit reroutes within 2 s; an invalid edit keeps the last good
// routes, is counted once, and a fix is applied again.
func TestCorefileChangeAppliedInvalidKept(t *testing.T) {
	a := startUpstream(t, answerA("10.0.0.1"))
	b := startUpstream(t, answerA("10.0.0.2"))
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, corpCorefile(a))
	if got := e.firstA(t, "x.corp.example."); got != "10.0.0.1" {
		t.Fatalf("before: %s", got)
	}
	errs := e.setupErrors(t)
	writeAtomic(t, conf, corpCorefile(b))
	took := e.eventually(t, "b", "corp.example.", "10.0.0.2")
	t.Logf("Corefile change applied in %v", took)

	writeAtomic(t, conf, corpCorefile(a)+"\nbroken {\n  kubernetes\n}\n")
	e.waitSetupErrors(t, errs+1)
	if got := e.firstA(t, "y.corp.example."); got != "10.0.0.2" {
		t.Fatalf("invalid Corefile changed routing: %s", got)
	}
	writeAtomic(t, conf, corpCorefile(a))
	e.eventually(t, "c", "corp.example.", "10.0.0.1")
	if got := e.setupErrors(t); got != errs+1 {
		t.Fatalf("setup errors %d, want %d (counted once)", got, errs+1)
	}
}

// writeAtomic replaces a file by rename, as editors and the kubelet do.
func writeAtomic(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A Corefile edit that changes the views together with the listen
// addresses (here: the same zone on a new bind with another upstream) is
// refused whole until a restart: logged once, counted, the running routes
// kept; a later edit without it applies. (An edit of the views on the
// running addresses applies: test/dropin's TestReferenceManifestInNamespace
// and TestViewsReload.)
func TestCorefileViewAndBindChangeRefused(t *testing.T) {
	a := startUpstream(t, answerA("10.0.0.1"))
	b := startUpstream(t, answerA("10.0.0.2"))
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, corpCorefile(a))
	errs := e.setupErrors(t)
	views := corpCorefile(b) + fmt.Sprintf("corp.example:53 {\n  bind 127.0.0.3\n  forward . %s\n}\n", a.addr)
	writeAtomic(t, conf, views)
	e.waitSetupErrors(t, errs+1)
	if got := e.firstA(t, "y.corp.example."); got != "10.0.0.1" {
		t.Fatalf("a refused edit changed routing: %s", got)
	}
	writeAtomic(t, conf, corpCorefile(b))
	e.eventually(t, "c", "corp.example.", "10.0.0.2")
	if got := e.setupErrors(t); got != errs+1 {
		t.Fatalf("setup errors %d, want %d (counted once)", got, errs+1)
	}
}

// A block with several forwards hands a name on as CoreDNS does (here the
// first forward's NXDOMAIN, with next NXDOMAIN, to the second), and an
// edit of the further forward applies on reload: the names it answered
// are dropped from the cache with the old chain, and asked of the new
// target.
func TestCorefileSeveralForwardsReload(t *testing.T) {
	nx := startUpstream(t, func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		return m
	})
	b := startUpstream(t, answerA("10.0.0.2"))
	c := startUpstream(t, answerA("10.0.0.3"))
	text := func(u *upstream) string {
		return fmt.Sprintf("example.org:53 {\n  bind 127.0.0.1\n  cache 30\n  forward . %s {\n    next NXDOMAIN\n  }\n  forward . %s\n}\n"+
			".:53 {\n  bind 127.0.0.1\n  forward . /etc/resolv.conf\n}\n", nx.addr, u.addr)
	}
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, text(b))
	if got := e.firstA(t, "x.example.org."); got != "10.0.0.2" {
		t.Fatalf("before: %s", got)
	}
	if nx.count() != 1 || b.count() != 1 {
		t.Fatalf("asked the first %d times, the second %d, want once each", nx.count(), b.count())
	}
	writeAtomic(t, conf, text(c))
	e.eventually(t, "c", "example.org.", "10.0.0.3")
	if got := e.firstA(t, "x.example.org."); got != "10.0.0.3" {
		t.Fatalf("x.example.org. after the edit: %s, cached from the old second forward", got)
	}
}
