package daemon

import (
	"fmt"
	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func cacheCorefile(u *upstream, corpCache string) string {
	return fmt.Sprintf("corp.example:53 {\n  bind 127.0.0.1\n  cache %s\n  forward . %s\n}\n.:53 {\n  bind 127.0.0.1\n  cache 30\n  forward . /etc/resolv.conf\n}\n", corpCache, u.addr)
}

// firstTTL asks name over UDP and returns its first answer's TTL.
func (e *env) firstTTL(t *testing.T, name string) uint32 {
	t.Helper()
	m := e.ask(t, name, dns.TypeA, false, "udp")
	if len(m.Answer) == 0 {
		t.Fatalf("%s: no answer: %v", name, m)
	}
	return m.Answer[0].Header().Ttl
}

// A block's cache TTL caps the names of its zone, not the "." block's; an
// edit of the block's cache applies within 2 s, without a restart.
func TestCorefileBlockCachePolicy(t *testing.T) {
	corp := startUpstream(t, answerA("10.0.0.1"))
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, cacheCorefile(corp, "10"))
	if got := e.firstTTL(t, "a.corp.example."); got != 10 {
		t.Fatalf("corp.example with cache 10: TTL %d", got)
	}
	writeAtomic(t, conf, cacheCorefile(corp, "20"))
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; ; i++ {
		if got := e.firstTTL(t, fmt.Sprintf("b%d.corp.example.", i)); got == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cache 20 not applied 2 s after the edit")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := corp.count()
	e.firstTTL(t, "b0.corp.example.")
	if corp.count() != before {
		t.Fatal("a cached name was asked again")
	}
}

// startCorefileCM is startCorefile with a kube-dns ConfigMap directory.
func startCorefileCM(t *testing.T, conf, text, cm string) *env {
	t.Helper()
	dir := filepath.Dir(conf)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parsed, err := config.Parse([]string{"-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm", cm,
		"-localip", "127.0.0.1", "-kube-dns", "127.0.0.1:9", "-resolv-conf", rc}, config.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, func(c *config.Config) {
		c.KubeDNS = parsed.KubeDNS
		c.DropIn = parsed.DropIn
		c.DropIn.NodeCacheMetricsAddr = "127.0.0.1:0"
		c.KubeDNSConfigMap = cm
		c.Nameservers, c.ResolvConf = parsed.Nameservers, parsed.ResolvConf
	})
}

// The "." block's literal targets stay when the ConfigMap names
// upstreamNameservers (as stock); a stub domain that duplicates a Corefile
// block is refused like stock's failed reload: last good kept, counted once.
func TestCorefileRootLiteralAndStubConflict(t *testing.T) {
	node := startUpstream(t, answerA("10.0.0.1"))
	other := startUpstream(t, answerA("10.0.0.2"))
	corp := startUpstream(t, answerA("10.0.0.3"))
	stub := startUpstream(t, answerA("10.0.0.4"))
	dir := t.TempDir()
	cm := filepath.Join(dir, "kube-dns")
	if err := os.MkdirAll(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeletWrite(t, cm, map[string]string{config.KeyUpstreamNameservers: fmt.Sprintf(`[%q]`, other.addr.Addr())})
	text := fmt.Sprintf("corp.example:53 {\n  bind 127.0.0.1\n  forward . %s\n}\n.:53 {\n  bind 127.0.0.1\n  forward . %s\n}\n", corp.addr, node.addr)
	e := startCorefileCM(t, filepath.Join(dir, "Corefile"), text, cm)
	if got := e.firstA(t, "www.example.org."); got != "10.0.0.1" {
		t.Fatalf("upstreamNameservers replaced the . block's literal target: %s", got)
	}
	errs := e.setupErrors(t)
	kubeletWrite(t, cm, stubs("corp.example", stub))
	e.waitSetupErrors(t, errs+1)
	if got := e.firstA(t, "a.corp.example."); got != "10.0.0.3" {
		t.Fatalf("a stub duplicating a block was routed: %s", got)
	}
	kubeletWrite(t, cm, stubs("acme.example", stub))
	e.eventually(t, "s", "acme.example.", "10.0.0.4")
	if got := e.setupErrors(t); got != errs+1 {
		t.Fatalf("setup errors %d, want %d", got, errs+1)
	}
}
