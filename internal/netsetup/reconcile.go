package netsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
)

const (
	// repairDelay is how long a netlink event waits before the link is
	// checked. 100 ms: long enough for the burst one `ip` command causes (a
	// link delete sends a DELADDR per address, then DELLINK) to arrive and
	// be handled by one check, short against the ~1 s repair goal.
	repairDelay = 100 * time.Millisecond
	// resubscribeDelay is the first pause before resubscribing after a
	// netlink subscription broke (e.g. ENOBUFS when the socket overran).
	// 1 s keeps a persistent failure from spinning; the check that follows
	// the new subscription catches whatever happened in between.
	resubscribeDelay = time.Second
	// maxResubscribeDelay caps the doubling of resubscribeDelay while
	// subscribing keeps failing. 30 s: the periodic reconcile still repairs
	// in the meantime, and one log line per 30 s is bearable.
	maxResubscribeDelay = 30 * time.Second
	// updateBuffer is the capacity of the netlink update channels: a burst
	// of events on a busy node must not block the netlink reader.
	updateBuffer = 64
)

// Run keeps the link, its addresses and the rules in place until ctx is
// done. Every SyncInterval it re-asserts the link and its addresses and,
// once EnsureRules has been called, the rules. It also subscribes to netlink
// link and address updates and repairs a deleted or downed link or a removed
// address within about a second.
func (s *Setup) Run(ctx context.Context) {
	kick := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.cfg.SetupInterface {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watch(ctx, kick)
		}()
	}

	tick := time.NewTicker(s.cfg.SyncInterval)
	defer tick.Stop()
	repair := time.NewTimer(repairDelay)
	repair.Stop()
	defer repair.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.reconcile(ctx, true)
		case <-kick:
			if !pending {
				pending = true
				repair.Reset(repairDelay)
			}
		case <-repair.C:
			pending = false
			s.reconcile(ctx, false)
		}
	}
}

// reconcile re-asserts the link and, with rules set, the rules. Failures
// are counted where they happen and logged here, one line each.
func (s *Setup) reconcile(ctx context.Context, rules bool) {
	if s.lock(ctx) != nil {
		return
	}
	defer s.unlock()
	if s.closed {
		return
	}
	if s.cfg.SetupInterface {
		if err := s.ensureLinkLocked(); err != nil {
			s.log.Warn("link check failed", "err", err)
		}
	}
	if rules && s.cfg.SetupIPTables && s.rulesWanted {
		if err := s.ensureRulesLocked(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("iptables check failed", "err", err)
		}
	}
}

// watch subscribes to netlink link and address updates and sends on kick
// (without blocking) whenever one may concern our link. It resubscribes if
// a subscription breaks, and returns when ctx is done.
func (s *Setup) watch(ctx context.Context, kick chan<- struct{}) {
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	ours := make(map[netip.Addr]bool, len(s.cfg.Addrs))
	for _, a := range s.cfg.Addrs {
		ours[a] = true
	}
	delay := resubscribeDelay
	for {
		start := time.Now()
		err := s.watchOnce(ctx, poke, ours)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > maxResubscribeDelay {
			delay = resubscribeDelay // it ran a good while: a fresh failure
		}
		s.log.Warn("netlink subscription failed, retrying", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxResubscribeDelay)
	}
}

// watchOnce runs one pair of subscriptions until ctx is done (nil) or one of
// them breaks (the reason).
func (s *Setup) watchOnce(ctx context.Context, poke func(), ours map[netip.Addr]bool) error {
	var (
		done     = make(chan struct{})
		links    = make(chan netlink.LinkUpdate, updateBuffer)
		addrs    = make(chan netlink.AddrUpdate, updateBuffer)
		stopping atomic.Bool
		mu       sync.Mutex
		cause    error = errors.New("netlink subscription closed")
		drains   []func()
	)
	onErr := func(err error) {
		if stopping.Load() {
			return
		}
		mu.Lock()
		cause = err // the last error is the one that ended the subscription
		mu.Unlock()
	}
	stop := func() {
		stopping.Store(true)
		close(done)
		// Each subscription goroutine blocks on sending until its channel is
		// drained, and closes the channel once done is closed.
		for _, drain := range drains {
			drain()
		}
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("subscribe to link updates: %w", err)
	}
	drains = append(drains, func() {
		for range links {
		}
	})
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
		stop()
		return fmt.Errorf("subscribe to address updates: %w", err)
	}
	drains = append(drains, func() {
		for range addrs {
		}
	})
	defer stop()
	// Whatever happened before we were subscribed (since EnsureLink, or
	// while a broken subscription was being replaced) sent no update to us:
	// check once now.
	poke()

	broken := func() error {
		mu.Lock()
		defer mu.Unlock()
		return cause
	}
	name := s.cfg.InterfaceName
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-links:
			if !ok {
				return broken()
			}
			// Any change to our link (deleted, downed, renamed) or to a link
			// taking its name: a check is cheap and idempotent.
			if u.Attrs().Name == name || int32(u.Attrs().Index) == s.linkIndex.Load() {
				poke()
			}
		case u, ok := <-addrs:
			if !ok {
				return broken()
			}
			ip, _ := netip.AddrFromSlice(u.LinkAddress.IP)
			if !u.NewAddr && (ours[ip.Unmap()] || int32(u.LinkIndex) == s.linkIndex.Load()) {
				poke()
			}
		}
	}
}
