package daemon

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/miekg/dns"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/nodelocaldns/nodelocaldns/internal/autopath"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// autopathHook joins -autopath's parts for the server (server.Autopath):
// the decision (internal/autopath), the pod watch (internal/podwatch, set
// by startPodWatch once it runs) and the Resolver it resolves candidates
// through. Until the watch is synced no query is a candidate.
type autopathHook struct {
	ap    *autopath.Autopath
	watch atomic.Pointer[podwatch.Watch]
}

// newAutopath builds the hook around res; nil when -autopath is off.
func (d *Daemon) newAutopath(res *resolve.Resolver) (*autopathHook, error) {
	if !d.cfg.Autopath.Enabled {
		return nil, nil
	}
	h := &autopathHook{}
	ap, err := autopath.New(autopath.Config{
		Pods: h, Resolve: resolveCandidate(res, d.clock, uint16(d.cfg.MaxUDPSize)),
		ClusterDomain: d.cfg.ClusterDomain, Clock: d.clock,
	})
	if err != nil {
		return nil, fmt.Errorf("-autopath: %w", err)
	}
	h.ap = ap
	d.Metrics.Registry.MustRegister(ap.Collectors()...)
	return h, nil
}

// Lookup is autopath.Pods: nothing is known before the watch runs.
func (h *autopathHook) Lookup(ip netip.Addr) (*podwatch.Pod, podwatch.State) {
	w := h.watch.Load()
	if w == nil {
		return nil, podwatch.Starting
	}
	return w.Lookup(ip)
}

// Candidate is the serving loops' test: allocation-free, a few loads and
// a walk over the name's labels.
func (h *autopathHook) Candidate(q *wire.Query) bool {
	w := h.watch.Load()
	return w != nil && w.State() == podwatch.Synced && h.ap.CandidateWire(q.Name, q.Type)
}

// Answer is the decision, in the miss goroutine, for the view the query
// arrived on (decisions are kept per view).
func (h *autopathHook) Answer(ctx context.Context, src netip.Addr, qname string, qtype uint16) (*dns.Msg, error) {
	_, view, _ := server.CandidateView(ctx)
	return h.ap.AnswerIn(ctx, view, src, qname, qtype)
}

// maxCandidateUnpack: a candidate answer larger than this (in wire bytes,
// as the cache writes it) is not unpacked while autopath decides; it
// declines such a target (autopath.Result.Large). 4 KiB is the largest UDP
// answer a client takes by default (-max-client-udp-size), and an unpacked
// answer takes several times its wire size: at most 1024 misses in flight
// (-max-inflight) hold at most a few tens of MiB of unpacked answers.
const maxCandidateUnpack = 4096

// largeUnpacks bounds the large answers unpacked at once for the rare
// pair whose second type's answer is large after the first decided.
var largeUnpacks = make(chan struct{}, 4)

// resolveCandidate resolves a candidate through the Resolver: the cache,
// coalescing, admission and serve-stale of any miss, and what it fetches
// is stored, so the client's follow-up queries (the CNAME's target) are
// hits. The TTL is the smallest of the answer's records, or the denial's
// negative TTL (the SOA's TTL, at most its MINIMUM: RFC 2308 §5).
func resolveCandidate(res *resolve.Resolver, clk clock.Clock, udpSize uint16) autopath.Resolve {
	return func(ctx context.Context, name string, qtype uint16) (autopath.Result, error) {
		qm := new(dns.Msg)
		qm.SetQuestion(name, qtype)
		raw, err := qm.Pack()
		if err != nil {
			return autopath.Result{}, err
		}
		var q wire.Query
		if err := wire.ParseQuery(raw, &q); err != nil {
			return autopath.Result{}, err
		}
		q.From = resolve.Asker(ctx) // the pod's, when the server records askers
		r := res
		if vr, view, ok := server.CandidateView(ctx); ok && vr != nil {
			// The view the client's query arrived on: its zones, forwards
			// and refusals, and its cache key.
			r, q.View = vr, view
		}
		e, stale, err := r.Resolve(ctx, &q)
		if err != nil {
			return autopath.Result{}, err
		}
		var out []byte
		if stale {
			out = e.WriteStale(nil, &q, 0xFFFF, udpSize)
		} else {
			out = e.Write(nil, &q, clk.Now().UnixNano(), 0xFFFF, udpSize)
		}
		if len(out) > maxCandidateUnpack {
			if !autopath.NeedsRecords(ctx) {
				// Deciding: autopath declines a large target, so only the
				// header is read (a hostile pod's large answers are never
				// unpacked while it walks).
				return autopath.Result{Rcode: int(out[3] & 0xF), Large: true,
					HasRecords: binary.BigEndian.Uint16(out[6:8]) > 0}, nil
			}
			// The other query of a pair decided on: built, a few at a time.
			select {
			case largeUnpacks <- struct{}{}:
				defer func() { <-largeUnpacks }()
			case <-ctx.Done():
				return autopath.Result{}, ctx.Err()
			}
		}
		var am dns.Msg
		if err := am.Unpack(out); err != nil {
			return autopath.Result{}, err
		}
		ar := autopath.Result{Rcode: am.Rcode, Answer: am.Answer, Ns: am.Ns}
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

// startPodWatch starts -autopath's watch of this node's pods and registers
// its metrics. The watch never stops DNS: a lost API server only turns
// autopath off (podwatch.State) until it recovers.
func (d *Daemon) startPodWatch() error {
	if d.autopath == nil {
		return nil
	}
	rc := d.opt.KubeConfig
	if rc == nil {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			return fmt.Errorf("-autopath: API server credentials: %w (is the service account token mounted? deploy/daemonset.yaml)", err)
		}
	}
	node, err := podwatch.ReadNodeResolvConf(d.cfg.Autopath.NodeResolvConf)
	if err != nil {
		return fmt.Errorf("-autopath: %w", err)
	}
	// client-go logs through klog: into our log instead of its own format.
	klog.SetSlogLogger(d.log.With("component", "client-go"))
	w, err := podwatch.New(podwatch.Config{
		Rest: rc, NodeName: d.cfg.Autopath.NodeName, ClusterDomain: d.cfg.ClusterDomain,
		Node: node, Logger: d.log,
	})
	if err != nil {
		return fmt.Errorf("-autopath: %w", err)
	}
	d.Metrics.Registry.MustRegister(w.Collectors()...)
	d.PodWatch = w
	d.autopath.watch.Store(w)
	ctx, cancel := context.WithCancel(context.Background())
	d.stopPodWatch = cancel
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		w.Run(ctx)
	}()
	d.log.Info("-autopath: watching this node's pods; autopath answers once the watch is synced",
		"node", d.cfg.Autopath.NodeName, "node_search", fmt.Sprint(node.Search))
	return nil
}
