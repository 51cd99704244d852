package netsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// Rule comments. Each names nodelocaldns so `iptables-save | grep nodelocaldns`
// lists every rule we own; the text is part of each rule's identity.
const (
	commentNoTrack = "nodelocaldns: skip conntrack"
	commentAccept  = "nodelocaldns: accept DNS"
	// The fallback's rules (fallback.go).
	commentServing  = "nodelocaldns: skip conntrack while serving"
	commentFallback = "nodelocaldns: fallback to kube-dns"
	commentMasq     = "nodelocaldns: fallback from the host"
	commentCount    = "nodelocaldns: fallback count"
	commentNoSocket = "nodelocaldns: no socket, drop rather than refuse"
	commentPod      = "nodelocaldns: kube-dns pod"
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
	// Append puts the rule at the end of its chain, after what others
	// inserted (the fallback's nat jumps come after kube-proxy's Service
	// rules); the others are inserted at position 1.
	Append bool
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

// rulesFor returns the rule set for every address, in the order the
// package documentation lists it, without duplicates (a health port equal
// to the DNS port would repeat rules): the stock node-cache set, or with
// FallbackAfter the fallback's (fallback.go). The DNS rules are repeated
// for every extra DNS port (a Corefile's blocks on other ports), after the
// address's own set.
func rulesFor(c *Config) []Rule {
	var out []Rule
	seen := make(map[string]bool)
	for _, a := range c.Addrs {
		b := ruleBuilder{c: c, a: a, host: netip.PrefixFrom(a, a.BitLen()).String(), seen: seen}
		b.dns(c.Port)
		// The kubelet's liveness probe to the health port.
		if c.HealthPort > 0 {
			health := strconv.Itoa(c.HealthPort)
			b.add("raw", "OUTPUT", b.to("tcp", health, commentNoTrack, "NOTRACK"))
			b.add("raw", "OUTPUT", b.from("tcp", health, commentNoTrack, "NOTRACK"))
		}
		for _, p := range c.ExtraPorts {
			b.dns(p)
		}
		out = append(out, b.out...)
	}
	return out
}

// ruleBuilder writes one address's rules.
type ruleBuilder struct {
	c    *Config
	a    netip.Addr
	host string // the address with its prefix length, as iptables-save prints it
	seen map[string]bool
	out  []Rule
}

func (b *ruleBuilder) add(table, chain string, spec []string) {
	b.put(Rule{IPv6: b.a.Is6(), Table: table, Chain: chain, Spec: spec})
}

func (b *ruleBuilder) put(r Rule) {
	if key := r.String(); !b.seen[key] {
		b.seen[key] = true
		b.out = append(b.out, r)
	}
}

func (b *ruleBuilder) to(proto, port, comment, target string) []string {
	return []string{"-d", b.host, "-p", proto, "-m", proto, "--dport", port, "-m", "comment", "--comment", comment, "-j", target}
}

func (b *ruleBuilder) from(proto, port, comment, target string) []string {
	return []string{"-s", b.host, "-p", proto, "-m", proto, "--sport", port, "-m", "comment", "--comment", comment, "-j", target}
}

// dns adds the DNS rules of one port: the stock set, or the fallback's.
func (b *ruleBuilder) dns(port int) {
	dns := strconv.Itoa(port)
	protos := []string{"tcp", "udp"}
	if b.c.FallbackAfter > 0 {
		b.gated(dns)
	} else {
		for _, p := range protos {
			b.add("raw", "PREROUTING", b.to(p, dns, commentNoTrack, "NOTRACK"))
		}
	}
	if b.c.FallbackAfter > 0 {
		b.accept(dns)
	} else {
		for _, p := range protos {
			b.add("filter", "INPUT", b.to(p, dns, commentAccept, "ACCEPT"))
		}
	}
	for _, p := range protos {
		b.add("raw", "OUTPUT", b.from(p, dns, commentNoTrack, "NOTRACK"))
	}
	for _, p := range protos {
		b.add("filter", "OUTPUT", b.from(p, dns, commentAccept, "ACCEPT"))
	}
	if b.c.FallbackAfter > 0 {
		b.fallback(dns)
		return
	}
	// Queries from host-network clients leave through OUTPUT, not PREROUTING.
	for _, p := range protos {
		b.add("raw", "OUTPUT", b.to(p, dns, commentNoTrack, "NOTRACK"))
	}
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
	if err := s.ensureChainsLocked(); err != nil {
		s.obs.SetupError(KindIPTables)
		return err
	}
	listings := make(map[chainKey][]string)
	var errs []error
	inserted, removed := 0, 0
	// Rules inserted at position 1 are walked backwards, appended ones
	// forwards, so that both end up in the documented order.
	order := make([]Rule, 0, len(s.rules))
	for i := len(s.rules) - 1; i >= 0; i-- {
		if !s.rules[i].Append {
			order = append(order, s.rules[i])
		}
	}
	for _, r := range s.rules {
		if r.Append {
			order = append(order, r)
		}
	}
	for _, r := range order {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("netsetup: ensure rules: %w", err))
			break
		}
		ins, rem, err := s.ensureRuleLocked(r, listings)
		inserted, removed = inserted+ins, removed+rem
		if err != nil {
			errs = append(errs, fmt.Errorf("netsetup: ensure rule %s: %w", r, err))
			if s.countIPTablesErr(err) {
				// The lock is held by someone else: every further call would
				// wait as long again. Try again on the next pass.
				break
			}
		}
	}
	if len(errs) == 0 {
		n, err := s.deleteObsoleteLocked(listings)
		if err != nil {
			errs = append(errs, err)
		}
		if n > 0 {
			s.log.Info("iptables rules of ours no longer wanted deleted (an older version's, or other settings')", "count", n, "backend", s.backend)
		}
		if err := s.ensureChainContentsLocked(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if inserted > 0 {
		s.log.Info("iptables rules inserted", "count", inserted, "of", len(s.rules), "backend", s.backend)
	} else if !s.adoptedRules && len(errs) == 0 {
		s.log.Info("iptables rules in place already (left by an earlier instance): adopted", "count", len(s.rules), "backend", s.backend)
	}
	s.adoptedRules = true
	if removed > 0 {
		s.log.Warn("duplicate iptables rules deleted", "count", removed, "backend", s.backend)
	}
	return errors.Join(errs...)
}

// ensureRuleLocked makes r exist exactly once: inserted at position 1 (or
// appended) when missing, surplus copies deleted.
func (s *Setup) ensureRuleLocked(r Rule, listings map[chainKey][]string) (inserted, removed int, err error) {
	ipt := s.tables[r.family()]
	put := func() error {
		if r.Append {
			return ipt.Append(r.Table, r.Chain, r.Spec...)
		}
		return ipt.Insert(r.Table, r.Chain, 1, r.Spec...)
	}
	n, err := s.countLocked(ipt, r, listings)
	if err != nil {
		return 0, 0, err
	}
	switch {
	case n == 0:
		// Not listed as we print it. The exact check is the authority: an
		// iptables that prints rules differently must not make us insert a
		// rule it already has.
		var exists bool
		if exists, err = ipt.Exists(r.Table, r.Chain, r.Spec...); err == nil && !exists {
			if err = put(); err == nil {
				inserted++
			}
		}
	case n > 1:
		for ; n > 1 && err == nil; n-- {
			if err = ipt.Delete(r.Table, r.Chain, r.Spec...); err == nil {
				removed++
			}
		}
		// A twin instance (a rolling update runs two on the same addresses)
		// may have deleted the same surplus copies at the same time: make
		// sure one is left. A duplicate is harmless and goes on the next
		// pass; a missing rule is not.
		var exists bool
		if err == nil {
			if exists, err = ipt.Exists(r.Table, r.Chain, r.Spec...); err == nil && !exists {
				err = put()
			}
		}
	}
	return inserted, removed, err
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

// ourChains are the chains any version of our rules uses.
var ourChains = []struct{ table, chain string }{
	{"raw", "PREROUTING"}, {"raw", "OUTPUT"}, {"filter", "INPUT"}, {"filter", "OUTPUT"}, {"filter", "FORWARD"},
	{"nat", "PREROUTING"}, {"nat", "OUTPUT"}, {"nat", "POSTROUTING"},
}

// deleteObsoleteLocked deletes rules of ours that are not wanted now: an
// older version's (the stock set, whose NOTRACK holds whether anyone
// listens), another -fallback-after's, another health port's. A rule is ours
// when it carries a nodelocaldns comment and names one of our addresses,
// whatever its port: an address is one group's (its link address is), so
// instances on other addresses of this namespace keep theirs.
func (s *Setup) deleteObsoleteLocked(listings map[chainKey][]string) (int, error) {
	wanted := make(map[string]bool, len(s.rules))
	for _, r := range s.rules {
		wanted[r.family().String()+" "+r.Table+" "+r.saveLine()] = true
	}
	return s.deleteOursLocked(s.tables, listings, wanted)
}

// deleteOursLocked deletes every rule of ours (isOurs) but the wanted
// ones (family, table and save line), through tables.
func (s *Setup) deleteOursLocked(tables map[family]*iptables.IPTables, listings map[chainKey][]string, wanted map[string]bool) (int, error) {
	var errs []error
	deleted := 0
	for fam, ipt := range tables {
		for _, c := range ourChains {
			key := chainKey{fam, c.table, c.chain}
			lines, ok := listings[key]
			if !ok && !s.tableLoaded(fam, c.table) {
				continue
			}
			if !ok {
				var err error
				if lines, err = ipt.List(c.table, c.chain); err != nil {
					continue // a table this backend does not have
				}
				listings[key] = lines
			}
			for _, l := range lines {
				if wanted[fam.String()+" "+c.table+" "+l] || !s.isOurs(l) {
					continue
				}
				spec, err := splitRule(l)
				if err != nil || len(spec) < 2 {
					continue
				}
				if err := ipt.Delete(c.table, c.chain, spec[2:]...); err != nil && !isNotExist(err) {
					errs = append(errs, fmt.Errorf("netsetup: delete obsolete rule %q: %w", l, err))
					if s.countIPTablesErr(err) {
						return deleted, errors.Join(errs...)
					}
					continue
				}
				deleted++
			}
		}
	}
	return deleted, errors.Join(errs...)
}

// isOurs: a listed rule with our comment naming one of our addresses.
func (s *Setup) isOurs(line string) bool {
	if !strings.Contains(line, `--comment "nodelocaldns: `) {
		return false
	}
	line += " "
	for _, a := range s.cfg.Addrs {
		h := netip.PrefixFrom(a, a.BitLen()).String()
		if strings.Contains(line, " -d "+h+" ") || strings.Contains(line, " -s "+h+" ") || strings.Contains(line, " --ctorigdst "+a.String()+" ") {
			return true
		}
	}
	return false
}

// splitRule splits a listed rule into its words, unquoting the quoted ones
// (comments), as the shell would.
func splitRule(line string) ([]string, error) {
	var out []string
	for rest := strings.TrimSpace(line); rest != ""; rest = strings.TrimLeft(rest, " ") {
		if rest[0] == '"' {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return nil, err
			}
			w, _ := strconv.Unquote(q)
			out = append(out, w)
			rest = rest[len(q):]
			continue
		}
		w, r, _ := strings.Cut(rest, " ")
		out = append(out, w)
		rest = r
	}
	return out, nil
}

// tableLoaded reports whether listing a table leaves the namespace as it
// was: iptables-legacy instantiates a table it lists, so one the kernel has
// not loaded in this namespace (ip_tables_names) is not listed.
func (s *Setup) tableLoaded(fam family, table string) bool {
	if s.backend != BackendLegacy {
		return true
	}
	names := "/proc/self/net/ip_tables_names"
	if fam == ipv6 {
		names = "/proc/self/net/ip6_tables_names"
	}
	b, err := os.ReadFile(names)
	if err != nil {
		return true
	}
	return slices.Contains(strings.Fields(string(b)), table)
}
