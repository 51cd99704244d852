package autopath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Result is a resolved candidate, as the resolution package gives it.
type Result struct {
	// Rcode of the answer (dns.RcodeSuccess, dns.RcodeNameError, ...).
	Rcode int
	// Answer is the answer section: the candidate's records of the asked
	// type, after its own CNAME chain if it has one.
	Answer []dns.RR
	// Ns is the authority section (the SOA of a denial).
	Ns []dns.RR
	// TTL is the smallest TTL involved: of the answer records, or the
	// negative TTL of a denial.
	TTL uint32
	// Large: the answer is larger than Resolve unpacks while deciding
	// (Answer and Ns are empty; HasRecords says whether Answer would hold
	// records of the asked type). Autopath declines rather than answer
	// with it: the client's own walk gets it from the cache as wire bytes.
	// Resolve unpacks it anyway when NeedsRecords(ctx).
	Large      bool
	HasRecords bool
}

type needRecordsKey struct{}

// NeedsRecords reports whether Resolve is called for an answer that must
// be built (the other query of a pair decided on): a Large answer must be
// unpacked then.
func NeedsRecords(ctx context.Context) bool { return ctx.Value(needRecordsKey{}) != nil }

// has reports whether r holds records of qtype.
func (r Result) has(qtype uint16) bool {
	if r.Large {
		return r.HasRecords
	}
	return hasType(r.Answer, qtype)
}

// Resolve resolves one name (absolute, with trailing dot) and type through
// the daemon's cache and coalescing. An error is a failure to get an
// answer (timeout, overload), not a DNS denial. The Result's records are
// the caller's own (autopath sets their TTLs).
type Resolve func(ctx context.Context, name string, qtype uint16) (Result, error)

// Pods is the pod view (podwatch.Watch).
type Pods interface {
	Lookup(ip netip.Addr) (*podwatch.Pod, podwatch.State)
}

// Defaults.
const (
	// DefaultMemoTTL: how long a decision is kept. glibc sends A and AAAA
	// of one lookup back to back (or one after the other's answer, with
	// single-request), musl at once; 5 s covers a retry after glibc's
	// 5 s timeout's first half, and a candidate answer rarely changes
	// meanwhile.
	DefaultMemoTTL = 5 * time.Second
	// DefaultTimeout bounds resolving the candidates: below glibc's 5 s
	// timeout, like -forward-timeout.
	DefaultTimeout = 4 * time.Second
	// DefaultMemoBytes bounds the memo in bytes (entryBytes each: a
	// decision is a target name and a few numbers, never records); past
	// it every new lookup declines for a memo TTL.
	DefaultMemoBytes = 4 << 20
	// DefaultPodMemoBytes bounds one pod's share of the memo; past it that
	// pod's new lookups decline for a memo TTL, the other pods' do not.
	DefaultPodMemoBytes = 1 << 20
)

// entryOverhead is what a memo entry costs besides its two names: the map
// slot and key, the decision (its channel included), its place in the
// expiry queue. TestMemoBytesAccounting checks it against the heap.
const entryOverhead = 512

// Config wires an Autopath.
type Config struct {
	Pods    Pods
	Resolve Resolve
	// ClusterDomain ("cluster.local."): only names under it are candidates.
	ClusterDomain string
	Clock         clock.Clock
	MemoTTL       time.Duration
	Timeout       time.Duration
	// MemoBytes and PodMemoBytes: DefaultMemoBytes and
	// DefaultPodMemoBytes when 0.
	MemoBytes    int
	PodMemoBytes int
}

// Autopath decides and builds autopath answers. Safe for concurrent use.
type Autopath struct {
	cfg Config
	clk clock.Clock
	svc string // ".svc.<cluster domain>." lower case
	// svcWire is "svc.<cluster domain>." in wire form, for CandidateWire.
	svcWire []byte
	mu      sync.Mutex
	memo    map[memoKey]*decision
	// queue holds the memo's decisions in the order they expire (one TTL
	// for all: the order they were made); queue[head:] are live. Each new
	// decision removes the expired ones at the front: amortised O(1).
	queue []*decision
	head  int
	bytes int
	pods  map[netip.Addr]*podUse
	// overflowUntil: the memo was full; every new lookup declines until
	// then, so both queries of a pair decline alike.
	overflowUntil time.Time

	metrics *metrics
}

// podUse is one pod's share of the memo.
type podUse struct {
	bytes         int
	overflowUntil time.Time
}

// New returns an Autopath.
func New(cfg Config) (*Autopath, error) {
	if cfg.Pods == nil || cfg.Resolve == nil {
		return nil, errors.New("autopath: Pods and Resolve are required")
	}
	cd := strings.ToLower(dns.Fqdn(cfg.ClusterDomain))
	if cd == "." {
		return nil, errors.New("autopath: no cluster domain")
	}
	if cfg.MemoTTL <= 0 {
		cfg.MemoTTL = DefaultMemoTTL
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MemoBytes <= 0 {
		cfg.MemoBytes = DefaultMemoBytes
	}
	if cfg.PodMemoBytes <= 0 {
		cfg.PodMemoBytes = DefaultPodMemoBytes
	}
	buf := make([]byte, 256)
	n, err := dns.PackDomainName("svc."+cd, buf, 0, nil, false)
	if err != nil {
		return nil, fmt.Errorf("autopath: cluster domain %q: %w", cfg.ClusterDomain, err)
	}
	a := &Autopath{cfg: cfg, clk: clock.Or(cfg.Clock), svc: ".svc." + cd, svcWire: buf[:n:n], memo: map[memoKey]*decision{}, pods: map[netip.Addr]*podUse{}}
	a.metrics = newMetrics(a)
	return a, nil
}

// Candidate reports whether a query could be an autopath candidate at all
// (A or AAAA, a name of the form X.<ns>.svc.<cluster domain>): a cheap
// test before Answer, allocation-free.
func (a *Autopath) Candidate(qname string, qtype uint16) bool {
	if qtype != dns.TypeA && qtype != dns.TypeAAAA {
		return false
	}
	if len(qname) <= len(a.svc) || !strings.EqualFold(qname[len(qname)-len(a.svc):], a.svc) {
		return false
	}
	// At least "X.ns" before ".svc.": one dot.
	return strings.IndexByte(qname[:len(qname)-len(a.svc)], '.') > 0
}

// CandidateWire is Candidate for a query name in wire form (uncompressed
// labels, as internal/wire parses it): the serving loops' test before the
// cache lookup. It allocates nothing and reads no shared state.
func (a *Autopath) CandidateWire(name []byte, qtype uint16) bool {
	if qtype != dns.TypeA && qtype != dns.TypeAAAA {
		return false
	}
	zone := a.svcWire
	if len(name) <= len(zone) {
		return false
	}
	// Walk the labels: at least two ("X.ns") before "svc.<cluster domain>.".
	labels := 0
	for off := 0; off < len(name); {
		rest := len(name) - off
		if rest == len(zone) {
			return labels >= 2 && wire.EqualNameFold(name[off:], zone)
		}
		l := int(name[off])
		if l == 0 || rest < len(zone) {
			return false
		}
		off += 1 + l
		labels++
	}
	return false
}

type memoKey struct {
	src  netip.Addr
	view uint8  // the listen address's view (Corefile views)
	name string // lower case, absolute
}

// decision is the outcome for (pod address, name), shared by the A and
// AAAA queries of one lookup. It holds no records: an answer is built from
// the cache's entry for the target, which the cache's byte budget bounds.
type decision struct {
	key     memoKey
	done    chan struct{}
	expires time.Time
	size    int // bytes counted in the memo; 0 when not memoised
	// Set before done closes:
	reason string // why autopath declined; "" when it answers
	at     time.Time
	target string // the candidate answered with
	saved  int    // client queries saved per answered query
	ttl    uint32 // smallest TTL of the skipped denials
	qtype  uint16 // the type whose walk decided
	// asked: the types the pod has asked for this name (typeBit), with
	// a.mu held: the walk asks the other type too once the pod has.
	asked uint8
}

func typeBit(t uint16) uint8 {
	if t == dns.TypeA {
		return 1
	}
	return 2
}

func other(t uint16) uint16 {
	if t == dns.TypeA {
		return dns.TypeAAAA
	}
	return dns.TypeA
}

// wasAsked reports whether the pod has asked qtype for d's name.
func (a *Autopath) wasAsked(d *decision, qtype uint16) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return d.asked&typeBit(qtype) != 0
}

// Decline reasons (the metric's label values).
const (
	ReasonNotSynced   = "watch_not_synced"
	ReasonUnknownPod  = "unknown_source"
	ReasonIneligible  = "pod_not_eligible"
	ReasonNotSearch   = "not_a_search_query"
	ReasonFirstExists = "first_candidate_exists"
	ReasonNoCandidate = "no_candidate_exists"
	ReasonAmbiguous   = "stub_resolvers_would_differ"
	ReasonFailure     = "resolution_failed"
	ReasonOverflow    = "memo_full"
	ReasonPodOverflow = "pod_memo_full"
	ReasonLarge       = "answer_too_large"
)

// Reasons lists every decline reason, for metrics.
var Reasons = []string{ReasonNotSynced, ReasonUnknownPod, ReasonIneligible, ReasonNotSearch,
	ReasonFirstExists, ReasonNoCandidate, ReasonAmbiguous, ReasonFailure, ReasonOverflow, ReasonPodOverflow, ReasonLarge}

// Answer returns the autopath answer to the query (qname as the client
// wrote it, qtype) from src, or nil when autopath declines and the query
// must be answered as usual. The answer has the question, rcode and
// sections set; the caller sets the ID, flags and EDNS as for any answer.
// It blocks while the candidates are resolved (at most the timeout).
//
// An error means ctx ended before the decision was known, or the target's
// answer could not be had: the caller must not answer as usual then (the
// other query of the pair may get the autopath answer), but drop the query
// as one it gave up on.
func (a *Autopath) Answer(ctx context.Context, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error) {
	return a.AnswerIn(ctx, 0, src, qname, qtype)
}

// AnswerIn is Answer for a query that arrived on view (the index of the
// Corefile view of its listen address): decisions are kept per view, and
// Resolve is expected to resolve through the same view (the daemon passes
// it in ctx).
func (a *Autopath) AnswerIn(ctx context.Context, view uint8, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error) {
	if !a.Candidate(qname, qtype) {
		return nil, nil
	}
	src = src.Unmap()
	key := memoKey{src: src, view: view, name: strings.ToLower(dns.Fqdn(qname))}
	d, owner := a.memoGet(key, qtype)
	var res Result
	if owner {
		res = a.decide(ctx, key, d, qtype)
		a.memoDone(d)
	}
	select {
	case <-d.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if d.reason != "" {
		a.metrics.declined.WithLabelValues(d.reason).Inc()
		return nil, nil
	}
	if !owner || qtype != d.qtype {
		// The other query of the pair (or a repeat): the target's answer of
		// this type, from the cache (the client's own walk would ask it).
		ctx, cancel := context.WithTimeout(context.WithValue(ctx, needRecordsKey{}, true), a.cfg.Timeout)
		defer cancel()
		var err error
		res, err = a.cfg.Resolve(ctx, d.target, qtype)
		if err != nil {
			return nil, err
		}
	}
	a.metrics.answered.Inc()
	a.metrics.saved.Add(float64(d.saved))
	return d.answer(qname, qtype, res, a.clk.Now()), nil
}

// entryBytes is what a decision for key costs in the memo, target included.
func entryBytes(key memoKey, target string) int {
	return entryOverhead + len(key.name) + len(target)
}

// memoGet returns the decision for key, creating it (owner true) when
// there is none alive. A new decision is memoised when the memo and the
// pod's share have room for it (with a target as long as the name and
// another 255 bytes: the largest the target can make it); otherwise every
// new lookup (or the pod's) declines for a memo TTL, so both queries of a
// pair decline alike.
func (a *Autopath) memoGet(key memoKey, qtype uint16) (*decision, bool) {
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if d, ok := a.memo[key]; ok && now.Before(d.expires) {
		d.asked |= typeBit(qtype)
		return d, false
	}
	a.sweep(now)
	d := &decision{key: key, done: make(chan struct{}), expires: now.Add(a.cfg.MemoTTL), asked: typeBit(qtype)}
	size := entryBytes(key, key.name) + 255
	pu := a.pods[key.src]
	if pu == nil {
		pu = &podUse{}
	}
	switch {
	case now.Before(a.overflowUntil):
		d.reason = ReasonOverflow
	case now.Before(pu.overflowUntil):
		d.reason = ReasonPodOverflow
	case a.bytes+size > a.cfg.MemoBytes:
		a.overflowUntil = now.Add(a.cfg.MemoTTL)
		d.reason = ReasonOverflow
	case pu.bytes+size > a.cfg.PodMemoBytes:
		pu.overflowUntil = now.Add(a.cfg.MemoTTL)
		a.pods[key.src] = pu
		d.reason = ReasonPodOverflow
	}
	if d.reason != "" {
		close(d.done)
		return d, false
	}
	if old, ok := a.memo[key]; ok {
		a.forget(old) // expired, not yet swept
	}
	d.size = size
	a.memo[key] = d
	a.queue = append(a.queue, d)
	a.bytes += size
	pu.bytes += size
	a.pods[key.src] = pu
	return d, true
}

// memoDone settles d's size (its target is known now) and releases its
// waiters.
func (a *Autopath) memoDone(d *decision) {
	a.mu.Lock()
	if d.size > 0 && a.memo[d.key] == d {
		real := entryBytes(d.key, d.target)
		a.bytes += real - d.size
		if pu := a.pods[d.key.src]; pu != nil {
			pu.bytes += real - d.size
		}
		d.size = real
	}
	a.mu.Unlock()
	close(d.done)
}

// sweep removes the expired decisions at the front of the queue. With
// a.mu held.
func (a *Autopath) sweep(now time.Time) {
	for a.head < len(a.queue) && !now.Before(a.queue[a.head].expires) {
		d := a.queue[a.head]
		a.queue[a.head] = nil
		a.head++
		if a.memo[d.key] == d {
			delete(a.memo, d.key)
			a.forget(d)
		}
	}
	if a.head > 64 && a.head*2 > len(a.queue) {
		n := copy(a.queue, a.queue[a.head:])
		clear(a.queue[n:])
		a.queue = a.queue[:n]
		a.head = 0
	}
}

// forget releases d's bytes (d is leaving the memo or was replaced). With
// a.mu held.
func (a *Autopath) forget(d *decision) {
	a.bytes -= d.size
	if pu := a.pods[d.key.src]; pu != nil {
		pu.bytes -= d.size
		if pu.bytes == 0 && !d.expires.Before(pu.overflowUntil) {
			delete(a.pods, d.key.src)
		}
	}
	d.size = 0
}

// decide fills d, walking the candidates for qtype, and returns the
// target's result for qtype when autopath answers. Every way out but the
// last declines.
func (a *Autopath) decide(ctx context.Context, key memoKey, d *decision, qtype uint16) Result {
	pod, state := a.cfg.Pods.Lookup(key.src)
	switch {
	case state != kubewatch.Synced:
		d.reason = ReasonNotSynced
		return Result{}
	case pod == nil:
		d.reason = ReasonUnknownPod
		return Result{}
	case pod.Ineligible != "":
		d.reason = ReasonIneligible
		return Result{}
	}
	cands, ok := candidates(pod, key.name)
	if !ok {
		d.reason = ReasonNotSearch
		return Result{}
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	k, res, reason := a.walk(ctx, d, cands, qtype)
	if reason != "" {
		d.reason = reason
		return Result{}
	}
	d.at = a.clk.Now()
	d.target = cands[k]
	d.saved = k
	d.qtype = qtype
	d.ttl = res.skippedTTL
	a.metrics.lookups.Inc()
	return res.Result
}

// walkResult is the target's result and the smallest TTL of the denials
// walked past.
type walkResult struct {
	Result
	skippedTTL uint32
}

// walk asks the candidates one after the other, in the client's order,
// for qtype, and for the other type too once the pod has asked it (the two
// queries of a getaddrinfo with AF_UNSPEC: its walk asks both at every
// candidate, in parallel). It stops where the client's own walk would: it
// sends upstream no name (and no type) the client would not have sent, and
// none after the one the client would have stopped at. Every answer it
// fetches is cached, so when autopath declines, the client's walk replays
// it locally.
//
//   - The first candidate is the client's own query: any answer but
//     NXDOMAIN is the client's answer (declined, answered as usual from
//     the cache), without touching the other candidates.
//   - NXDOMAIN moves on: every stub resolver walks past it. NXDOMAIN is
//     for the name, whatever the type (RFC 8020), so the other type's
//     walk would end at the same candidate; where the other type's answer
//     is known it must be NXDOMAIN too.
//   - A candidate with records of qtype is the target.
//   - NODATA for qtype where the pod asked the other type and the
//     candidate has records of it: every stub resolver's AF_UNSPEC walk
//     ends there, with the other type's addresses; the target.
//   - NODATA at the last candidate: every stub resolver ends there without
//     an address of qtype; the target (CNAME and no records).
//   - NODATA otherwise, or a failure: glibc and Go walk on, musl stops
//     after NODATA, everyone retries or gives up on SERVFAIL: declined,
//     the client walks by itself.
func (a *Autopath) walk(ctx context.Context, d *decision, cands []string, qtype uint16) (int, walkResult, string) {
	skipped := ^uint32(0)
	o := other(qtype)
	for i, c := range cands {
		var r, ro Result
		var err, erro error
		both := a.wasAsked(d, o)
		if both {
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				ro, erro = a.cfg.Resolve(ctx, c, o)
			}()
			r, err = a.cfg.Resolve(ctx, c, qtype)
			wg.Wait()
			a.metrics.resolved.Add(2)
		} else {
			r, err = a.cfg.Resolve(ctx, c, qtype)
			a.metrics.resolved.Inc()
		}
		if err != nil || erro != nil {
			return 0, walkResult{}, ReasonFailure
		}
		switch {
		case r.Rcode == dns.RcodeNameError && (!both || ro.Rcode == dns.RcodeNameError):
			skipped = min(skipped, r.TTL)
			if both {
				skipped = min(skipped, ro.TTL)
			}
			continue
		case i == 0:
			return 0, walkResult{}, ReasonFirstExists
		case r.Rcode != dns.RcodeSuccess || (both && ro.Rcode != dns.RcodeSuccess):
			return 0, walkResult{}, ReasonAmbiguous
		case r.Large || (both && ro.Large):
			return 0, walkResult{}, ReasonLarge
		case r.has(qtype) || i == len(cands)-1:
			return i, walkResult{Result: r, skippedTTL: skipped}, ""
		case !both && a.wasAsked(d, o):
			// NODATA, and the pod's other query came meanwhile: ask it here.
			ro, erro = a.cfg.Resolve(ctx, c, o)
			a.metrics.resolved.Inc()
			if erro != nil {
				return 0, walkResult{}, ReasonFailure
			}
			if ro.Rcode == dns.RcodeSuccess && ro.has(o) {
				return i, walkResult{Result: r, skippedTTL: skipped}, ""
			}
			return 0, walkResult{}, ReasonAmbiguous
		case both && ro.has(o):
			return i, walkResult{Result: r, skippedTTL: skipped}, ""
		default:
			return 0, walkResult{}, ReasonAmbiguous
		}
	}
	return 0, walkResult{}, ReasonNoCandidate
}

// candidates are the names the pod's resolver would ask after name (its
// first candidate, X.<first search domain>), in its order, name first;
// ok is false when name is not such a query.
func candidates(p *podwatch.Pod, name string) ([]string, bool) {
	if len(p.Search) == 0 {
		return nil, false
	}
	suffix := "." + p.Search[0] + "."
	if !strings.HasSuffix(name, suffix) || len(name) == len(suffix) {
		return nil, false
	}
	x := name[:len(name)-len(suffix)]
	dots := strings.Count(x, ".")
	if dots >= p.Ndots {
		// The resolver asked X as it is first: not a plain search walk.
		return nil, false
	}
	if dots == 0 && p.NoTLDQuery {
		// glibc would not ask X itself at the end, musl would.
		return nil, false
	}
	out := make([]string, 0, len(p.Search)+1)
	for _, s := range p.Search {
		out = append(out, x+"."+s+".")
	}
	out = append(out, x+".")
	for _, c := range out {
		// 254 with the root dot: longer names are not asked (glibc gives
		// up on the whole search then, Go skips them).
		if len(c) > 254 {
			return nil, false
		}
	}
	return out, true
}

func hasType(rrs []dns.RR, t uint16) bool {
	for _, rr := range rrs {
		if rr.Header().Rrtype == t {
			return true
		}
	}
	return false
}

// answer builds the reply for qtype from the target's result r: a CNAME
// from the name asked (in the client's case) to the target, then the
// target's records of that type, or its authority section when it has
// none. Every TTL is the smallest involved, the skipped denials' less the
// decision's age.
func (d *decision) answer(qname string, qtype uint16, r Result, now time.Time) *dns.Msg {
	ttl := d.ttl
	age := uint32(now.Sub(d.at) / time.Second)
	if age >= ttl {
		ttl = 0
	} else {
		ttl -= age
	}
	if len(r.Answer) > 0 || r.Rcode != dns.RcodeSuccess || len(r.Ns) > 0 {
		ttl = min(ttl, r.TTL)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(qname), qtype)
	m.Response = true
	m.Rcode = r.Rcode
	m.Answer = append(m.Answer, &dns.CNAME{
		Hdr:    dns.RR_Header{Name: dns.Fqdn(qname), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl},
		Target: d.target,
	})
	// The records are this query's own (Resolve unpacks them for each
	// call): their TTLs are set in place, not on copies.
	for _, rr := range r.Answer {
		rr.Header().Ttl = ttl
		m.Answer = append(m.Answer, rr)
	}
	if !hasType(r.Answer, qtype) {
		for _, rr := range r.Ns {
			rr.Header().Ttl = min(rr.Header().Ttl, ttl)
			m.Ns = append(m.Ns, rr)
		}
	}
	return m
}
