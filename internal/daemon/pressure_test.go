package daemon

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// withStale turns on serve-stale and prefetch as the flags' defaults do.
func withStale(c *config.Config) {
	c.Cache.StaleWindow = time.Hour
	c.Cache.StaleClientTimeout = 1800 * time.Millisecond
	c.Cache.StaleRecheck = 30 * time.Second
	c.Cache.PrefetchHits = 2
}

// switchable wraps records: it can hold answers, answer SERVFAIL, or play
// dead.
type switchable struct {
	hold     atomic.Int64 // nanoseconds to hold each answer
	servfail atomic.Bool
	dead     atomic.Bool
}

func (s *switchable) handle(r *dns.Msg) *dns.Msg {
	if d := s.hold.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if s.dead.Load() {
		return nil
	}
	if s.servfail.Load() {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeServerFailure)
		return m
	}
	return records(r)
}

// startSwitchable starts a daemon whose node resolver is controlled by sw.
func startSwitchable(t *testing.T, sw *switchable, mutate func(*config.Config)) *env {
	t.Helper()
	node := startUpstream(t, sw.handle)
	return start(t, func(c *config.Config) {
		c.Nameservers = []netip.AddrPort{node.addr}
		withStale(c)
		if mutate != nil {
			mutate(c)
		}
	}).withNode(node)
}

func (e *env) withNode(u *upstream) *env { e.node = u; return e }

// burst sends n identical questions at once from several sockets (from
// src(socket): its source address; "": the kernel's pick) and returns the
// answers.
func burst(t *testing.T, addr, name string, n int, src func(int) string) []*dns.Msg {
	t.Helper()
	const sockets = 50
	out := make([]*dns.Msg, n)
	var wg sync.WaitGroup
	errs := make(chan error, sockets)
	for s := 0; s < sockets; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			var d net.Dialer
			if a := src(s); a != "" {
				d.LocalAddr = &net.UDPAddr{IP: net.ParseIP(a)}
			}
			conn, err := d.Dial("udp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			mine := 0
			for i := s; i < n; i += sockets {
				m := new(dns.Msg)
				qn := name
				if i%2 == 1 {
					qn = strings.ToUpper(name)
				}
				m.SetQuestion(qn, dns.TypeA)
				m.Id = uint16(i)
				b, _ := m.Pack()
				if _, err := conn.Write(b); err != nil {
					errs <- err
					return
				}
				mine++
			}
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 1500)
			for ; mine > 0; mine-- {
				k, err := conn.Read(buf)
				if err != nil {
					errs <- fmt.Errorf("socket %d: %w (%d answers missing)", s, err, mine)
					return
				}
				r := new(dns.Msg)
				if err := r.Unpack(buf[:k]); err != nil {
					errs <- err
					return
				}
				out[r.Id] = r
			}
		}(s)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// TestThousandConcurrentMissesOneUpstreamQuery: a thousand clients on
// 50 pods ask one name at once: one upstream query answers them all. The
// pods are addresses of a pod network (in a network namespace of its
// own): from loopback they would be the node, whose pool of the waiting
// bound is an eighth (package fair).
func TestThousandConcurrentMissesOneUpstreamQuery(t *testing.T) {
	if !inPodNetns(t, "TestThousandConcurrentMissesOneUpstreamQuery") {
		return
	}
	sw := &switchable{}
	sw.hold.Store(int64(200 * time.Millisecond))
	e := startSwitchable(t, sw, nil)
	answers := burst(t, e.udp, "popular.example.com.", 1000, func(s int) string { return fmt.Sprintf("10.99.1.%d", s+1) })
	for i, r := range answers {
		if r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != wantA("popular.example.com.") {
			t.Fatalf("answer %d: %v", i, r)
		}
		if want := r.Question[0].Name; (i%2 == 1) != (want == "POPULAR.EXAMPLE.COM.") {
			t.Fatalf("answer %d has question %q", i, want)
		}
	}
	if n := e.node.count(); n != 1 {
		e.node.mu.Lock()
		defer e.node.mu.Unlock()
		t.Fatalf("%d upstream queries (udp %d, tcp %d: %v) for 1000 concurrent misses, want 1", n, e.node.udpN.Load(), e.node.tcpN.Load(), e.node.names)
	}
}

// inPodNetns re-runs the test name in a network namespace of its own
// (unshare -n, as root) with loopback up and a pod network, 10.99.0.0/16,
// routed to it (addresses on no interface: not the node's), and reports
// false; in there it reports true.
func inPodNetns(t *testing.T, name string) bool {
	const marker = "NLD_DAEMON_PODS_NETNS"
	if os.Getenv(marker) != "" {
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: the pods' addresses need a network namespace")
	}
	cmd := exec.Command("unshare", "--net", "--", "sh", "-c", `ip link set lo up && ip route add local 10.99.0.0/16 dev lo && exec "$0" "$@"`,
		os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), marker+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return false
}

func TestServeStaleWhileUpstreamDown(t *testing.T) {
	sw := &switchable{}
	e := startSwitchable(t, sw, nil)
	name := "stale.example.com."
	e.ask(t, name, dns.TypeA, false, "udp") // cached for 20 s
	e.clock.Advance(25 * time.Second)
	sw.servfail.Store(true)
	r := e.ask(t, name, dns.TypeA, false, "udp")
	if r.Rcode != dns.RcodeSuccess || r.Answer[0].Header().Ttl != 30 || r.Answer[0].(*dns.A).A.String() != wantA(name) {
		t.Fatalf("upstream failing: want the stale answer with TTL 30, got %v", r)
	}
	// Within the recheck interval the stale answer comes without asking.
	before := e.node.count()
	e.clock.Advance(10 * time.Second)
	if r := e.ask(t, name, dns.TypeA, false, "udp"); r.Answer[0].Header().Ttl != 30 || e.node.count() != before {
		t.Fatalf("recheck interval: ttl %d, upstream %d→%d", r.Answer[0].Header().Ttl, before, e.node.count())
	}
	// Upstream back, recheck interval over: the fresh answer, stale gone.
	sw.servfail.Store(false)
	e.clock.Advance(21 * time.Second)
	if r := e.ask(t, name, dns.TypeA, false, "udp"); r.Answer[0].Header().Ttl != 20 {
		t.Fatalf("after recovery: ttl %d, want a fresh 20", r.Answer[0].Header().Ttl)
	}
	if r := e.ask(t, name, dns.TypeA, false, "udp"); r.Answer[0].Header().Ttl != 20 {
		t.Fatalf("stale answer served after a fresh one arrived: ttl %d", r.Answer[0].Header().Ttl)
	}
	if got := e.d.Server.Snapshot().StaleServed; got != 2 {
		t.Fatalf("stale served %d, want 2", got)
	}
}

func TestStaleAnsweredWithinClientTimeoutWhenUpstreamSlow(t *testing.T) {
	sw := &switchable{}
	e := startSwitchable(t, sw, func(c *config.Config) { c.Cache.StaleClientTimeout = 300 * time.Millisecond })
	name := "slow.example.com."
	e.ask(t, name, dns.TypeA, false, "udp")
	e.clock.Advance(25 * time.Second)
	sw.hold.Store(int64(1500 * time.Millisecond))
	type result struct {
		r   *dns.Msg
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, e.udp)
		ch <- result{r, err}
	}()
	// The client waits on the stale timer; move the clock past it.
	for deadline := time.Now().Add(3 * time.Second); e.clock.Timers() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client never waited for the refresh")
		}
	}
	e.clock.Advance(300 * time.Millisecond)
	res := <-ch
	if res.err != nil || res.r.Answer[0].Header().Ttl != 30 {
		t.Fatalf("slow upstream: %v %v, want the stale answer (TTL 30) before the refresh", res.r, res.err)
	}
	// The refresh finished in the background: the next answer is fresh.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := e.ask(t, name, dns.TypeA, false, "udp")
		if r.Answer[0].Header().Ttl == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("background refresh never landed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRefreshStormIsOneRefresh(t *testing.T) {
	sw := &switchable{}
	e := startSwitchable(t, sw, nil)
	name := "storm.example.com."
	e.ask(t, name, dns.TypeA, false, "udp")
	e.clock.Advance(25 * time.Second)
	sw.hold.Store(int64(300 * time.Millisecond))
	answers := burst(t, e.udp, name, 1000, func(int) string { return "" })
	for i, r := range answers {
		if r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("answer %d: %v", i, r)
		}
	}
	if n := e.node.count(); n != 2 {
		t.Fatalf("%d upstream queries, want 2 (the first miss and one refresh)", n)
	}
}

func TestPopularEntryIsPrefetched(t *testing.T) {
	sw := &switchable{}
	e := startSwitchable(t, sw, nil)
	name := "prefetch.example.com."
	for i := 0; i < 3; i++ { // a miss, then two hits: popular
		e.ask(t, name, dns.TypeA, false, "udp")
	}
	e.clock.Advance(18500 * time.Millisecond) // last 10% of a 20 s TTL
	if r := e.ask(t, name, dns.TypeA, false, "udp"); r.Answer[0].Header().Ttl != 2 {
		t.Fatalf("ttl %d", r.Answer[0].Header().Ttl)
	}
	deadline := time.Now().Add(3 * time.Second)
	for e.node.count() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no prefetch: upstream saw %d", e.node.count())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Past the old expiry: still a hit, from the prefetched entry.
	deadline = time.Now().Add(3 * time.Second)
	for e.d.Cache.Stats().Prefetches != 1 || e.d.Cache.Stats().Inserts != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", e.d.Cache.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.clock.Advance(5 * time.Second)
	misses := e.d.Server.Snapshot().CacheMisses
	r := e.ask(t, name, dns.TypeA, false, "udp")
	if r.Answer[0].Header().Ttl != 15 || e.d.Server.Snapshot().CacheMisses != misses || e.node.count() != 2 {
		t.Fatalf("after expiry: ttl %d, misses %d→%d, upstream %d", r.Answer[0].Header().Ttl, misses, e.d.Server.Snapshot().CacheMisses, e.node.count())
	}
}

func TestServfailNeverShadowsStale(t *testing.T) {
	sw := &switchable{}
	e := startSwitchable(t, sw, nil)
	e.ask(t, "kept.example.com.", dns.TypeA, false, "udp")
	e.clock.Advance(25 * time.Second)
	e.clock.Advance(31 * time.Second)
	sw.servfail.Store(true)
	for i := 0; i < 3; i++ {
		if r := e.ask(t, "kept.example.com.", dns.TypeA, false, "udp"); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("try %d: rcode %d: SERVFAIL shadowed the stale answer", i, r.Rcode)
		}
	}
	if st := e.d.Cache.Stats(); st.Entries[2] != 0 {
		t.Fatalf("SERVFAIL stored next to a stale answer: %+v", st)
	}
	// Without a stale answer the SERVFAIL goes through and is kept briefly.
	if r := e.ask(t, "new.example.com.", dns.TypeA, false, "udp"); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %d", r.Rcode)
	}
	n := e.node.count()
	e.ask(t, "new.example.com.", dns.TypeA, false, "udp")
	if e.node.count() != n {
		t.Fatal("SERVFAIL not cached for its short TTL")
	}
	e.clock.Advance(2 * time.Second)
	e.ask(t, "new.example.com.", dns.TypeA, false, "udp")
	if e.node.count() != n+1 {
		t.Fatal("SERVFAIL cached past -servfail-ttl")
	}
}

// TestOutageStaysBounded: 500 clients asking unique names while kube-dns
// is dead. Memory stays bounded, cached names are still answered fast,
// and nothing from the outage is cached.
func TestOutageStaysBounded(t *testing.T) {
	e := start(t, func(c *config.Config) {
		withStale(c)
		c.ForwardTimeout = 1 * time.Second
	})
	e.ask(t, "cached.example.com.", dns.TypeA, false, "udp")
	_ = e.kube.udp.Shutdown()
	_ = e.kube.tcp.Shutdown()
	entries := e.d.Cache.Stats().Entries
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)

	stop := make(chan struct{})
	var sent, answered atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < 500; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			conn, err := net.Dial("udp", e.udp)
			if err != nil {
				return
			}
			defer conn.Close()
			buf := make([]byte, 1500)
			for i := 0; i < 40; i++ { // bounded: at most 20,000 queries
				select {
				case <-stop:
					return
				default:
				}
				m := new(dns.Msg)
				m.SetQuestion(fmt.Sprintf("u%d-%d.default.svc.cluster.local.", c, i), dns.TypeA)
				b, _ := m.Pack()
				_, _ = conn.Write(b)
				sent.Add(1)
				_ = conn.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
				if _, err := conn.Read(buf); err == nil {
					answered.Add(1)
				}
			}
		}(c)
	}
	// Meanwhile a cached name is answered at normal speed.
	var lat []time.Duration
	for i := 0; i < 100; i++ {
		began := time.Now()
		e.ask(t, "cached.example.com.", dns.TypeA, false, "udp")
		lat = append(lat, time.Since(began))
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	// What this guards: a cached answer never waits behind the misses for
	// an upstream try (-forward-timeout, 1 s here). Normal is well under a
	// millisecond, but 2 cores shared with 500 busy clients, the race
	// detector and the rest of a parallel test run stretch it (280 ms seen
	// at p99), so the bound is the try timeout itself, not a speed claim:
	// speed is for benchmarks.
	if p99 := lat[98]; p99 >= time.Second {
		t.Fatalf("cached answers slowed to p99 %v during the outage: as long as an upstream try", p99)
	}
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	if grew := int64(m1.HeapAlloc) - int64(m0.HeapAlloc); grew > 64<<20 {
		t.Fatalf("heap grew %d MiB during the outage", grew>>20)
	}
	if got := e.d.Cache.Stats().Entries; got != entries {
		t.Fatalf("entries %v → %v: the outage was cached", entries, got)
	}
	t.Logf("%d queries sent, %d answered (SERVFAIL) during the outage; cached p50 %v p99 %v", sent.Load(), answered.Load(), lat[49], lat[98])
}
