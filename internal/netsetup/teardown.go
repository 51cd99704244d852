package netsetup

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Teardown removes what this Setup added: the rules first (every copy of
// each of our rules, if EnsureRules was ever called), then the link if we
// created it, or else only the addresses we added to it. Foreign rules,
// links and addresses are left alone. It gives up when ctx is done; each
// iptables call then waits for the xtables lock no longer than the time
// left. After Teardown, EnsureLink and EnsureRules return ErrClosed and Run
// does nothing more; a second Teardown returns nil.
func (s *Setup) Teardown(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("netsetup: teardown: %w", err)
	}
	defer s.unlock()
	if s.closed {
		return nil
	}
	s.closed = true

	var errs []error
	if s.cfg.SetupIPTables && s.rulesWanted && s.backend != "" {
		if err := s.teardownRulesLocked(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("netsetup: teardown: link left in place: %w", err))
		return errors.Join(errs...)
	}
	if s.cfg.SetupInterface {
		if err := s.removeLinkLocked(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Setup) teardownRulesLocked(ctx context.Context) error {
	wait := s.cfg.LockWait
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	tables := s.tables
	if tables == nil || wait < s.cfg.LockWait {
		// Handles whose lock wait fits in the time left (rounded up to the
		// one second go-iptables can express).
		var err error
		if tables, err = s.newTables(wait); err != nil {
			s.obs.SetupError(KindIPTables)
			return err
		}
	}
	err := s.deleteRulesLocked(ctx, tables)
	if err == nil {
		// And what other versions or settings of ours left for these
		// addresses (a rollout's successor adopted them: they are ours).
		var n int
		if n, err = s.deleteOursLocked(tables, map[chainKey][]string{}, nil); n > 0 {
			s.log.Info("iptables rules of ours from other versions or settings deleted", "count", n, "backend", s.backend)
		}
	}
	if err == nil {
		err = s.deleteChainsLocked(tables)
	}
	return err
}

// RemoveAll removes what instances with this configuration may have left
// on the node: every rule of ours naming these addresses and ports (of any
// version or setting), the fallback's chains, the addresses on the link,
// and the link itself when o says an instance created it. It is -cleanup,
// for an uninstall the exiting daemon could not tell from a restart (it
// then leaves the fallback). It refuses nothing: the caller makes sure no
// instance serves these addresses.
func (s *Setup) RemoveAll(ctx context.Context, o Ownership) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("netsetup: remove: %w", err)
	}
	defer s.unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	var errs []error
	if s.cfg.SetupIPTables {
		if err := s.initTablesLocked(ctx); err != nil {
			return err
		}
		n, err := s.deleteOursLocked(s.tables, map[chainKey][]string{}, nil)
		if err != nil {
			errs = append(errs, err)
		}
		s.log.Info("iptables rules of ours deleted", "count", n, "backend", s.backend)
		if err := s.deleteChainsLocked(s.tables); err != nil {
			errs = append(errs, err)
		}
	}
	if s.cfg.SetupInterface {
		s.linkCreated = o.LinkCreated
		for _, a := range s.cfg.Addrs {
			s.addedAddrs[a] = true
		}
		if err := s.removeLinkLocked(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
