package autopath

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
)

type fakePods struct {
	mu    sync.Mutex
	pods  map[netip.Addr]*podwatch.Pod
	state podwatch.State
}

func (f *fakePods) Lookup(ip netip.Addr) (*podwatch.Pod, podwatch.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pods[ip], f.state
}

func (f *fakePods) set(ip netip.Addr, p *podwatch.Pod, s podwatch.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p == nil {
		delete(f.pods, ip)
	} else {
		f.pods[ip] = p
	}
	f.state = s
}

// zone is a fake resolver: names not listed are NXDOMAIN (negative TTL 30);
// a listed name answers its records of the asked type, or NODATA.
type zone struct {
	records map[string][]dns.RR // by owner, lower case
	fail    map[string]int      // name -> rcode to answer instead
	calls   atomic.Int64
	gate    chan struct{} // when set, each call waits for it to close
	negTTL  uint32
}

func newZone(rrs ...string) *zone {
	z := &zone{records: map[string][]dns.RR{}, fail: map[string]int{}, negTTL: 30}
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			panic(err)
		}
		z.records[strings.ToLower(rr.Header().Name)] = append(z.records[strings.ToLower(rr.Header().Name)], rr)
	}
	return z
}

func (z *zone) resolve(ctx context.Context, name string, qtype uint16) (Result, error) {
	z.calls.Add(1)
	if z.gate != nil {
		select {
		case <-z.gate:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	if rc, ok := z.fail[name]; ok {
		return Result{Rcode: rc}, nil
	}
	soa, _ := dns.NewRR(fmt.Sprintf("cluster.local. %d IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 %d", z.negTTL, z.negTTL))
	rrs, ok := z.records[name]
	if !ok {
		return Result{Rcode: dns.RcodeNameError, Ns: []dns.RR{soa}, TTL: z.negTTL}, nil
	}
	r := Result{Rcode: dns.RcodeSuccess, TTL: ^uint32(0)}
	for _, rr := range rrs {
		if rr.Header().Rrtype == qtype {
			r.Answer = append(r.Answer, dns.Copy(rr))
			r.TTL = min(r.TTL, rr.Header().Ttl)
		}
	}
	if len(r.Answer) == 0 {
		r.Ns, r.TTL = []dns.RR{soa}, z.negTTL
	}
	return r, nil
}

var (
	podIP   = netip.MustParseAddr("10.244.1.5")
	shopPod = &podwatch.Pod{
		Namespace: "shop", Name: "web", Ndots: 5,
		Search: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"},
	}
)

type fixture struct {
	ap   *Autopath
	pods *fakePods
	z    *zone
	clk  *clock.Fake
}

func newFixture(t *testing.T, z *zone) *fixture {
	t.Helper()
	f := &fixture{
		pods: &fakePods{pods: map[netip.Addr]*podwatch.Pod{podIP: shopPod}, state: kubewatch.Synced},
		z:    z, clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
	}
	var err error
	f.ap, err = New(Config{Pods: f.pods, Resolve: z.resolve, ClusterDomain: "cluster.local", Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) ask(name string, qtype uint16) *dns.Msg {
	m, err := f.ap.Answer(context.Background(), podIP, name, qtype)
	if err != nil {
		panic(err) // context.Background never ends
	}
	return m
}

func rrStrings(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	return out
}

func TestAutopathExternalName(t *testing.T) {
	f := newFixture(t, newZone(
		"api.example.com. 300 IN A 192.0.2.1",
		"api.example.com. 120 IN AAAA 2001:db8::1",
	))
	a := f.ask("Api.Example.com.shop.svc.cluster.local.", dns.TypeA)
	if a == nil {
		t.Fatal("declined")
	}
	// The smallest TTL involved: the denials' 30 s.
	want := []string{
		"Api.Example.com.shop.svc.cluster.local. 30 IN CNAME api.example.com.",
		"api.example.com. 30 IN A 192.0.2.1",
	}
	if got := rrStrings(a.Answer); strings.Join(got, "\n") != strings.Join(want, "\n") || a.Rcode != dns.RcodeSuccess {
		t.Errorf("A answer %s\n%q, want\n%q", dns.RcodeToString[a.Rcode], got, want)
	}
	calls := f.z.calls.Load()
	if calls != 5 {
		t.Errorf("%d candidates resolved, want 5 (the A walk: 5 names, as the client's own)", calls)
	}
	// The AAAA query of the same lookup reuses the decision, 2 s later,
	// and asks only the target's AAAA (the client's walk asks it too).
	f.clk.Advance(2 * time.Second)
	aaaa := f.ask("Api.Example.com.shop.svc.cluster.local.", dns.TypeAAAA)
	if aaaa == nil || f.z.calls.Load() != calls+1 {
		t.Fatalf("AAAA: %v, %d resolves", aaaa, f.z.calls.Load()-calls)
	}
	if got := rrStrings(aaaa.Answer); len(got) != 2 || got[1] != "api.example.com. 28 IN AAAA 2001:db8::1" {
		t.Errorf("AAAA answer %q", got)
	}
	m := metricValues(t, f.ap)
	if m["nodelocaldns_autopath_client_queries_saved_total"] != 8 || m["nodelocaldns_autopath_answers_total"] != 2 ||
		m["nodelocaldns_autopath_lookups_total"] != 1 || m["nodelocaldns_autopath_candidates_resolved_total"] != 5 {
		t.Errorf("metrics %v", m)
	}
}

func TestAutopathNameWithOneTypeOnly(t *testing.T) {
	f := newFixture(t, newZone("db.billing.svc.cluster.local. 5 IN A 10.96.0.7"))
	q := "db.billing.shop.svc.cluster.local."
	a, aaaa := f.ask(q, dns.TypeA), f.ask(q, dns.TypeAAAA)
	if a == nil || aaaa == nil {
		t.Fatalf("declined: %v %v", a, aaaa)
	}
	if got := rrStrings(a.Answer); len(got) != 2 || got[1] != "db.billing.svc.cluster.local. 5 IN A 10.96.0.7" {
		t.Errorf("A %q", got)
	}
	// NOERROR, the CNAME, no AAAA: the name exists without that type; the
	// authority section carries the denial's SOA.
	if got := rrStrings(aaaa.Answer); aaaa.Rcode != dns.RcodeSuccess || len(got) != 1 ||
		got[0] != "db.billing.shop.svc.cluster.local. 30 IN CNAME db.billing.svc.cluster.local." || len(aaaa.Ns) != 1 {
		t.Errorf("AAAA %s %q ns %v", dns.RcodeToString[aaaa.Rcode], got, aaaa.Ns)
	}
}

func TestAutopathDeclines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		zone   *zone
		q      string
		reason string
	}{
		{"first candidate exists (a Service of the pod's namespace)",
			newZone("db.shop.svc.cluster.local. 5 IN A 10.96.0.8"), "db.shop.svc.cluster.local.", ReasonFirstExists},
		{"no candidate exists",
			newZone(), "nope.example.shop.svc.cluster.local.", ReasonNoCandidate},
		{"as many dots as ndots: asked as is first",
			newZone("a.b.c.d.e.f. 5 IN A 192.0.2.9"), "a.b.c.d.e.f.shop.svc.cluster.local.", ReasonNotSearch},
		{"exists without addresses: musl stops, glibc walks on",
			newZone("x.corp.example. 5 IN MX 10 mail.corp.example.", "x. 5 IN A 192.0.2.3"), "x.shop.svc.cluster.local.", ReasonAmbiguous},
		{"NODATA in the middle: musl stops, glibc walks on",
			newZone("h.cluster.local. 5 IN AAAA 2001:db8::8", "h.corp.example. 5 IN A 10.1.1.1"), "h.shop.svc.cluster.local.", ReasonAmbiguous},
		{"SERVFAIL on the way",
			func() *zone {
				z := newZone("s.example. 5 IN A 192.0.2.4")
				z.fail["s.example.svc.cluster.local."] = dns.RcodeServerFailure
				return z
			}(),
			"s.example.shop.svc.cluster.local.", ReasonAmbiguous},
		{"not under the pod's first search domain",
			newZone("api.example.com. 5 IN A 192.0.2.1"), "api.example.com.other.svc.cluster.local.", ReasonNotSearch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.zone)
			if m := f.ask(tc.q, dns.TypeA); m != nil {
				t.Fatalf("answered %v", m)
			}
			if m := f.ask(tc.q, dns.TypeAAAA); m != nil {
				t.Fatalf("answered AAAA %v", m)
			}
			if v := metricValues(t, f.ap)[`nodelocaldns_autopath_declined_total{reason="`+tc.reason+`"}`]; v != 2 {
				t.Errorf("declined for %s: %v times, want 2; %v", tc.reason, v, metricValues(t, f.ap))
			}
		})
	}
}

func TestAutopathNeverForUnknownOrIneligible(t *testing.T) {
	z := newZone("api.example.com. 300 IN A 192.0.2.1")
	q := "api.example.com.shop.svc.cluster.local."
	f := newFixture(t, z)
	if m, _ := f.ap.Answer(context.Background(), netip.MustParseAddr("10.244.1.99"), q, dns.TypeA); m != nil {
		t.Error("answered an unknown source")
	}
	ineligible := *shopPod
	ineligible.Ineligible = "search list does not start with the cluster search domains"
	f.pods.set(podIP, &ineligible, kubewatch.Synced)
	if f.ask(q, dns.TypeA) != nil {
		t.Error("answered an ineligible pod")
	}
	f2 := newFixture(t, z)
	f2.pods.set(podIP, shopPod, kubewatch.Lost)
	if f2.ask(q, dns.TypeA) != nil {
		t.Error("answered while the watch is lost")
	}
	if z.calls.Load() != 0 {
		t.Errorf("%d resolves for declined lookups", z.calls.Load())
	}
	// Other types, names outside the cluster search domains: not candidates.
	if f.ap.Candidate("api.example.com.shop.svc.cluster.local.", dns.TypeMX) ||
		f.ap.Candidate("api.example.com.", dns.TypeA) || f.ap.Candidate("shop.svc.cluster.local.", dns.TypeA) {
		t.Error("Candidate accepts what autopath never answers")
	}
}

// The point 3: the pod was unknown at the first query of the pair,
// known at the second: neither is answered, until the memo expires.
func TestAutopathPairAgreesWhenThePodAppears(t *testing.T) {
	f := newFixture(t, newZone("api.example.com. 300 IN A 192.0.2.1", "api.example.com. 300 IN AAAA 2001:db8::1"))
	f.pods.set(podIP, nil, kubewatch.Synced)
	q := "api.example.com.shop.svc.cluster.local."
	if f.ask(q, dns.TypeA) != nil {
		t.Fatal("answered an unknown pod")
	}
	f.pods.set(podIP, shopPod, kubewatch.Synced)
	f.clk.Advance(DefaultMemoTTL - time.Millisecond)
	if f.ask(q, dns.TypeAAAA) != nil {
		t.Fatal("AAAA answered by autopath while its A was not")
	}
	f.clk.Advance(time.Millisecond)
	if f.ask(q, dns.TypeAAAA) == nil {
		t.Fatal("a new lookup after the memo expired was declined")
	}
}

// musl sends A and AAAA at once: both wait for one decision, and the
// candidates are resolved once.
func TestAutopathConcurrentPairResolvesOnce(t *testing.T) {
	z := newZone("api.example.com. 300 IN A 192.0.2.1", "api.example.com. 300 IN AAAA 2001:db8::1")
	z.gate = make(chan struct{})
	f := newFixture(t, z)
	q := "api.example.com.shop.svc.cluster.local."
	var wg sync.WaitGroup
	got := make([]*dns.Msg, 2)
	for i, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = f.ask(q, qt) }()
	}
	// Both queries are in: one walking (its first call waiting at the
	// gate), the other waiting for the decision.
	deadline := time.Now().Add(10 * time.Second)
	for z.calls.Load() < 1 || !bothAsked(f.ap) {
		if time.Now().After(deadline) {
			t.Fatal("candidates never resolved")
		}
		time.Sleep(time.Millisecond)
	}
	close(z.gate)
	wg.Wait()
	// One walk: the first candidate for the type that came first (the
	// client's own query), both types from the second on (the pod asked
	// both, as its own walk does): 9; the other query reads the target's
	// answer once more (a cache hit in the daemon): 10. When the second
	// query is registered before the walk looks at its first candidate,
	// the walk asks both types there too: 11 (both are the client's own
	// first queries, which it sends anyway; in the daemon, cache hits).
	if n := z.calls.Load(); got[0] == nil || got[1] == nil || n < 10 || n > 11 {
		t.Errorf("answers %v %v after %d resolves, want both after 10 or 11", got[0] != nil, got[1] != nil, n)
	}
}

// A target whose answer is too large to unpack while deciding is declined
// (memoised, for both queries of the pair); the first candidate's own
// large answer is the client's (first candidate exists).
func TestAutopathLargeTargetDeclines(t *testing.T) {
	z := newZone("big.example. 30 IN A 192.0.2.1")
	f := newFixture(t, z)
	f.ap.cfg.Resolve = func(ctx context.Context, name string, qtype uint16) (Result, error) {
		r, err := z.resolve(ctx, name, qtype)
		if name == "big.example." && !NeedsRecords(ctx) {
			r = Result{Rcode: r.Rcode, TTL: r.TTL, Large: true, HasRecords: len(r.Answer) > 0}
		}
		return r, err
	}
	q := "big.example.shop.svc.cluster.local."
	if f.ask(q, dns.TypeA) != nil || f.ask(q, dns.TypeAAAA) != nil {
		t.Error("answered with a large target")
	}
	if v := metricValues(t, f.ap)[`nodelocaldns_autopath_declined_total{reason="answer_too_large"}`]; v != 2 {
		t.Errorf("answer_too_large %v, want 2", v)
	}
}

func bothAsked(a *Autopath) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.memo {
		if d.asked == 3 {
			return true
		}
	}
	return false
}

// musl and Go send A and AAAA at once: where the name exists with one type
// only at a candidate before the last, the walk that finds NODATA for its
// type asks the other (the pod asked it): the target, whichever query came
// first.
func TestAutopathPairEndsAtOneTypeOnly(t *testing.T) {
	for _, first := range []uint16{dns.TypeA, dns.TypeAAAA} {
		f := newFixture(t, newZone("intranet.corp.example. 30 IN A 10.1.1.1"))
		q := "intranet.shop.svc.cluster.local."
		d, owner := f.ap.memoGet(memoKey{src: podIP, name: q}, first)
		if !owner {
			t.Fatal("not the owner")
		}
		// The pair's other query arrives while the first walks.
		f.ap.memoGet(memoKey{src: podIP, name: q}, other(first))
		res := f.ap.decide(context.Background(), d.key, d, first)
		f.ap.memoDone(d)
		if d.reason != "" || d.target != "intranet.corp.example." {
			t.Errorf("%s first: declined %q, target %q", dns.TypeToString[first], d.reason, d.target)
		}
		m := d.answer(q, first, res, f.clk.Now())
		if first == dns.TypeAAAA && (len(m.Answer) != 1 || len(m.Ns) != 1) {
			t.Errorf("AAAA: %v", m)
		}
	}
}

func TestAutopathResolutionFailureDeclines(t *testing.T) {
	z := newZone()
	z.gate = make(chan struct{}) // never opens
	f := newFixture(t, z)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *dns.Msg)
	go func() {
		m, _ := f.ap.Answer(ctx, podIP, "x.example.shop.svc.cluster.local.", dns.TypeA)
		done <- m
	}()
	for z.calls.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if m := <-done; m != nil {
		t.Errorf("answered after the resolutions failed: %v", m)
	}
	// The other query of the pair, with a live context, declines too.
	if m := f.ask("x.example.shop.svc.cluster.local.", dns.TypeAAAA); m != nil {
		t.Errorf("AAAA answered while its A was not: %v", m)
	}
}

func TestAutopathMemoBound(t *testing.T) {
	z := newZone()
	f := newFixture(t, z)
	// "a.x.shop.svc.cluster.local." is 27 bytes: 821 reserved while
	// deciding, 539 kept for a decline (no target).
	f.ap.cfg.MemoBytes = 1500
	f.ask("a.x.shop.svc.cluster.local.", dns.TypeA)
	f.ask("b.x.shop.svc.cluster.local.", dns.TypeA)
	calls := z.calls.Load()
	f.ask("c.x.shop.svc.cluster.local.", dns.TypeA)
	if z.calls.Load() != calls {
		t.Error("resolved past the memo bound")
	}
	if v := metricValues(t, f.ap)[`nodelocaldns_autopath_declined_total{reason="memo_full"}`]; v != 1 {
		t.Errorf("memo_full %v", v)
	}
	if v := metricValues(t, f.ap)["nodelocaldns_autopath_memo_bytes"]; v != 1078 {
		t.Errorf("memo_bytes %v, want 1078", v)
	}
	// After the memo TTL the expired decisions are swept: room again.
	f.clk.Advance(DefaultMemoTTL)
	f.ask("d.x.shop.svc.cluster.local.", dns.TypeA)
	if z.calls.Load() == calls {
		t.Error("memo never made room again")
	}
	if v := metricValues(t, f.ap)["nodelocaldns_autopath_memo_bytes"]; v != 539 {
		t.Errorf("memo_bytes %v after the sweep, want 539", v)
	}
}

// One pod filling its share of the memo declines its own new lookups
// (both queries of each pair alike), not another pod's.
func TestAutopathPodMemoBound(t *testing.T) {
	z := newZone("api.example.com. 300 IN A 192.0.2.1", "api.example.com. 300 IN AAAA 2001:db8::1")
	f := newFixture(t, z)
	other := netip.MustParseAddr("10.244.1.6")
	f.pods.set(other, shopPod, kubewatch.Synced)
	f.ap.cfg.PodMemoBytes = 4000
	for i := range 20 {
		f.ask(fmt.Sprintf("u%d.wild.example.shop.svc.cluster.local.", i), dns.TypeA)
	}
	if v := metricValues(t, f.ap)[`nodelocaldns_autopath_declined_total{reason="pod_memo_full"}`]; v == 0 {
		t.Error("the pod's share was never full")
	}
	q := "api.example.com.shop.svc.cluster.local."
	if f.ask(q, dns.TypeA) != nil || f.ask(q, dns.TypeAAAA) != nil {
		t.Error("the full pod's new lookup answered")
	}
	if m, _ := f.ap.Answer(context.Background(), other, q, dns.TypeA); m == nil {
		t.Error("another pod declined for the first pod's share")
	}
	if b := f.ap.bytes; b > 4000+entryBytes(memoKey{name: q}, q)+255 {
		t.Errorf("memo holds %d bytes", b)
	}
}

// The walk sends only names the client's own walk sends, in its order,
// and stops where the client would.
func TestAutopathWalkAsksOnlyTheClientsNames(t *testing.T) {
	walk := []string{"x.shop.svc.cluster.local.", "x.svc.cluster.local.", "x.cluster.local.", "x.corp.example.", "x."}
	for _, tc := range []struct {
		name     string
		zone     []string
		asked    int // candidates resolved for A, a prefix of walk
		answered bool
	}{
		{"first candidate exists", []string{"x.shop.svc.cluster.local. 5 IN A 10.96.0.1"}, 1, false},
		{"second exists", []string{"x.svc.cluster.local. 5 IN A 10.96.0.1", "x. 5 IN A 192.0.2.1"}, 2, true},
		{"only the name as asked", []string{"x. 5 IN A 192.0.2.1"}, 5, true},
		{"nothing", nil, 5, false},
		{"NODATA in the middle", []string{"x.cluster.local. 5 IN TXT a", "x. 5 IN A 192.0.2.1"}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			z := newZone(tc.zone...)
			var mu sync.Mutex
			var asked []string
			f := newFixture(t, z)
			f.ap.cfg.Resolve = func(ctx context.Context, name string, qtype uint16) (Result, error) {
				mu.Lock()
				asked = append(asked, name)
				mu.Unlock()
				return z.resolve(ctx, name, qtype)
			}
			m := f.ask(walk[0], dns.TypeA)
			if (m != nil) != tc.answered {
				t.Errorf("answered %v, want %v", m != nil, tc.answered)
			}
			if strings.Join(asked, " ") != strings.Join(walk[:tc.asked], " ") {
				t.Errorf("asked %q, want %q", asked, walk[:tc.asked])
			}
		})
	}
}

// The memo's byte count is no less than what its decisions take on the
// heap: the documented bound holds.
func TestMemoBytesAccounting(t *testing.T) {
	z := newZone()
	f := newFixture(t, z)
	f.ap.cfg.MemoBytes, f.ap.cfg.PodMemoBytes = 1<<30, 1<<30
	const n = 20000
	names := make([]string, n)
	for i := range names {
		// Upper case: the memo keeps a lower-case copy, as it does of a
		// name unpacked from a query.
		names[i] = fmt.Sprintf("HOST-%06d.wild.example.shop.svc.cluster.local.", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, name := range names {
		f.ask(name, dns.TypeA)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if counted := int64(f.ap.bytes); heap > counted {
		t.Errorf("%d decisions take %d bytes of heap, counted %d", n, heap, counted)
	} else {
		t.Logf("%d decisions: %d bytes of heap (%d each), counted %d (%d each)", n, heap, heap/n, counted, counted/n)
	}
	runtime.KeepAlive(names)
}

// CandidateWire, the serving loops' test on the wire name, says what
// Candidate says on the presentation name, and allocates nothing.
func TestCandidateWireAgreesWithCandidate(t *testing.T) {
	f := newFixture(t, newZone())
	for _, name := range []string{
		"api.example.com.shop.svc.cluster.local.", "Db.Shop.SVC.Cluster.Local.", "db.svc.cluster.local.",
		"svc.cluster.local.", "cluster.local.", "x.y.svc.cluster.localx.", "x.ysvc.cluster.local.",
		"a.b.c.d.e.f.shop.svc.cluster.local.", "example.com.", ".", "x.shop.svc.other.local.",
	} {
		wireName := make([]byte, 256)
		n, err := dns.PackDomainName(name, wireName, 0, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeMX} {
			want := f.ap.Candidate(name, qt)
			if got := f.ap.CandidateWire(wireName[:n], qt); got != want {
				t.Errorf("%s %d: CandidateWire %v, Candidate %v", name, qt, got, want)
			}
		}
		if allocs := testing.AllocsPerRun(100, func() { f.ap.CandidateWire(wireName[:n], dns.TypeA) }); allocs != 0 {
			t.Errorf("%s: %v allocations", name, allocs)
		}
	}
}
