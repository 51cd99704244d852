package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Health is 200-worthy when every serving loop of this instance is alive
// (CheckLoops: none exited, none stuck on one batch) and a query
// for the health name, which the server answers itself without any
// upstream, is answered through every listen address within the deadline.
// The loop check is what makes it about every socket: with SO_REUSEPORT
// the kernel steers the probe's query to one socket of the group, so a
// query alone proves only that one.
func (s *Server) Health(ctx context.Context) error {
	if err := s.CheckLoops(ctx); err != nil {
		return err
	}
	addrs := s.UDPAddrs()
	if len(addrs) == 0 {
		return errors.New("not listening")
	}
	errs := make(chan error, len(addrs))
	for _, ap := range addrs {
		if ap.Addr().IsUnspecified() {
			// The wildcard socket (dual-stack or IPv4): through loopback.
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), ap.Port())
		}
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
	q := HealthQuery(uint16(time.Now().UnixNano()))
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
