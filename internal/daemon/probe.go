package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/statedir"
)

// healthCheckTimeout bounds one health check asked over the control socket
// (the exec probe's "health"): kubelet's default probe timeout is 1 s.
const healthCheckTimeout = 900 * time.Millisecond

// ExecProbeTimeout bounds the whole exec probe (`nodelocaldns -probe`):
// connecting to the instance's control socket, its health check (at most
// healthCheckTimeout) and the reply. 2 s fits the manifest's probe
// timeoutSeconds of 3.
const ExecProbeTimeout = 2 * time.Second

// health is the server's health check (server.Server.Health): every
// serving loop alive and the health query answered through every listen
// address.
func (d *Daemon) health(ctx context.Context) error { return d.Server.Health(ctx) }

// Probe asks the instance running in this process's PID namespace (an
// exec probe runs in its container's, and in the pod's network namespace)
// whether it is ready or healthy, through its control socket, of a group
// under stateDir. pid picks one instance when
// several share the PID namespace (tests, or hostPID); 0 means the only
// one. It returns nil when the instance answers "ok".
func Probe(stateDir, what string, pid int, timeout time.Duration) error {
	if what != "ready" && what != "health" {
		return fmt.Errorf("probe %q: want ready or health", what)
	}
	live, err := statedir.Live(stateDir, pid)
	if err != nil {
		return err
	}
	switch {
	case len(live) == 0:
		return fmt.Errorf("no running nodelocaldns in this PID namespace under %s", stateDir)
	case len(live) > 1:
		return fmt.Errorf("%d instances in this PID namespace under %s; pick one with -probe-pid", len(live), stateDir)
	}
	c, err := statedir.DialName(live[0], timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix([]byte(what), nil, nil); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if reply := string(buf[:n]); reply != "ok" {
		return errors.New(strings.TrimPrefix(reply, "fail: "))
	}
	return nil
}
