package forward

import (
	"context"
	"fmt"

	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// removedRecorder is a recorder that also hears Removed.
type removedRecorder struct {
	*recorder
	mu      sync.Mutex
	removed []string
}

func (r *removedRecorder) Removed(group, upstream string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed = append(r.removed, upstream)
}

func (r *removedRecorder) removedList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.removed...)
}

var _ Remover = (*removedRecorder)(nil)

// endpointServers starts n pipelined test upstreams on distinct loopback addresses
// (127.0.0.2, .3, ...), as kube-dns pods each with an IP of its own.
func endpointServers(t *testing.T, n int) []*tcpServer {
	t.Helper()
	var out []*tcpServer
	for i := range n {
		out = append(out, startTCPOn(t, fmt.Sprintf("127.0.0.%d:0", 2+i), servePipelined))
	}
	return out
}

func addrsOf(ss []*tcpServer) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, s.addr)
	}
	return out
}

// TestEndpointsSpreadQueries: with endpoints, every query starts at the next one in turn: each
// gets its even share (within 10 points), over connections of its own, and the configured
// server (the ClusterIP) gets none while they answer; sync and async alike.
func TestEndpointsSpreadQueries(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			clusterIP := startTCP(t, servePipelined)
			eps := endpointServers(t, 3)
			rec := &removedRecorder{recorder: newRecorder()}
			g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{clusterIP.addr}, Proto: TCP}, rec)
			if err := g.SetEndpoints(addrsOf(eps)); err != nil {
				t.Fatal(err)
			}
			const n = 3000
			var wg sync.WaitGroup
			var failed atomic.Int32
			sem := make(chan struct{}, 32)
			for i := range n {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					name := fmt.Sprintf("q%d.spread.test.", i)
					ans, err := exchangeMaybeAsync(g, async, query(t, name, uint16(i)))
					if err != nil || checkTXT(ans, name, uint16(i)) != nil {
						failed.Add(1)
					}
				}()
			}
			wg.Wait()
			if failed.Load() > 0 {
				t.Fatalf("%d of %d queries failed", failed.Load(), n)
			}
			if got := clusterIP.queries.Load(); got != 0 {
				t.Errorf("the ClusterIP got %d queries while every endpoint answered", got)
			}
			for i, s := range eps {
				share := float64(s.queries.Load()) / n
				t.Logf("endpoint %d (%s): %d queries, %.1f%%, %d connections", i, s.addr, s.queries.Load(), 100*share, s.accepted.Load())
				if share < 1.0/3-0.10 || share > 1.0/3+0.10 {
					t.Errorf("endpoint %s has %.1f%% of the queries, want within 10 points of 33.3%%", s.addr, 100*share)
				}
				if s.accepted.Load() == 0 {
					t.Errorf("endpoint %s got no connection", s.addr)
				}
			}
		})
	}
}

// exchangeMaybeAsync is Exchange, or ExchangeAsync waited for.
func exchangeMaybeAsync(g *Group, async bool, q []byte) ([]byte, error) {
	if !async {
		return g.Exchange(context.Background(), q)
	}
	d := &waitDone{ch: make(chan struct{})}
	g.ExchangeAsync(q, 4*time.Second, d)
	<-d.ch
	return d.ans, d.err
}

type waitDone struct {
	ch  chan struct{}
	ans []byte
	err error
}

func (w *waitDone) ExchangeDone(ans []byte, err error) {
	w.ans, w.err = append([]byte(nil), ans...), err
	close(w.ch)
}

// TestEndpointRemovedUnderLoad: an endpoint taken out (its pod not ready, terminating) while
// queries flow gets no new query, its connections close once their queries are answered, no
// query fails, and the Observer hears Removed once its last connection is closed. One added
// gets its share from then on.
func TestEndpointRemovedUnderLoad(t *testing.T) {
	clusterIP := startTCP(t, servePipelined)
	eps := endpointServers(t, 3)
	rec := &removedRecorder{recorder: newRecorder()}
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{clusterIP.addr}, Proto: TCP}, rec)
	if err := g.SetEndpoints(addrsOf(eps[:2])); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent, failed atomic.Int32
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("w%d-%d.load.test.", w, i)
				id := uint16(i)
				ans, err := exchangeMaybeAsync(g, i%2 == 0, query(t, name, id))
				sent.Add(1)
				if err != nil || checkTXT(ans, name, id) != nil {
					failed.Add(1)
					t.Logf("query failed: %v", err)
				}
			}
		}()
	}
	waitFor(t, 5*time.Second, "load on both endpoints", func() bool { return eps[0].queries.Load() > 200 && eps[1].queries.Load() > 200 })
	// Scale up: the third one takes its share.
	if err := g.SetEndpoints(addrsOf(eps)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "load on the new endpoint", func() bool { return eps[2].queries.Load() > 200 })
	// Endpoint 0 becomes not ready: out at once.
	if err := g.SetEndpoints(addrsOf(eps[1:])); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the removed endpoint's connections closed", func() bool {
		return len(rec.removedList()) == 1
	})
	before := eps[0].queries.Load()
	n1, n2 := eps[1].queries.Load(), eps[2].queries.Load()
	waitFor(t, 5*time.Second, "more load on the others", func() bool {
		return eps[1].queries.Load() > n1+200 && eps[2].queries.Load() > n2+200
	})
	close(stop)
	wg.Wait()
	if after := eps[0].queries.Load(); after != before {
		t.Errorf("the removed endpoint got %d queries after its connections closed", after-before)
	}
	if got := rec.removedList(); len(got) != 1 || got[0] != eps[0].addr.String() {
		t.Errorf("Removed reported %v, want [%s]", got, eps[0].addr)
	}
	if failed.Load() > 0 {
		t.Errorf("%d of %d queries failed", failed.Load(), sent.Load())
	}
	if got := clusterIP.queries.Load(); got != 0 {
		t.Errorf("the ClusterIP got %d queries", got)
	}
	t.Logf("%d queries, none failed; endpoints: %d %d %d", sent.Load(), eps[0].queries.Load(), eps[1].queries.Load(), eps[2].queries.Load())
	if got := g.Endpoints(); len(got) != 2 || got[0].Addr != eps[1].addr || got[1].Addr != eps[2].addr {
		t.Errorf("Endpoints() = %v", got)
	}
}

// TestEndpointsFallBackToServers: endpoints that stop answering (pods gone while the API is
// unreachable) are failed over within each query's walk, marked down, and the configured
// server (the ClusterIP) answers: no query fails. With no endpoint at all it is asked alone.
func TestEndpointsFallBackToServers(t *testing.T) {
	clusterIP := startTCP(t, servePipelined)
	dead := []netip.AddrPort{deadAddr(t), deadAddr(t)}
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{clusterIP.addr}, Proto: TCP}, newRecorder())
	if err := g.SetEndpoints(dead); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		name := fmt.Sprintf("f%d.fallback.test.", i)
		ans, err := exchangeMaybeAsync(g, i%2 == 1, query(t, name, uint16(i)))
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if err := checkTXT(ans, name, uint16(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range g.Endpoints() {
		if e.Healthy {
			t.Errorf("dead endpoint %s still healthy", e.Addr)
		}
	}
	if clusterIP.queries.Load() != 50 {
		t.Errorf("ClusterIP answered %d of 50", clusterIP.queries.Load())
	}
	if err := g.SetEndpoints(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Exchange(context.Background(), query(t, "alone.test.", 1)); err != nil {
		t.Fatal(err)
	}
	if clusterIP.queries.Load() != 51 {
		t.Errorf("ClusterIP answered %d of 51", clusterIP.queries.Load())
	}
}

// TestSetEndpointsRefuses: a UDP group, or an invalid address, is an error; the ClusterIP
// itself listed as an endpoint is not asked twice; unspecified, multicast and broadcast
// addresses are never asked.
func TestSetEndpointsRefuses(t *testing.T) {
	u := newGroup(t, GroupConfig{Servers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}, Proto: UDP}, nil)
	if err := u.SetEndpoints([]netip.AddrPort{netip.MustParseAddrPort("127.0.0.2:53")}); err == nil {
		t.Error("UDP group took endpoints")
	}
	s := netip.MustParseAddrPort("127.0.0.1:53")
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{s}, Proto: TCP}, nil)
	if err := g.SetEndpoints([]netip.AddrPort{{}}); err == nil {
		t.Error("invalid endpoint taken")
	}
	e := netip.MustParseAddrPort("127.0.0.2:53")
	noServer := []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:53"), netip.MustParseAddrPort("239.1.2.3:53"),
		netip.MustParseAddrPort("255.255.255.255:53"), netip.MustParseAddrPort("[ff02::fb]:53"), netip.MustParseAddrPort("[::]:53")}
	if err := g.SetEndpoints(append([]netip.AddrPort{s, e, e}, noServer...)); err != nil {
		t.Fatal(err)
	}
	if got := g.Endpoints(); len(got) != 1 || got[0].Addr != e {
		t.Errorf("Endpoints() = %v, want [%s]: the ClusterIP, a duplicate and addresses no server has are ignored", got, e)
	}
	g.Close()
	if err := g.SetEndpoints([]netip.AddrPort{e}); err == nil {
		t.Error("closed group took endpoints")
	}
}

// BenchmarkExchangeAsyncTCPEndpoints is BenchmarkExchangeAsyncTCP with three endpoints in
// front of the configured server (kube-dns' pods in front of its ClusterIP): the turn among
// them costs an atomic add and no allocation.
func BenchmarkExchangeAsyncTCPEndpoints(b *testing.B) {
	g := newGroup(b, GroupConfig{Name: "bench", Servers: []netip.AddrPort{echoTCP(b)}, Proto: TCP}, nil)
	if err := g.SetEndpoints([]netip.AddrPort{echoTCP(b), echoTCP(b), echoTCP(b)}); err != nil {
		b.Fatal(err)
	}
	q := query(b, "kubernetes.default.svc.cluster.local.", 1)
	for range 3 { // a connection open to each endpoint
		if _, err := g.Exchange(context.Background(), q); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		d := make(chanDone, 1)
		for pb.Next() {
			g.ExchangeAsync(q, 5*time.Second, d)
			if err := <-d; err != nil {
				b.Error(err)
				return
			}
		}
	})
}
