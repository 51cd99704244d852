package daemon

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/rest"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/nodestatus"
)

// The readiness the daemon keeps on its Node (-node-condition,
// -node-ready-label; internal/nodestatus writes it). The order:
//
//   - Start, before anything serves, when no twin does: not ready
//     ("Starting"). A condition left True by an instance that was killed,
//     or by the node's last boot, should not let pods in before this one
//     answers; the write is not waited for (the reporter writes the latest
//     state: a fast start may write "Serving" alone). With a twin
//     serving, nothing is written: it is ready.
//   - Start, once every listen address answered: ready ("Serving").
//   - every statusCheckEvery while serving: the health check (every
//     serving loop alive, a query answered through every address); a
//     failure makes it not ready ("Unhealthy"), a later success ready.
//   - shutdown, at once (before the lame duck), unless a twin serves the
//     same addresses: not ready ("Stopping"). With a Node Readiness
//     Controller rule in continuous mode this taints the node for new
//     pods while the running ones still get answers.
//   - shutdown, last: the write waits statusFlushWait at most.
//
// A write never delays DNS: it runs in the reporter's goroutine, and an
// unreachable API server only shows in the log and the metrics.

// statusCheckEvery is the health check's period (a variable for tests).
var statusCheckEvery = 5 * time.Second

const statusFlushWait = time.Second

// startNodeStatus starts the reporter when a condition or label is asked
// for; twin says whether a twin serves already (it keeps the node ready).
func (d *Daemon) startNodeStatus(twin bool) {
	if !d.cfg.PublishesNodeStatus() {
		return
	}
	rc := d.opt.KubeConfig
	if rc == nil {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			d.log.Error("node status off: no API server credentials (is the service account token mounted?)", "err", err)
			return
		}
	}
	r, err := nodestatus.New(nodestatus.Config{
		Rest: rc, Node: d.cfg.Autopath.NodeName, Condition: d.cfg.Node.Condition, Label: d.cfg.Node.Label,
		AsNode: d.cfg.Node.StatusAs == config.StatusAsNode, Logger: d.log,
	})
	if err != nil {
		d.log.Error("node status off", "err", err)
		return
	}
	d.Metrics.Registry.MustRegister(r.Collectors()...)
	ctx, cancel := context.WithCancel(context.Background())
	d.status, d.stopStatus, d.statusDone = r, cancel, make(chan struct{})
	go func() {
		defer close(d.statusDone)
		r.Run(ctx)
	}()
	if !twin {
		r.Set(nodestatus.State{Reason: "Starting", Message: "nodelocaldns is starting: not answering on every listen address yet"})
	}
}

// nodeStatusServing marks the node ready and starts the health checks
// that keep it so (Start, once ready).
func (d *Daemon) nodeStatusServing() {
	if d.status == nil {
		return
	}
	d.status.Set(serving)
	ctx, cancel := context.WithCancel(context.Background())
	stop := d.stopStatus
	d.stopStatus = func() { cancel(); stop() }
	every := statusCheckEvery
	go func() {
		healthy := true
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if d.stopping.Load() {
				return
			}
			hctx, hcancel := context.WithTimeout(ctx, 3*time.Second)
			err := d.health(hctx)
			hcancel()
			if ctx.Err() != nil || !d.setHealth(err, healthy) {
				return
			}
			healthy = err == nil
		}
	}()
}

// setHealth writes a health check's outcome when it changed (an error's
// text may differ from one check to the next, and each would be a write);
// false once the daemon is stopping. Under statusMu, so that a check that
// ends as the shutdown begins never writes after its "Stopping".
func (d *Daemon) setHealth(err error, wasHealthy bool) bool {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	if d.stopping.Load() {
		return false
	}
	switch {
	case err != nil && wasHealthy:
		d.status.Set(nodestatus.State{Reason: "Unhealthy", Message: "health check failed: " + err.Error()})
	case err == nil && !wasHealthy:
		d.status.Set(serving)
	}
	return true
}

var serving = nodestatus.State{Ready: true, Reason: "Serving", Message: "nodelocaldns answers through every listen address"}

// nodeStatusStopping marks the node not ready on the way out, unless a
// twin serves the same addresses (shutdown, first).
func (d *Daemon) nodeStatusStopping(lameDuck time.Duration) {
	if d.status == nil {
		return
	}
	if d.twinServes() {
		d.log.Info("node status left to the twin serving the same addresses")
		return
	}
	d.statusMu.Lock() // after d.stopping: no health check writes past this
	defer d.statusMu.Unlock()
	d.status.Set(nodestatus.State{Reason: "Stopping", Message: fmt.Sprintf("nodelocaldns is stopping: answering for its lame duck (%v), then exiting", lameDuck)})
}

// stopNodeStatus waits for the last write (at most statusFlushWait, and
// ctx) and stops the reporter (shutdown, last).
func (d *Daemon) stopNodeStatus(ctx context.Context) {
	if d.status == nil {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, statusFlushWait)
	if err := d.status.Flush(fctx); err != nil {
		d.log.Warn("node status: the last state was not written before the exit", "err", err)
	}
	cancel()
	d.stopStatus()
	<-d.statusDone
}

// twinServes reports whether a twin serves the same addresses: the one we
// handed our sockets to, or any live one of the group (looked up under the
// group lock, waited for a second at most).
func (d *Daemon) twinServes() bool {
	if d.reg == nil {
		return false
	}
	if t := d.handedTo.Load(); t != nil && d.reg.Alive(*t) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	unlock, err := d.reg.LockGroup(ctx)
	if err != nil {
		return false // a starting twin holds the lock: it is not serving yet
	}
	defer unlock()
	return len(d.reg.Twins()) > 0
}
