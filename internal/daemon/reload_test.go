package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/config/configmaptest"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
)

// answerA answers every A question with ip (TTL 300: only a cache drop or
// a new name shows a change).
func answerA(ip string) func(r *dns.Msg) *dns.Msg {
	return func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 300 IN A " + ip)
			m.Answer = append(m.Answer, rr)
		}
		return m
	}
}

// kubeletWrite updates a ConfigMap volume as the kubelet does.
func kubeletWrite(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	configmaptest.Write(t, dir, files)
}

func stubs(zone string, u *upstream) map[string]string {
	return map[string]string{config.KeyStubDomains: fmt.Sprintf(`{%q: [%q]}`, zone, u.addr)}
}

// firstA asks name and returns the first A record's address, failing on
// anything but NOERROR with an A record.
func (e *env) firstA(t *testing.T, name string) string {
	t.Helper()
	r := e.ask(t, name, dns.TypeA, false, "udp")
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("%s: rcode %s, %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	return r.Answer[0].(*dns.A).A.String()
}

// eventually polls fresh names (prefix + counter) until one is answered
// with want, for at most 2 s, and returns how long it took.
func (e *env) eventually(t *testing.T, prefix, zone, want string) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		got := e.firstA(t, fmt.Sprintf("%s%d.%s", prefix, i, zone))
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s: still answered %s, want %s, 2s after the change", zone, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setupErrors reads nodelocaldns_setup_errors_total{type="configmap"} from
// the daemon's registry (what /metrics serves).
func (e *env) setupErrors(t *testing.T) int {
	t.Helper()
	return e.setupErrorsOf(t, "configmap")
}

// setupErrorsOf reads nodelocaldns_setup_errors_total{type=kind}.
func (e *env) setupErrorsOf(t *testing.T, kind string) int {
	t.Helper()
	mfs, err := e.d.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "nodelocaldns_setup_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" && l.GetValue() == kind {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	t.Fatalf("no %s setup error counter", kind)
	return 0
}

func (e *env) waitSetupErrors(t *testing.T, want int) {
	t.Helper()
	e.waitSetupErrorsOf(t, "configmap", want)
}

func (e *env) waitSetupErrorsOf(t *testing.T, kind string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // against a hang; the count is the point
	for {
		got := e.setupErrorsOf(t, kind)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s setup errors %d, want %d", kind, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The check: a ConfigMap directory updated the way the kubelet does
// it reroutes a stub domain within 2 s, under load, with zero failed
// queries, and entries of other zones stay cached.
func TestConfigMapSwapReroutesStubUnderLoad(t *testing.T) {
	// The old upstream is slow, so queries are out on it at the change.
	slow := answerA("10.0.0.1")
	a := startUpstream(t, func(r *dns.Msg) *dns.Msg { time.Sleep(50 * time.Millisecond); return slow(r) })
	b := startUpstream(t, answerA("10.0.0.2"))
	cm := t.TempDir()
	kubeletWrite(t, cm, stubs("stub.example", a))
	e := start(t, func(c *config.Config) { c.KubeDNSConfigMap = cm })

	if got := e.firstA(t, "x.stub.example."); got != "10.0.0.1" {
		t.Fatalf("before the change: %s", got)
	}
	e.ask(t, "keep.example.com.", dns.TypeA, false, "udp") // cached, node group
	e.ask(t, "svc.default.svc.cluster.local.", dns.TypeA, false, "udp")
	node, kube := e.node.count(), e.kube.count()
	oldGroup := e.d.run.GroupFor("x.stub.example.")

	// 200 q/s for 4 s, half of them x.stub.example. (served from the cache
	// until the change drops it), half a fresh name each (always upstream).
	const total, every, swapAt = 800, 5 * time.Millisecond, 300
	type result struct {
		sent time.Time
		name string
		ip   string
		err  error
	}
	results := make([]result, total)
	var wg sync.WaitGroup
	var swapped time.Time
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := range total {
		<-tick.C
		if i == swapAt {
			kubeletWrite(t, cm, stubs("stub.example", b))
			swapped = time.Now()
		}
		name := "x.stub.example."
		if i%2 == 1 {
			name = fmt.Sprintf("q%d.stub.example.", i)
		}
		results[i] = result{sent: time.Now(), name: name}
		wg.Add(1)
		go func(res *result) {
			defer wg.Done()
			m := new(dns.Msg)
			m.SetQuestion(res.name, dns.TypeA)
			c := &dns.Client{Net: "udp", Timeout: 4 * time.Second}
			r, _, err := c.Exchange(m, e.udp)
			switch {
			case err != nil:
				res.err = err
			case r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1:
				res.err = fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
			default:
				res.ip = r.Answer[0].(*dns.A).A.String()
			}
		}(&results[i])
	}
	wg.Wait()

	failed, lastA := 0, time.Duration(-1)
	for i, r := range results {
		if r.err != nil {
			failed++
			t.Errorf("query %d %s: %v", i, r.name, r.err)
			continue
		}
		since := r.sent.Sub(swapped)
		switch {
		case r.ip == "10.0.0.1":
			lastA = max(lastA, since)
			if since > 2*time.Second {
				t.Errorf("query %d %s sent %v after the change answered by the old upstream", i, r.name, since)
			}
		case r.ip == "10.0.0.2":
			// A query out on the old group at the change is asked again on
			// the new one; earlier ones must have stayed on the old.
			if since < -time.Second {
				t.Errorf("query %d %s sent %v before the change answered by the new upstream", i, r.name, -since)
			}
		default:
			t.Errorf("query %d %s: answer %s", i, r.name, r.ip)
		}
	}
	t.Logf("%d queries, %d failed; last old answer to a query sent %v after the change (old upstream %d, new %d queries)",
		total, failed, lastA, a.count(), b.count())
	if b.count() == 0 {
		t.Fatal("the new upstream was never asked")
	}
	// The replaced group stays open for retireGrace (every query on it is
	// done by then), then closes.
	q := new(dns.Msg)
	q.SetQuestion("late.stub.example.", dns.TypeA)
	wq, _ := q.Pack()
	if _, err := oldGroup.Exchange(context.Background(), wq); errors.Is(err, forward.ErrClosed) {
		t.Fatal("old group closed before retireGrace passed")
	}
	e.clock.Advance(e.d.run.RetireGrace())
	deadline := time.Now().Add(10 * time.Second) // the retiring goroutine runs; the bound is not the point
	for {
		_, err := oldGroup.Exchange(context.Background(), wq)
		if errors.Is(err, forward.ErrClosed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("old group still open after retireGrace: %v", err)
		}
		// The retiring goroutine may have been waiting for settleDrop
		// when the clock moved; move it on again.
		e.clock.Advance(e.d.run.RetireGrace())
		time.Sleep(10 * time.Millisecond)
	}
	// Unaffected zones kept their cache entries.
	e.ask(t, "keep.example.com.", dns.TypeA, false, "udp")
	e.ask(t, "svc.default.svc.cluster.local.", dns.TypeA, false, "udp")
	if e.node.count() != node || e.kube.count() != kube {
		t.Fatalf("unaffected entries were dropped: node %d->%d, kube-dns %d->%d", node, e.node.count(), kube, e.kube.count())
	}
}

func TestConfigMapInvalidUpdateKeepsRouting(t *testing.T) {
	a := startUpstream(t, answerA("10.0.0.1"))
	b := startUpstream(t, answerA("10.0.0.2"))
	cm := t.TempDir()
	kubeletWrite(t, cm, stubs("stub.example", a))
	e := start(t, func(c *config.Config) { c.KubeDNSConfigMap = cm })
	if got := e.firstA(t, "a0.stub.example."); got != "10.0.0.1" {
		t.Fatalf("before: %s", got)
	}
	e.waitSetupErrors(t, 0)

	bad := []map[string]string{
		{config.KeyStubDomains: `{"stub.example": ["` + b.addr.String() + `"]`},  // bad JSON
		{config.KeyStubDomains: `{"stub.example": ["10.0.0.300"]}`},              // bad address
		{config.KeyStubDomains: `{"stub example": ["` + b.addr.String() + `"]}`}, // not a domain
		{config.KeyUpstreamNameservers: `["1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4"]`},
	}
	for i, files := range bad {
		kubeletWrite(t, cm, files)
		e.waitSetupErrors(t, i+1) // one count per invalid update
		if got := e.firstA(t, fmt.Sprintf("b%d.stub.example.", i)); got != "10.0.0.1" {
			t.Fatalf("invalid update %d changed routing: %s", i, got)
		}
	}
	// Re-reads of the same invalid content count nothing more, a valid
	// update applies.
	kubeletWrite(t, cm, bad[len(bad)-1])
	kubeletWrite(t, cm, stubs("stub.example", b))
	took := e.eventually(t, "c", "stub.example.", "10.0.0.2")
	t.Logf("valid update applied after %v", took)
	if n := e.setupErrors(t); n != len(bad) {
		t.Fatalf("configmap setup errors %d, want %d", n, len(bad))
	}
}

func TestInvalidConfigMapAtStartupStartsWithout(t *testing.T) {
	a := startUpstream(t, answerA("10.0.0.1"))
	cm := t.TempDir()
	kubeletWrite(t, cm, map[string]string{config.KeyStubDomains: "{not json"})
	e := start(t, func(c *config.Config) { c.KubeDNSConfigMap = cm })
	if n := e.setupErrors(t); n != 1 {
		t.Fatalf("configmap setup errors %d, want 1", n)
	}
	if got := e.firstA(t, "a.stub.example."); got != wantA("a.stub.example.") || e.node.count() != 1 {
		t.Fatalf("without the ConfigMap the stub zone goes to the node resolvers: %s, node %d", got, e.node.count())
	}
	kubeletWrite(t, cm, stubs("stub.example", a))
	e.eventually(t, "b", "stub.example.", "10.0.0.1")
}

func TestUpstreamNameserversReplaceResolvConf(t *testing.T) {
	b := startUpstream(t, answerA("10.0.0.2"))
	cm := t.TempDir()
	e := start(t, func(c *config.Config) { c.KubeDNSConfigMap = cm })
	if got := e.firstA(t, "a.example.com."); got != wantA("a.example.com.") {
		t.Fatalf("node resolvers: %s", got)
	}
	kubeletWrite(t, cm, map[string]string{config.KeyUpstreamNameservers: fmt.Sprintf("[%q]", b.addr)})
	e.eventually(t, "b", "example.com.", "10.0.0.2")
	// The cluster domain still goes to kube-dns.
	if got := e.firstA(t, "svc.default.svc.cluster.local."); got != wantA("svc.default.svc.cluster.local.") || e.kube.count() != 1 {
		t.Fatalf("cluster name: %s, kube-dns %d", got, e.kube.count())
	}
	// Key removed: back to resolv.conf's list.
	kubeletWrite(t, cm, map[string]string{"federations": "{}"})
	start := time.Now()
	for i := 0; ; i++ {
		name := fmt.Sprintf("c%d.example.com.", i)
		if e.firstA(t, name) == wantA(name) {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("still on upstreamNameservers 2s after the key was removed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startUpstreamAt is startUpstream on a fixed address (resolv.conf has no
// port: its servers are on port 53). It skips when the address is taken or
// port 53 needs privileges we lack.
func startUpstreamAt(t *testing.T, addr string, h func(*dns.Msg) *dns.Msg) {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Skipf("cannot bind %s: %v", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = pc.Close()
		t.Skipf("cannot bind %s: %v", addr, err)
	}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) { _ = w.WriteMsg(h(r)) })
	udp := &dns.Server{PacketConn: pc, Handler: handler}
	tcp := &dns.Server{Listener: ln, Handler: handler}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	t.Cleanup(func() {
		_ = udp.Shutdown()
		_ = tcp.Shutdown()
	})
}

func TestResolvConfEditChangesNodeGroup(t *testing.T) {
	// 127.83.0.0/24: loopback addresses no other test here uses.
	startUpstreamAt(t, "127.83.0.1:53", answerA("10.0.0.1"))
	startUpstreamAt(t, "127.83.0.2:53", answerA("10.0.0.2"))
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.83.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := start(t, func(c *config.Config) {
		c.ResolvConf = rc
		c.Nameservers = []netip.AddrPort{netip.MustParseAddrPort("127.83.0.1:53")}
	})
	if got := e.firstA(t, "a.example.com."); got != "10.0.0.1" {
		t.Fatalf("before: %s", got)
	}
	if err := os.WriteFile(rc, []byte("# edited\nnameserver 127.83.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("resolv.conf edit applied after %v", e.eventually(t, "b", "example.com.", "10.0.0.2"))
	// Empty, then without a usable server: each is counted once, and the
	// last good list stays.
	for i, content := range []string{"", "nameserver not-an-ip\n"} {
		if err := os.WriteFile(rc, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		e.waitSetupErrorsOf(t, "resolvconf", i+1) // read and refused
		if got := e.firstA(t, fmt.Sprintf("c%d.example.com.", i)); got != "10.0.0.2" {
			t.Fatalf("unusable resolv.conf %q changed the node group: %s", content, got)
		}
	}
}
