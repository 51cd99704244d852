package daemon

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// TestOneBlockLookupPerQuery: a query's block is looked up once, when it
// arrives, and rides with it: a hit, a miss that goes upstream without
// blocking, a miss whose block runs directives (hosts answering, and
// hosts falling through to the block's forward: the chain's end), a miss
// with a stale entry (the blocking path), each look it up exactly once
// (an instrumented matcher: every lookup of a query's block goes through
// it).
func TestOneBlockLookupPerQuery(t *testing.T) {
	corp := startUpstream(t, records)
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	text := fmt.Sprintf("hosts.example:53 {\n  cache 30\n  bind 127.0.0.1\n  hosts {\n    192.0.2.9 h.hosts.example\n    fallthrough\n  }\n  forward . %s\n}\n"+
		".:53 {\n  cache 30 {\n    serve_stale 1h\n  }\n  bind 127.0.0.1\n  forward . 127.0.0.1:9\n}\n", corp.addr)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parsed, err := config.Parse([]string{"-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm", "",
		"-localip", "127.0.0.1", "-kube-dns", corp.addr.String(), "-resolv-conf", rc}, config.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, func(c *config.Config) {
		c.KubeDNS = parsed.KubeDNS
		c.DropIn = parsed.DropIn
		c.DropIn.NodeCacheMetricsAddr = "127.0.0.1:0"
	})
	var n atomic.Int64
	e.d.run.CountLookupsForTest(&n)
	defer e.d.run.CountLookupsForTest(nil)
	for _, c := range []struct {
		what, name, network string
		advance             time.Duration // the clock moves first
	}{
		{"a miss", "www.example.org.", "udp", 0},
		{"a hit", "www.example.org.", "udp", 0},
		{"a hit over TCP", "www.example.org.", "tcp", 0},
		{"a miss over TCP", "tcp.example.org.", "tcp", 0},
		{"a miss whose block's hosts answers", "h.hosts.example.", "udp", 0},
		{"a miss whose block's hosts falls through to its forward", "x.hosts.example.", "udp", 0},
		{"a miss with a stale entry (the blocking path)", "www.example.org.", "udp", 31 * time.Second},
	} {
		e.clock.Advance(c.advance)
		before := n.Load()
		if r := e.ask(t, c.name, dns.TypeA, false, c.network); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Fatalf("%s: %v", c.what, r)
		}
		time.Sleep(20 * time.Millisecond) // a stale answer's refresh finishes behind it
		if got := n.Load() - before; got != 1 {
			t.Errorf("%s (%s over %s): %d lookups of its block, want 1", c.what, c.name, c.network, got)
		}
	}
}
