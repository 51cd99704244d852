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
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
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
}

// Resolve resolves one name (absolute, with trailing dot) and type through
// the daemon's cache and coalescing. An error is a failure to get an
// answer (timeout, overload), not a DNS denial.
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
	// DefaultMemoEntries bounds the memo: about 200 bytes each without
	// results, a few KiB with, so at most tens of MiB under a flood of
	// distinct names; past it autopath declines for a memo TTL.
	DefaultMemoEntries = 16384
)

// Config wires an Autopath.
type Config struct {
	Pods    Pods
	Resolve Resolve
	// ClusterDomain ("cluster.local."): only names under it are candidates.
	ClusterDomain string
	Clock         clock.Clock
	MemoTTL       time.Duration
	Timeout       time.Duration
	MemoEntries   int
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
	// overflowUntil: the memo was full; every new lookup declines until
	// then, so both queries of a pair decline alike.
	overflowUntil time.Time
	// nextSweep: when expired decisions are next removed.
	nextSweep time.Time

	metrics *metrics
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
	if cfg.MemoEntries <= 0 {
		cfg.MemoEntries = DefaultMemoEntries
	}
	buf := make([]byte, 256)
	n, err := dns.PackDomainName("svc."+cd, buf, 0, nil, false)
	if err != nil {
		return nil, fmt.Errorf("autopath: cluster domain %q: %w", cfg.ClusterDomain, err)
	}
	a := &Autopath{cfg: cfg, clk: clock.Or(cfg.Clock), svc: ".svc." + cd, svcWire: buf[:n:n], memo: map[memoKey]*decision{}}
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
			return labels >= 2 && equalFold(name[off:], zone)
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

// equalFold compares wire names ignoring ASCII case (length bytes are
// below 64, so they never change under the folding).
func equalFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

type memoKey struct {
	src  netip.Addr
	name string // lower case, absolute
}

// decision is the outcome for (pod address, name), shared by the A and
// AAAA queries of one lookup.
type decision struct {
	done    chan struct{}
	expires time.Time
	// Set before done closes:
	reason string // why autopath declined; "" when it answers
	at     time.Time
	target string            // the candidate answered with
	saved  int               // client queries per type saved
	ttl    uint32            // smallest TTL of the skipped denials
	res    map[uint16]Result // target's results by type
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
)

// Reasons lists every decline reason, for metrics.
var Reasons = []string{ReasonNotSynced, ReasonUnknownPod, ReasonIneligible, ReasonNotSearch,
	ReasonFirstExists, ReasonNoCandidate, ReasonAmbiguous, ReasonFailure, ReasonOverflow}

// Answer returns the autopath answer to the query (qname as the client
// wrote it, qtype) from src, or nil when autopath declines and the query
// must be answered as usual. The answer has the question, rcode and
// sections set; the caller sets the ID, flags and EDNS as for any answer.
// It blocks while the candidates are resolved (at most the timeout).
//
// An error means ctx ended before the decision was known: the caller must
// not answer as usual then (the other query of the pair may get the
// autopath answer), but drop the query as one it gave up on.
func (a *Autopath) Answer(ctx context.Context, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error) {
	if !a.Candidate(qname, qtype) {
		return nil, nil
	}
	src = src.Unmap()
	key := memoKey{src: src, name: strings.ToLower(dns.Fqdn(qname))}
	d, owner := a.memoGet(key)
	if owner {
		a.decide(ctx, key, d)
		close(d.done)
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
	a.metrics.answered.Inc()
	a.metrics.saved.Add(float64(d.saved))
	return d.answer(qname, qtype, a.clk.Now()), nil
}

// memoGet returns the decision for key, creating it (owner true) when
// there is none alive.
func (a *Autopath) memoGet(key memoKey) (*decision, bool) {
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if d, ok := a.memo[key]; ok && now.Before(d.expires) {
		return d, false
	}
	d := &decision{done: make(chan struct{}), expires: now.Add(a.cfg.MemoTTL)}
	if len(a.memo) >= a.cfg.MemoEntries || !now.Before(a.nextSweep) {
		for k, old := range a.memo {
			if !now.Before(old.expires) {
				delete(a.memo, k)
			}
		}
		a.nextSweep = now.Add(a.cfg.MemoTTL)
		if len(a.memo) >= a.cfg.MemoEntries {
			a.overflowUntil = now.Add(a.cfg.MemoTTL)
		}
	}
	if now.Before(a.overflowUntil) {
		// Not memoised; every lookup declines until overflowUntil.
		d.reason = ReasonOverflow
		close(d.done)
		return d, false
	}
	a.memo[key] = d
	return d, true
}

// decide fills d. Every way out but the last declines.
func (a *Autopath) decide(ctx context.Context, key memoKey, d *decision) {
	pod, state := a.cfg.Pods.Lookup(key.src)
	switch {
	case state != podwatch.Synced:
		d.reason = ReasonNotSynced
		return
	case pod == nil:
		d.reason = ReasonUnknownPod
		return
	case pod.Ineligible != "":
		d.reason = ReasonIneligible
		return
	}
	cands, ok := candidates(pod, key.name)
	if !ok {
		d.reason = ReasonNotSearch
		return
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	res, err := a.resolveAll(ctx, cands)
	if err != nil {
		d.reason = ReasonFailure
		return
	}
	k, reason := choose(res)
	if reason != "" {
		d.reason = reason
		return
	}
	d.at = a.clk.Now()
	d.target = cands[k]
	d.saved = k
	d.ttl = ^uint32(0)
	for _, r := range res[:k] {
		d.ttl = min(d.ttl, r[0].TTL, r[1].TTL)
	}
	d.res = map[uint16]Result{dns.TypeA: res[k][0], dns.TypeAAAA: res[k][1]}
	a.metrics.lookups.Inc()
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

// resolveAll resolves every candidate for A and AAAA in parallel.
func (a *Autopath) resolveAll(ctx context.Context, cands []string) ([][2]Result, error) {
	res := make([][2]Result, len(cands))
	errs := make([]error, 2*len(cands))
	var wg sync.WaitGroup
	for i, c := range cands {
		for j, t := range [2]uint16{dns.TypeA, dns.TypeAAAA} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i][j], errs[2*i+j] = a.cfg.Resolve(ctx, c, t)
			}()
		}
	}
	wg.Wait()
	a.metrics.resolved.Add(float64(2 * len(cands)))
	return res, errors.Join(errs...)
}

// choose picks the candidate every stub resolver would end with, or says
// why autopath must decline. The stubs differ on some answers: glibc moves
// on after NXDOMAIN, NODATA and SERVFAIL; musl only after NXDOMAIN; Go
// after any answer without addresses. Autopath answers only where they all
// agree:
//   - every candidate before the chosen one is NXDOMAIN for A and AAAA;
//   - the chosen one is NOERROR for both and has records of at least one;
//   - a type it has no records of has none at any later candidate either
//     (a client asking only that type would walk on and find them).
func choose(res [][2]Result) (int, string) {
	for i, r := range res {
		a, aaaa := r[0].Rcode, r[1].Rcode
		switch {
		case a == dns.RcodeNameError && aaaa == dns.RcodeNameError:
			continue
		case a != dns.RcodeSuccess || aaaa != dns.RcodeSuccess:
			// SERVFAIL and friends, or NXDOMAIN for one type only.
			return 0, ReasonAmbiguous
		case i == 0:
			return 0, ReasonFirstExists
		}
		hasA, hasAAAA := hasType(r[0].Answer, dns.TypeA), hasType(r[1].Answer, dns.TypeAAAA)
		if !hasA && !hasAAAA {
			// Exists without addresses: musl stops, glibc and Go walk on.
			return 0, ReasonAmbiguous
		}
		for _, later := range res[i+1:] {
			if !hasA && (later[0].Rcode != dns.RcodeNameError && (later[0].Rcode != dns.RcodeSuccess || hasType(later[0].Answer, dns.TypeA))) {
				return 0, ReasonAmbiguous
			}
			if !hasAAAA && (later[1].Rcode != dns.RcodeNameError && (later[1].Rcode != dns.RcodeSuccess || hasType(later[1].Answer, dns.TypeAAAA))) {
				return 0, ReasonAmbiguous
			}
		}
		return i, ""
	}
	return 0, ReasonNoCandidate
}

func hasType(rrs []dns.RR, t uint16) bool {
	for _, rr := range rrs {
		if rr.Header().Rrtype == t {
			return true
		}
	}
	return false
}

// answer builds the reply for qtype: a CNAME from the name asked (in the
// client's case) to the target, then the target's records of that type,
// or its authority section when it has none. Every TTL is the smallest
// involved, less the decision's age.
func (d *decision) answer(qname string, qtype uint16, now time.Time) *dns.Msg {
	r := d.res[qtype]
	ttl := min(d.ttl, r.TTL)
	age := uint32(now.Sub(d.at) / time.Second)
	if age >= ttl {
		ttl = 0
	} else {
		ttl -= age
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(qname), qtype)
	m.Response = true
	m.Rcode = dns.RcodeSuccess
	m.Answer = append(m.Answer, &dns.CNAME{
		Hdr:    dns.RR_Header{Name: dns.Fqdn(qname), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl},
		Target: d.target,
	})
	for _, rr := range r.Answer {
		c := dns.Copy(rr)
		c.Header().Ttl = ttl
		m.Answer = append(m.Answer, c)
	}
	if !hasType(r.Answer, qtype) {
		for _, rr := range r.Ns {
			c := dns.Copy(rr)
			c.Header().Ttl = min(c.Header().Ttl, ttl)
			m.Ns = append(m.Ns, c)
		}
	}
	return m
}
