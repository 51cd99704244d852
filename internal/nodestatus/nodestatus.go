// Package nodestatus keeps the daemon's readiness on its Node object
// (issue 40): a node condition of its own, which a Node Readiness
// Controller rule can wait for (deploy/node-readiness/), and optionally a
// label (GKE's addon.gke.io/node-local-dns-ds-ready). It writes them
// through the API server as the node itself (constrained impersonation:
// its own Node only) or as the pod's service account.
//
// It decides nothing: the daemon says ready or not (Set). It never reads
// the Node (no get or watch is granted), never blocks its caller and never
// touches DNS: one goroutine (Run) writes the latest state, retrying with
// a backoff, and Flush waits for that write within the caller's bound. A
// write that is refused is logged once per cause and counted.
package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
)

// forbiddenBackoff bounds the wait between writes refused for want of a
// grant.
const forbiddenBackoff = 5 * time.Minute

// Config says where and how to write.
type Config struct {
	// Rest reaches the API server (in-cluster credentials in a pod).
	Rest *rest.Config
	// Node is this node's name.
	Node string
	// Condition is the condition type kept ("" none); Label the label key
	// kept "true" while ready ("" none).
	Condition, Label string
	// AsNode writes as system:node:<Node> (the API server's constrained
	// impersonation, "associated-node": only the node the pod's token is
	// bound to), else as the credentials' own identity.
	AsNode bool
	Logger *slog.Logger
	// Backoff bounds the wait between failed writes (the first is
	// MinBackoff); zero: 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
}

// State is what the node should show.
type State struct {
	Ready bool
	// Reason is a CamelCase word (the condition's reason); Message says
	// why in a sentence.
	Reason, Message string
}

// Reporter writes the latest State to the Node.
type Reporter struct {
	cfg    Config
	client *rest.RESTClient
	log    *slog.Logger

	mu      sync.Mutex
	want    State
	wantSeq uint64 // Set calls
	doneSeq uint64 // the Set whose state the Node shows
	lastErr error
	written *State // the last state written; nil: none yet
	wake    chan struct{}
	flushed chan struct{} // closed and replaced whenever doneSeq moves

	writes *prometheus.CounterVec
	ready  prometheus.Gauge
}

// New makes a reporter; it writes nothing until Set and Run.
func New(cfg Config) (*Reporter, error) {
	if cfg.Node == "" || (cfg.Condition == "" && cfg.Label == "") {
		return nil, errors.New("nodestatus: a node name and a condition or a label are needed")
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	rc := rest.CopyConfig(cfg.Rest)
	if cfg.AsNode {
		// Constrained impersonation takes the user name only.
		rc.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + cfg.Node}
	}
	client, err := kubewatch.RESTClient(rc, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, "nodelocaldns-nodestatus")
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reporter{
		cfg: cfg, client: client, log: cfg.Logger.With("component", "nodestatus", "node", cfg.Node),
		wake: make(chan struct{}, 1), flushed: make(chan struct{}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodelocaldns_node_status_writes_total",
			Help: "Writes of the readiness condition and label to this node's Node object, by result (ok, forbidden, error).",
		}, []string{"result"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodelocaldns_node_status_ready",
			Help: "The readiness the daemon keeps on its Node: 1 ready, 0 not ready, -1 not written yet (or the last write failed).",
		}),
	}, nil
}

// Collectors are the reporter's metrics.
func (r *Reporter) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.writes, r.ready}
}

// Set makes s the state to write; a state equal to the last one set is
// nothing new. It never blocks.
func (r *Reporter) Set(s State) {
	r.mu.Lock()
	if r.wantSeq > 0 && s == r.want {
		r.mu.Unlock()
		return
	}
	r.want = s
	r.wantSeq++
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Flush waits until the Node shows the last state set, or ctx ends; it
// returns the last write's error then.
func (r *Reporter) Flush(ctx context.Context) error {
	for {
		r.mu.Lock()
		done, ch := r.doneSeq >= r.wantSeq, r.flushed
		r.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			r.mu.Lock()
			err := r.lastErr
			r.mu.Unlock()
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("node %s not updated: %w", r.cfg.Node, err)
		}
	}
}

// Run writes every state set until ctx ends: the latest one, again after
// a failure (backoff MinBackoff doubling to MaxBackoff).
func (r *Reporter) Run(ctx context.Context) {
	r.ready.Set(-1)
	backoff := r.cfg.MinBackoff
	var retry <-chan time.Time
	var lastCause string
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-retry:
		}
		retry = nil
		r.mu.Lock()
		s, seq := r.want, r.wantSeq
		r.mu.Unlock()
		if seq == 0 || seq == r.doneSeqNow() {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.write(wctx, s)
		cancel()
		r.finish(seq, s, err)
		if err == nil {
			backoff, lastCause = r.cfg.MinBackoff, ""
			r.log.Info("node status written", "ready", s.Ready, "reason", s.Reason, "condition", r.cfg.Condition, "label", r.cfg.Label)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if cause := causeOf(err); cause != lastCause {
			lastCause = cause
			r.log.Error("node status not written; retrying", "ready", s.Ready, "err", err, "hint", r.hint(err))
		}
		retry = time.After(backoff)
		limit := r.cfg.MaxBackoff
		if apierrors.IsForbidden(err) {
			// A missing grant is fixed by hand: every node's pod asking
			// every 30 s would load the API server for nothing.
			limit = max(limit, forbiddenBackoff)
		}
		backoff = min(2*backoff, limit)
	}
}

func (r *Reporter) doneSeqNow() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.doneSeq
}

// finish records a write of the state of Set number seq.
func (r *Reporter) finish(seq uint64, s State, err error) {
	result := "ok"
	switch {
	case apierrors.IsForbidden(err):
		result = "forbidden"
	case err != nil:
		result = "error"
	}
	r.writes.WithLabelValues(result).Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastErr = err
	if err != nil {
		r.ready.Set(-1)
		return
	}
	r.written = &s
	r.ready.Set(map[bool]float64{true: 1, false: 0}[s.Ready])
	if seq > r.doneSeq {
		r.doneSeq = seq
		close(r.flushed)
		r.flushed = make(chan struct{})
	}
}

// write patches the condition (the status subresource, a strategic merge
// by type: the Node's other conditions stay) and the label (a merge patch
// of the labels: the others stay).
func (r *Reporter) write(ctx context.Context, s State) error {
	now := time.Now().UTC().Format(time.RFC3339)
	if c := r.cfg.Condition; c != "" {
		status := corev1.ConditionFalse
		if s.Ready {
			status = corev1.ConditionTrue
		}
		cond := map[string]any{"type": c, "status": status, "reason": s.Reason, "message": s.Message, "lastHeartbeatTime": now}
		if r.changed(s) {
			cond["lastTransitionTime"] = now
		}
		if err := r.patch(ctx, "status", types.StrategicMergePatchType,
			map[string]any{"status": map[string]any{"conditions": []any{cond}}}); err != nil {
			return err
		}
	}
	if l := r.cfg.Label; l != "" {
		var v any // null removes it
		if s.Ready {
			v = "true"
		}
		if err := r.patch(ctx, "", types.MergePatchType, map[string]any{"metadata": map[string]any{"labels": map[string]any{l: v}}}); err != nil {
			return err
		}
	}
	return nil
}

// changed reports whether s's readiness differs from the last written
// (or nothing was): the condition's transition time moves then only.
func (r *Reporter) changed(s State) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.written == nil || r.written.Ready != s.Ready
}

func (r *Reporter) patch(ctx context.Context, sub string, pt types.PatchType, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req := r.client.Patch(pt).Resource("nodes").Name(r.cfg.Node).Body(b)
	if sub != "" {
		req = req.SubResource(sub)
	}
	return req.Do(ctx).Error()
}

// hint says what usually causes err.
func (r *Reporter) hint(err error) string {
	switch {
	case apierrors.IsForbidden(err) && r.cfg.AsNode:
		return "the constrained impersonation grant (deploy/node-readiness/rbac.yaml) is missing, or the cluster is older than Kubernetes 1.36 (1.35: the ConstrainedImpersonation feature gate); -node-status-as=serviceaccount with deploy/node-readiness/rbac-any-node.yaml works on any version"
	case apierrors.IsForbidden(err):
		return "the service account may not patch nodes/status (deploy/node-readiness/rbac-any-node.yaml)"
	case apierrors.IsNotFound(err):
		return "no Node of that name: -node-name (or $NODE_NAME, the downward API's spec.nodeName) is wrong"
	}
	return "the API server is not reachable; DNS is not affected"
}

// causeOf is err's kind for logging once per cause.
func causeOf(err error) string {
	if s := apierrors.ReasonForError(err); s != "" {
		return string(s)
	}
	return err.Error()
}
