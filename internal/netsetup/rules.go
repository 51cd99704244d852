package netsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// Rule comments. Both name nodelocaldns so `iptables-save | grep nodelocaldns`
// lists every rule we own; the text is part of each rule's identity.
const (
	commentNoTrack = "nodelocaldns: skip conntrack"
	commentAccept  = "nodelocaldns: accept DNS"
)

// maxCopies bounds the loop deleting copies of one rule at teardown, in case
// a broken iptables reports success without deleting anything.
const maxCopies = 64

// family is an address family: IPv4 rules go through iptables, IPv6 rules
// through ip6tables.
type family int

const (
	ipv4 family = iota
	ipv6
)

func (f family) String() string {
	if f == ipv6 {
		return "ipv6"
	}
	return "ipv4"
}

func familyOf(a netip.Addr) family {
	if a.Is6() {
		return ipv6
	}
	return ipv4
}

// Rule is one iptables rule this package owns.
type Rule struct {
	IPv6  bool
	Table string
	Chain string
	// Spec is the rule specification in the order iptables-save prints it,
	// so a listed rule can be matched as a string.
	Spec []string
}

func (r Rule) family() family {
	if r.IPv6 {
		return ipv6
	}
	return ipv4
}

// saveLine is the rule as iptables-save and `iptables -S` print it,
// e.g. `-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53 ...`.
func (r Rule) saveLine() string {
	var b strings.Builder
	b.WriteString("-A ")
	b.WriteString(r.Chain)
	for _, arg := range r.Spec {
		b.WriteByte(' ')
		if strings.ContainsAny(arg, " \t\"") {
			b.WriteString(strconv.Quote(arg))
		} else {
			b.WriteString(arg)
		}
	}
	return b.String()
}

// String names the rule for logs and errors.
func (r Rule) String() string {
	cmd := "iptables"
	if r.IPv6 {
		cmd = "ip6tables"
	}
	return cmd + " -t " + r.Table + " " + r.saveLine()
}

// rulesFor returns the stock node-cache rule set for every address, in the
// order the package documentation lists it, without duplicates (a health
// port equal to the DNS port would repeat rules). The DNS rules are
// repeated for every extra DNS port (a Corefile's blocks on other ports),
// after the stock set of the address.
func rulesFor(addrs []netip.Addr, port int, extraPorts []int, healthPort int) []Rule {
	health := strconv.Itoa(healthPort)
	var out []Rule
	seen := make(map[string]bool)
	add := func(a netip.Addr, table, chain string, spec []string) {
		r := Rule{IPv6: a.Is6(), Table: table, Chain: chain, Spec: spec}
		if key := r.String(); !seen[key] {
			seen[key] = true
			out = append(out, r)
		}
	}
	for _, a := range addrs {
		host := netip.PrefixFrom(a, a.BitLen()).String()
		to := func(proto, port, comment, target string) []string {
			return []string{"-d", host, "-p", proto, "-m", proto, "--dport", port, "-m", "comment", "--comment", comment, "-j", target}
		}
		from := func(proto, port, comment, target string) []string {
			return []string{"-s", host, "-p", proto, "-m", proto, "--sport", port, "-m", "comment", "--comment", comment, "-j", target}
		}
		protos := []string{"tcp", "udp"}
		dnsRules := func(dns string) {
			for _, p := range protos {
				add(a, "raw", "PREROUTING", to(p, dns, commentNoTrack, "NOTRACK"))
			}
			for _, p := range protos {
				add(a, "filter", "INPUT", to(p, dns, commentAccept, "ACCEPT"))
			}
			for _, p := range protos {
				add(a, "raw", "OUTPUT", from(p, dns, commentNoTrack, "NOTRACK"))
			}
			for _, p := range protos {
				add(a, "filter", "OUTPUT", from(p, dns, commentAccept, "ACCEPT"))
			}
			// Queries from host-network clients leave through OUTPUT, not PREROUTING.
			for _, p := range protos {
				add(a, "raw", "OUTPUT", to(p, dns, commentNoTrack, "NOTRACK"))
			}
		}
		dnsRules(strconv.Itoa(port))
		// The kubelet's liveness probe to the health port.
		if healthPort > 0 {
			add(a, "raw", "OUTPUT", to("tcp", health, commentNoTrack, "NOTRACK"))
			add(a, "raw", "OUTPUT", from("tcp", health, commentNoTrack, "NOTRACK"))
		}
		for _, p := range extraPorts {
			dnsRules(strconv.Itoa(p))
		}
	}
	return out
}

// EnsureRules installs every rule that is missing, at position 1 of its
// chain, and deletes extra copies, so that each rule exists exactly once.
// Call it after the DNS listeners are up: from then on Run re-asserts the
// rules too. The first call chooses the iptables backend. It does nothing
// when SetupIPTables is false.
func (s *Setup) EnsureRules(ctx context.Context) error {
	if !s.cfg.SetupIPTables {
		return nil
	}
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("netsetup: ensure rules: %w", err)
	}
	defer s.unlock()
	if s.closed {
		return ErrClosed
	}
	s.rulesWanted = true
	return s.ensureRulesLocked(ctx)
}

type chainKey struct {
	fam          family
	table, chain string
}

func (s *Setup) ensureRulesLocked(ctx context.Context) error {
	if err := s.initTablesLocked(ctx); err != nil {
		s.obs.SetupError(KindIPTables)
		return err
	}
	listings := make(map[chainKey][]string)
	var errs []error
	inserted, removed := 0, 0
	// Walk backwards so that rules inserted at position 1 end up in the
	// documented order.
	for i := len(s.rules) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("netsetup: ensure rules: %w", err))
			break
		}
		r := s.rules[i]
		ipt := s.tables[r.family()]
		n, err := s.countLocked(ipt, r, listings)
		if err == nil {
			switch {
			case n == 0:
				// Not listed as we print it. The exact check is the authority:
				// an iptables that prints rules differently must not make us
				// insert a rule it already has.
				var exists bool
				if exists, err = ipt.Exists(r.Table, r.Chain, r.Spec...); err == nil && !exists {
					if err = ipt.Insert(r.Table, r.Chain, 1, r.Spec...); err == nil {
						inserted++
					}
				}
			case n > 1:
				for ; n > 1 && err == nil; n-- {
					if err = ipt.Delete(r.Table, r.Chain, r.Spec...); err == nil {
						removed++
					}
				}
				// A twin instance (a rolling update runs two on the same
				// addresses) may have deleted the same surplus copies at
				// the same time: make sure one is left. A duplicate is
				// harmless and goes on the next pass; a missing rule is not.
				var exists bool
				if err == nil {
					if exists, err = ipt.Exists(r.Table, r.Chain, r.Spec...); err == nil && !exists {
						err = ipt.Insert(r.Table, r.Chain, 1, r.Spec...)
					}
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("netsetup: ensure rule %s: %w", r, err))
			if s.countIPTablesErr(err) {
				// The lock is held by someone else: every further call would
				// wait as long again. Try again on the next pass.
				break
			}
		}
	}
	if inserted > 0 {
		s.log.Info("iptables rules inserted", "count", inserted, "of", len(s.rules), "backend", s.backend)
	}
	if removed > 0 {
		s.log.Warn("duplicate iptables rules deleted", "count", removed, "backend", s.backend)
	}
	return errors.Join(errs...)
}

// countLocked returns how many times r is listed in its chain, listing each
// chain once per pass.
func (s *Setup) countLocked(ipt *iptables.IPTables, r Rule, listings map[chainKey][]string) (int, error) {
	key := chainKey{r.family(), r.Table, r.Chain}
	lines, ok := listings[key]
	if !ok {
		var err error
		lines, err = ipt.List(r.Table, r.Chain)
		if err != nil && !isNotExist(err) {
			return 0, err
		}
		listings[key] = lines
	}
	want := r.saveLine()
	n := 0
	for _, l := range lines {
		if l == want {
			n++
		}
	}
	return n, nil
}

// deleteRulesLocked deletes every copy of each of our rules.
func (s *Setup) deleteRulesLocked(ctx context.Context, tables map[family]*iptables.IPTables) error {
	var errs []error
	deleted := 0
rules:
	for _, r := range s.rules {
		ipt := tables[r.family()]
		for range maxCopies {
			if err := ctx.Err(); err != nil {
				errs = append(errs, fmt.Errorf("netsetup: delete rules: %w", err))
				break rules
			}
			err := ipt.Delete(r.Table, r.Chain, r.Spec...)
			if err == nil {
				deleted++
				continue
			}
			if isNotExist(err) {
				break
			}
			errs = append(errs, fmt.Errorf("netsetup: delete rule %s: %w", r, err))
			if s.countIPTablesErr(err) {
				break rules
			}
			break
		}
	}
	if deleted > 0 {
		s.log.Info("iptables rules deleted", "count", deleted, "backend", s.backend)
	}
	return errors.Join(errs...)
}

// countIPTablesErr counts err as iptables_lock or iptables and reports
// whether it was a lock timeout.
func (s *Setup) countIPTablesErr(err error) bool {
	if isLockErr(err) {
		s.obs.SetupError(KindIPTablesLock)
		return true
	}
	s.obs.SetupError(KindIPTables)
	return false
}

// isLockErr reports whether iptables gave up waiting for the xtables lock.
// iptables-legacy says "Another app is currently holding the xtables lock";
// iptables-nft takes no such lock.
func isLockErr(err error) bool {
	return err != nil && strings.Contains(err.Error(), "holding the xtables lock")
}

// isNotExist reports whether iptables failed because the rule, chain or
// table does not exist.
func isNotExist(err error) bool {
	var ierr *iptables.Error
	return errors.As(err, &ierr) && ierr.IsNotExist()
}

// lockWaitSeconds converts a lock wait to go-iptables' whole seconds,
// rounding up and never returning 0, which go-iptables takes as "wait
// forever".
func lockWaitSeconds(d time.Duration) int {
	secs := int((d + time.Second - 1) / time.Second)
	return max(secs, 1)
}
