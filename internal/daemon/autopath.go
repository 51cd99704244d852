package daemon

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/nodelocaldns/nodelocaldns/internal/autopath"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// serverAutopath is the server's Autopath: nil when -autopath is off (a
// nil *autopath.Hook would not be a nil interface); with a node listener,
// the hook that declines its view.
func (d *Daemon) serverAutopath() server.Autopath {
	if d.autopath == nil {
		return nil
	}
	if v, ok := d.run.NodeView(); ok {
		return &autopathOff{Autopath: d.autopath, view: v}
	}
	return d.autopath
}

// autopathOff is -autopath's hook for a server with a node listener
// (-node-listen): its queries come from the node and dnsPolicy: Default
// pods, whose search path is the node's, and are never autopath's.
type autopathOff struct {
	server.Autopath
	view uint8 // the node listener's view
}

func (a *autopathOff) Candidate(q *wire.Query) bool {
	return q.View != a.view && a.Autopath.Candidate(q)
}

// newAutopath builds -autopath's hook for the server around res
// (autopath.Hook) and registers its metrics; nil when -autopath is off.
func newAutopath(d *Daemon, res *resolve.Resolver) (*autopath.Hook, error) {
	if !d.cfg.Autopath.Enabled {
		return nil, nil
	}
	h, err := autopath.NewHook(autopath.HookConfig{
		Resolver: res, Clock: d.clock, ClusterDomain: d.cfg.ClusterDomain, UDPSize: uint16(d.cfg.MaxUDPSize),
		View: server.CandidateView,
	})
	if err != nil {
		return nil, fmt.Errorf("-autopath: %w", err)
	}
	d.Metrics.Registry.MustRegister(h.Collectors()...)
	return h, nil
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
	d.autopath.SetWatch(w)
	d.stopPodWatch = d.background(w.Run)
	d.log.Info("-autopath: watching this node's pods; autopath answers once the watch is synced",
		"node", d.cfg.Autopath.NodeName, "node_search", fmt.Sprint(node.Search))
	return nil
}
