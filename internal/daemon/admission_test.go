package daemon

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// silentFor answers like records, except that names starting with prefix
// are never answered (a resolver that drops them).
func silentFor(prefix string) func(*dns.Msg) *dns.Msg {
	return func(r *dns.Msg) *dns.Msg {
		if strings.HasPrefix(strings.ToLower(r.Question[0].Name), prefix) {
			return nil
		}
		return records(r)
	}
}

// TestStuckNameDoesNotStarveOthers (issue 18): 1,100 clients ask for one
// name the node resolver never answers. They are one question upstream, so
// they take one flight; other clients' misses, cluster and external, are
// answered while it is stuck. (Before admission counted flights, the
// waiters took all 1,024 slots and every other miss got SERVFAIL.) The
// clients are pods (inPodNetns): from loopback they would all be the node,
// whose part of the waiting bound is an eighth, and 40 newcomers at once
// more than its newcomers' part (package fair: from loopback, run alone,
// some of the 40 got SERVFAIL in 5 runs of 6).
func TestStuckNameDoesNotStarveOthers(t *testing.T) {
	if !inPodNetns(t, "TestStuckNameDoesNotStarveOthers") {
		return
	}
	kube := startUpstream(t, silentFor("stuck"))
	node := startUpstream(t, silentFor("stuck"))
	e := start(t, func(c *config.Config) {
		c.KubeDNS = kube.addr
		c.Nameservers = []netip.AddrPort{node.addr}
		c.ForwardTimeout = 3 * time.Second
	})
	e.kube, e.node = kube, node

	// The flood: 1,100 queries for the stuck name from 50 sockets, not
	// read until the end.
	const flood, sockets = 1100, 50
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for s := 0; s < sockets; s++ {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(fmt.Sprintf("10.99.2.%d", s+1))}}
		c, err := d.Dial("udp", e.udp)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i := 0; i < flood; i++ {
		m := new(dns.Msg)
		m.SetQuestion("stuck.example.com.", dns.TypeA)
		m.Id = uint16(i)
		b, _ := m.Pack()
		if _, err := conns[i%sockets].Write(b); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the flood has reached the server (every query counted)
	// and is stuck upstream.
	for deadline := time.Now().Add(5 * time.Second); e.d.Server.Snapshot().RequestsUDP < flood; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of the flood arrived", e.d.Server.Snapshot().RequestsUDP)
		}
	}

	// Other clients, other names, cluster and external, while it is stuck.
	var names []string
	for i := 0; i < 20; i++ {
		names = append(names, fmt.Sprintf("svc%d.default.svc.cluster.local.", i), fmt.Sprintf("other%d.example.com.", i))
	}
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			pod := &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(fmt.Sprintf("10.99.3.%d", i+1))}}
			r, _, err := (&dns.Client{Timeout: 2 * time.Second, Dialer: pod}).Exchange(m, e.udp)
			switch {
			case err != nil:
				errs <- fmt.Errorf("%s: %v", name, err)
			case r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != wantA(name):
				errs <- fmt.Errorf("%s: %s %v", name, dns.RcodeToString[r.Rcode], r.Answer)
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		failed++
		t.Error(err)
	}
	if failed > 0 {
		t.Fatalf("%d of %d other clients failed while one name was stuck", failed, len(names))
	}
	if took := time.Since(began); took >= 3*time.Second {
		t.Fatalf("other clients answered after %v: they waited for the stuck name", took)
	}
	// Coalesced: one question upstream (the forwarder may try it twice).
	node.mu.Lock()
	stuck := 0
	for _, n := range node.names {
		if strings.HasPrefix(strings.ToLower(n), "stuck") {
			stuck++
		}
	}
	node.mu.Unlock()
	if stuck > 2 {
		t.Fatalf("the stuck name was sent upstream %d times", stuck)
	}
}
