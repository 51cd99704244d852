package daemon

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// askAll asks names over UDP, 16 at a time, and fails on any answer that
// is not NOERROR.
func askAll(t *testing.T, addr string, names []string) {
	t.Helper()
	var wg sync.WaitGroup
	ch := make(chan string)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Timeout: 3 * time.Second}
			for n := range ch {
				m := new(dns.Msg)
				m.SetQuestion(n, dns.TypeA)
				r, _, err := c.Exchange(m, addr)
				if err != nil || r.Rcode != dns.RcodeSuccess {
					t.Errorf("%s: %v %v", n, r, err)
				}
			}
		}()
	}
	for _, n := range names {
		ch <- n
	}
	close(ch)
	wg.Wait()
}

// TestCacheGoesWithTheSockets: a rollout's new instance takes the old
// one's cache with its sockets: after the old one exits, asking the 10,000
// names it had cached again sends at most 1% of them upstream (those the
// old one had evicted: it holds 9,984 answers); entries whose policy the
// new configuration changed are dropped.
func TestCacheGoesWithTheSockets(t *testing.T) {
	node := startUpstream(t, records)
	twin, ip, port, pidns := twins(t, node.addr)
	mk := func() *config.Config {
		c := twin()
		c.Cache.SuccessTTL = 5 * time.Minute
		return c
	}
	addr := netip.AddrPortFrom(ip, uint16(port)).String()
	names := make([]string, 10000)
	for i := range names {
		names[i] = fmt.Sprintf("warm%d.example.com.", i)
	}
	const pidA, pidB, pidC = 5000011, 5000012, 5000013
	_, logsA, stopA := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidA))
	askAll(t, addr, names)
	before := node.udpN.Load() + node.tcpN.Load()
	if before < int64(len(names)) {
		t.Fatalf("the upstream saw %d queries for %d names", before, len(names))
	}

	b, logsB, stopB := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidB))
	if !strings.Contains(logsB.String(), "took the twin's cache") {
		t.Fatalf("B did not take A's cache:\n%s\n%s", logsB, logsA)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	askAll(t, addr, names)
	sent := node.udpN.Load() + node.tcpN.Load() - before
	t.Logf("after the handover: %d of %d names asked upstream again\n%s", sent, len(names), logsB)
	if sent > int64(len(names))/100 {
		t.Fatalf("%d of %d names went upstream after the handover, want at most 1%%", sent, len(names))
	}

	// A twin whose configuration changed the policy of the names (another
	// TTL cap) drops them and fetches them afresh.
	changed := mk()
	changed.Cache.SuccessTTL = 4 * time.Minute
	_, logsC, _ := startDaemon(t, changed, fmt.Sprintf("%d-%d", pidns, pidC))
	if !strings.Contains(logsC.String(), "kept=0 policy_changed=99") {
		t.Fatalf("C kept entries whose policy changed:\n%s", logsC)
	}
	_ = b
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
}
