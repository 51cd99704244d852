package daemon

import (
	"fmt"
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
