package autopath

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync/atomic"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Hook joins autopath's parts for the server (server.Autopath): the
// decision (Autopath), the pod watch (internal/podwatch, set by SetWatch
// once it runs) and the Resolver it resolves candidates through (the
// cache, as any miss). Until the watch is synced no query is a candidate.
type Hook struct {
	ap    *Autopath
	watch atomic.Pointer[podwatch.Watch]
	view  ViewOf
}

// ViewOf returns the Resolver and view index of the view a candidate's
// query arrived on (server.CandidateView); ok false: none known.
type ViewOf func(ctx context.Context) (res *resolve.Resolver, view uint8, ok bool)

// HookConfig is what a Hook is built from.
type HookConfig struct {
	Resolver      *resolve.Resolver // the one view's (a query's own view is used when it has one)
	Clock         clock.Clock
	ClusterDomain string
	UDPSize       uint16 // -max-udp-size: the size candidate answers are written at
	View          ViewOf // server.CandidateView
}

// NewHook builds the hook around c.Resolver.
func NewHook(c HookConfig) (*Hook, error) {
	h := &Hook{view: c.View}
	ap, err := New(Config{
		Pods: h, Resolve: resolveCandidate(c.Resolver, c.View, clock.Or(c.Clock), c.UDPSize),
		ClusterDomain: c.ClusterDomain, Clock: c.Clock,
	})
	if err != nil {
		return nil, err
	}
	h.ap = ap
	return h, nil
}

// Collectors are the decision's metrics (Autopath.Collectors).
func (h *Hook) Collectors() []prometheus.Collector { return h.ap.Collectors() }

// SetWatch gives the hook the running pod watch.
func (h *Hook) SetWatch(w *podwatch.Watch) { h.watch.Store(w) }

// Lookup is Pods: nothing is known before the watch runs.
func (h *Hook) Lookup(ip netip.Addr) (*podwatch.Pod, podwatch.State) {
	w := h.watch.Load()
	if w == nil {
		return nil, kubewatch.Starting
	}
	return w.Lookup(ip)
}

// Candidate is the serving loops' test: allocation-free, a few loads and
// a walk over the name's labels.
func (h *Hook) Candidate(q *wire.Query) bool {
	w := h.watch.Load()
	return w != nil && w.State() == kubewatch.Synced && h.ap.CandidateWire(q.Name, q.Type)
}

// Answer is the decision, in the miss goroutine, for the view the query
// arrived on (decisions are kept per view).
func (h *Hook) Answer(ctx context.Context, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error) {
	_, view, _ := h.view(ctx)
	return h.ap.AnswerIn(ctx, view, src, qname, qtype)
}

// maxCandidateUnpack: a candidate answer larger than this (in wire bytes,
// as the cache writes it) is not unpacked while autopath decides; it
// declines such a target (Result.Large). 4 KiB is the largest UDP
// answer a client takes by default (-max-client-udp-size), and an unpacked
// answer takes several times its wire size: at most 1024 misses in flight
// (-max-inflight) hold at most a few tens of MiB of unpacked answers.
const maxCandidateUnpack = 4096

// resolveCandidate resolves a candidate through the Resolver: the cache,
// coalescing, admission and serve-stale of any miss, and what it fetches
// is stored, so the client's follow-up queries (the CNAME's target) are
// hits. The TTL is the smallest of the answer's records, or the denial's
// negative TTL (the SOA's TTL, at most its MINIMUM: RFC 2308 §5).
func resolveCandidate(res *resolve.Resolver, viewOf ViewOf, clk clock.Clock, udpSize uint16) Resolve {
	// largeUnpacks bounds the large answers unpacked at once for the rare
	// pair whose second type's answer is large after the first decided
	// (the hook's own, not the process's).
	largeUnpacks := make(chan struct{}, 4)
	return func(ctx context.Context, name string, qtype uint16) (Result, error) {
		qm := new(dns.Msg)
		qm.SetQuestion(name, qtype)
		raw, err := qm.Pack()
		if err != nil {
			return Result{}, err
		}
		var q wire.Query
		if err := wire.ParseQuery(raw, &q); err != nil {
			return Result{}, err
		}
		q.From = resolve.Asker(ctx) // the pod's, when the server records askers
		r := res
		if vr, view, ok := viewOf(ctx); ok && vr != nil {
			// The view the client's query arrived on: its zones, forwards
			// and refusals, and its cache key.
			r, q.View = vr, view
		}
		e, stale, err := r.Resolve(ctx, &q, nil)
		if err != nil {
			return Result{}, err
		}
		var out []byte
		if stale {
			out = e.WriteStale(nil, &q, 0xFFFF, udpSize)
		} else {
			out = e.Write(nil, &q, clk.Now().UnixNano(), 0xFFFF, udpSize)
		}
		if len(out) > maxCandidateUnpack {
			if !NeedsRecords(ctx) {
				// Deciding: autopath declines a large target, so only the
				// header is read (a hostile pod's large answers are never
				// unpacked while it walks).
				return Result{Rcode: int(out[3] & 0xF), Large: true,
					HasRecords: binary.BigEndian.Uint16(out[6:8]) > 0}, nil
			}
			// The other query of a pair decided on: built, a few at a time.
			select {
			case largeUnpacks <- struct{}{}:
				defer func() { <-largeUnpacks }()
			case <-ctx.Done():
				return Result{}, ctx.Err()
			}
		}
		var am dns.Msg
		if err := am.Unpack(out); err != nil {
			return Result{}, err
		}
		ar := Result{Rcode: am.Rcode, Answer: am.Answer, Ns: am.Ns}
		if len(am.Answer) > 0 {
			ar.TTL = ^uint32(0)
			for _, rr := range am.Answer {
				ar.TTL = min(ar.TTL, rr.Header().Ttl)
			}
			return ar, nil
		}
		for _, rr := range am.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ar.TTL = min(soa.Hdr.Ttl, soa.Minttl)
			}
		}
		return ar, nil
	}
}
