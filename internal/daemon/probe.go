package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/server"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// healthCheckTimeout bounds one health check asked over the control socket
// (the exec probe's "health"): kubelet's default probe timeout is 1 s.
const healthCheckTimeout = 900 * time.Millisecond

// ExecProbeTimeout bounds the whole exec probe (`nodelocaldns -probe`):
// connecting to the instance's control socket, its health check (at most
// healthCheckTimeout) and the reply. 2 s fits the manifest's probe
// timeoutSeconds of 3.
const ExecProbeTimeout = 2 * time.Second

// health is 200-worthy when every serving loop of this instance is alive
// (server.CheckLoops: none exited, none stuck on one batch) and a query
// for the health name, which the server answers itself without any
// upstream, is answered through every listen address within the deadline.
// The loop check is what makes it about every socket: with SO_REUSEPORT
// the kernel steers the probe's query to one socket of the group, so a
// query alone proves only that one.
func (d *Daemon) health(ctx context.Context) error {
	if err := d.Server.CheckLoops(ctx); err != nil {
		return err
	}
	addrs := d.Server.UDPAddrs()
	if len(addrs) == 0 {
		return errors.New("not listening")
	}
	errs := make(chan error, len(addrs))
	for _, ap := range addrs {
		go func() { errs <- queryHealth(ctx, ap) }()
	}
	var all []error
	for range addrs {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// queryHealth sends the health query to ap over UDP and waits for its
// answer (1 s at most).
func queryHealth(ctx context.Context, ap netip.AddrPort) error {
	deadline := time.Now().Add(time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	c, err := net.Dial("udp", ap.String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	q := server.HealthQuery(uint16(time.Now().UnixNano()))
	if _, err := c.Write(q); err != nil {
		return err
	}
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("no answer from %s: %w", ap, err)
		}
		if n >= wire.HeaderLen && wire.ID(buf) == wire.ID(q) {
			if rc := wire.Rcode(buf[:n]); rc != wire.RcodeSuccess {
				return fmt.Errorf("health query to %s answered rcode %d", ap, rc)
			}
			return nil
		}
	}
}

// Probe asks the instance running in this process's PID namespace (an
// exec probe runs in its container's) whether it is ready or healthy,
// through its control socket under stateDir. pid picks one instance when
// several share the PID namespace (tests, or hostPID); 0 means the only
// one. It returns nil when the instance answers "ok".
func Probe(stateDir, what string, pid int, timeout time.Duration) error {
	if what != "ready" && what != "health" {
		return fmt.Errorf("probe %q: want ready or health", what)
	}
	pidns, err := nsInode("pid")
	if err != nil {
		return err
	}
	pattern := fmt.Sprintf("%d-*.sock", pidns)
	if pid > 0 {
		pattern = fmt.Sprintf("%d-%d.sock", pidns, pid)
	}
	socks, _ := filepath.Glob(filepath.Join(stateDir, "*", pattern))
	var live []string
	for _, s := range socks {
		r := &registry{dir: filepath.Dir(s)}
		if r.alive(strings.TrimSuffix(filepath.Base(s), ".sock"), false) {
			live = append(live, s)
		}
	}
	switch {
	case len(live) == 0:
		return fmt.Errorf("no running nodelocaldns in this PID namespace under %s", stateDir)
	case len(live) > 1:
		return fmt.Errorf("%d instances in this PID namespace under %s; pick one with -probe-pid", len(live), stateDir)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: live[0], Net: "unixpacket"})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
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

// pidOf returns the PID part of an instance id.
func pidOf(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 {
		return id[i+1:]
	}
	return id
}
