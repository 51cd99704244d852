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
		err = s.deleteChainsLocked(tables)
	}
	return err
}
