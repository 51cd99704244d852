package netsetup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// The fallback (docs/design.md, "No black hole"): while no instance serves
// an address, its queries are not NOTRACKed and go where they would go
// without a node cache. The NOTRACK rules of queries hold only while
//
//   - a socket is bound to the address and port (the socket match, in
//     PREROUTING: pods' queries; a SIGKILL, a crash or an exit closes the
//     sockets, and the very next packet falls back), and
//   - the gate is open: an entry of the address in the xt_recent table
//     gateTable seen within FallbackAfter (PREROUTING and OUTPUT: the
//     host's own clients, where the socket match cannot be used). The
//     daemon refreshes it (Heartbeat) while its health check passes, so a
//     stopped or wedged process stops being sent queries within
//     FallbackAfter, and closes it (CloseGate) before it drains on exit.
//
// A query that is not NOTRACKed is tracked and NATed: a Service ClusterIP
// by kube-proxy's own rules, any other address by ours, a DNAT to kube-dns'
// ready pods in a chain of its own per address (SetFallback), appended to
// nat PREROUTING and OUTPUT after kube-proxy's Service rules. The rules
// count what went that way (FallbackCounts).

// maxFallbackAfter bounds FallbackAfter: a hung process black-holes its
// node's DNS for at most that long.
const maxFallbackAfter = time.Minute

// recentDir holds the xt_recent tables of this network namespace.
const recentDir = "/proc/self/net/xt_recent/"

// gateTable is the name of the xt_recent table holding the addresses of a
// family served now: one per DNS port, so instances on other ports of one
// network namespace (tests) never share entries, and one per family: a
// table has one mask, the first rule's, applied to every address looked up
// in it, and an IPv4 mask leaves 32 bits of an IPv6 address (IPv6 lookups
// in a table an IPv4 rule made never matched).
func (c *Config) gateTable(ipv6 bool) string {
	if ipv6 {
		return "nodelocaldns6-" + strconv.Itoa(c.Port)
	}
	return "nodelocaldns-" + strconv.Itoa(c.Port)
}

// fallbackChain is the nat chain holding the DNAT of address a: named by
// a hash (an IPv6 address does not fit in a chain name's 28 characters).
func fallbackChain(a netip.Addr) string {
	h := sha256.Sum256([]byte(a.String()))
	return "NODELOCALDNS-FB-" + hex.EncodeToString(h[:4])
}

// gate is the match that holds while the daemon's heartbeat is fresh.
func (b *ruleBuilder) gate() []string {
	mask := "255.255.255.255"
	if b.a.Is6() {
		mask = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	}
	secs := int(b.c.FallbackAfter / time.Second)
	return []string{"-m", "recent", "--rcheck", "--seconds", strconv.Itoa(secs), "--name", b.c.gateTable(b.a.Is6()), "--mask", mask, "--rdest"}
}

// socket is the match that holds while a socket listens on the address:
// only a socket bound to it, unless the address is served only by a
// wildcard socket (a Corefile's bind 0.0.0.0).
func (b *ruleBuilder) socket() []string {
	if slices.Contains(b.c.WildcardOnly, b.a) {
		return []string{"-m", "socket", "--nowildcard"}
	}
	return []string{"-m", "socket"}
}

// notrack is a NOTRACK rule for queries to the address: -d, protocol and
// port, then the extra matches, the comment and the target.
func (b *ruleBuilder) notrack(proto, port string, extra ...[]string) []string {
	spec := []string{"-d", b.host, "-p", proto, "-m", proto, "--dport", port}
	for _, e := range extra {
		spec = append(spec, e...)
	}
	return append(spec, "-m", "comment", "--comment", commentServing, "-j", "NOTRACK")
}

// gated adds the NOTRACK rules of pods' queries (PREROUTING): a socket and
// the gate. A TCP connection established with us before the gate closed (a
// rollout's drain) is then tracked from its next packet and reset by
// kube-dns; it ends with us only while the gate is open. The other way (an
// exception for established connections) breaks worse: while our listener
// exists (a stopped process, a drain), the later packets of a connection
// the fallback sent to kube-dns would match it and miss their NAT.
func (b *ruleBuilder) gated(port string) {
	for _, p := range []string{"tcp", "udp"} {
		b.add("raw", "PREROUTING", b.notrack(p, port, b.socket(), b.gate()))
	}
}

// accept adds the filter INPUT rules of a query delivered to the address
// itself: accepted while a socket is bound (a host firewall with a DROP
// policy lets it through), else dropped rather than refused. Such a query
// was not sent on to kube-dns (no DNAT target known, or the address is on
// the link and nobody listens: a cache killed with the host's gate still
// fresh). An ICMP port unreachable makes glibc fail the lookup at once; a
// drop makes it try again (5 s later), by when the fallback or the next
// instance answers. Sent on to kube-dns, a query goes through FORWARD,
// never here.
func (b *ruleBuilder) accept(port string) {
	for _, p := range []string{"tcp", "udp"} {
		spec := []string{"-d", b.host, "-p", p, "-m", p, "--dport", port}
		spec = append(spec, b.socket()...)
		b.add("filter", "INPUT", append(spec, "-m", "comment", "--comment", commentAccept, "-j", "ACCEPT"))
	}
	for _, p := range []string{"tcp", "udp"} {
		b.add("filter", "INPUT", b.to(p, port, commentNoSocket, "DROP"))
	}
}

// fallback adds the rest of the fallback's rules for one DNS port: the
// host's clients gated in OUTPUT, the count, the jumps to the address's
// DNAT chain, and the masquerade of what the host sent from the address
// itself (the kernel picks a local destination as the source, and a reply
// to it would stay on kube-dns' node).
func (b *ruleBuilder) fallback(port string) {
	for _, p := range []string{"tcp", "udp"} {
		b.add("raw", "OUTPUT", b.notrack(p, port, b.gate()))
	}
	ip := b.a.String()
	count := []string{"-m", "conntrack", "--ctstate", "NEW", "--ctorigdst", ip, "--ctorigdstport", port,
		"-m", "comment", "--comment", commentCount}
	b.add("filter", "OUTPUT", count)  // after the ACCEPT of our answers: they never reach it
	b.add("filter", "FORWARD", count) // pods' queries sent on to kube-dns
	chain := fallbackChain(b.a)
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		for _, p := range []string{"tcp", "udp"} {
			b.put(Rule{IPv6: b.a.Is6(), Table: "nat", Chain: hook, Append: true,
				Spec: []string{"-d", b.host, "-p", p, "-m", p, "--dport", port, "-m", "comment", "--comment", commentFallback, "-j", chain}})
		}
	}
	b.add("nat", "POSTROUTING", []string{"-s", b.host, "-m", "conntrack", "--ctstate", "DNAT", "--ctorigdst", ip, "--ctorigdstport", port,
		"-m", "comment", "--comment", commentMasq, "-j", "MASQUERADE"})
}

// Fallback is where the kernel sends the queries of an address no instance
// serves.
type Fallback struct {
	// UDP and TCP are kube-dns' ready pods (the DNS ports of their
	// EndpointSlices, or kube-proxy's rules), of either family: an
	// address's chain takes those of its own.
	UDP, TCP []netip.AddrPort
	// Services are addresses known to be a Service's ClusterIP: kube-proxy
	// translates them, so their chain stays empty.
	Services []netip.Addr
	// Node are addresses whose queries go elsewhere than kube-dns: the
	// node listener's (-node-listen), to the node's own resolvers, UDP and
	// TCP alike (never kube-dns: kube-dns may forward to that address).
	Node map[netip.Addr][]netip.AddrPort
}

// chainTargets is what an address's chain holds: DNAT targets per protocol.
type chainTargets struct{ udp, tcp []netip.AddrPort }

func (f *Fallback) targets(a netip.Addr) chainTargets {
	if slices.Contains(f.Services, a) {
		return chainTargets{}
	}
	if n, ok := f.Node[a]; ok {
		return chainTargets{udp: sameFamily(a, n), tcp: sameFamily(a, n)}
	}
	return chainTargets{udp: sameFamily(a, f.UDP), tcp: sameFamily(a, f.TCP)}
}

// sameFamily are the targets of in of a's family, each once.
func sameFamily(a netip.Addr, in []netip.AddrPort) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ap := range in {
		if ap.Addr().Is6() == a.Is6() && !slices.Contains(out, ap) {
			out = append(out, ap)
		}
	}
	return out
}

// Fallback says where each address's queries go while no instance serves
// it, for the log and -check-config: "kube-proxy" for a Service, the pods,
// or "" when nothing is known (no fallback).
func (s *Setup) FallbackTargets() map[netip.Addr]string {
	s.sem <- struct{}{}
	defer s.unlock()
	out := map[netip.Addr]string{}
	if s.fbWant == nil {
		return out
	}
	for _, a := range s.cfg.Addrs {
		switch t := s.fbWant.targets(a); {
		case slices.Contains(s.fbWant.Services, a):
			out[a] = "kube-proxy"
		case s.fbWant.Node[a] != nil && len(t.udp) > 0:
			out[a] = fmt.Sprint(t.udp) + " (the node's resolvers)"
		case len(t.udp)+len(t.tcp) > 0:
			out[a] = fmt.Sprint(t.udp)
		default:
			out[a] = ""
		}
	}
	return out
}

// SetFallback rewrites the addresses' DNAT chains for f and keeps them so
// (the reconciler repairs them). Until it is first called the chains keep
// what they hold: the previous instance's targets, which serve while this
// one starts. Each family's chains are rewritten at once (iptables-restore
// --noflush), so no packet meets a half-written chain.
func (s *Setup) SetFallback(ctx context.Context, f Fallback) error {
	if !s.cfg.SetupIPTables || s.cfg.FallbackAfter == 0 {
		return nil
	}
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("netsetup: fallback: %w", err)
	}
	defer s.unlock()
	if s.closed {
		return ErrClosed
	}
	f.UDP, f.TCP, f.Services, f.Node = slices.Clone(f.UDP), slices.Clone(f.TCP), slices.Clone(f.Services), maps.Clone(f.Node)
	s.fbWant = &f
	if !s.rulesWanted || s.tables == nil {
		return nil // EnsureRules writes them
	}
	return s.ensureChainContentsLocked(ctx)
}

// ensureChainsLocked creates the DNAT chains that are missing (empty):
// the jumps to them need them.
func (s *Setup) ensureChainsLocked() error {
	if s.cfg.FallbackAfter == 0 {
		return nil
	}
	var errs []error
	for _, a := range s.cfg.Addrs {
		ipt := s.tables[familyOf(a)]
		chain := fallbackChain(a)
		ok, err := ipt.ChainExists("nat", chain)
		if err == nil && !ok {
			if err = ipt.NewChain("nat", chain); err != nil && isChainExists(err) {
				err = nil // a twin made it meanwhile
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("netsetup: fallback chain %s for %s: %w", chain, a, err))
		}
	}
	return errors.Join(errs...)
}

func isChainExists(err error) bool {
	return err != nil && strings.Contains(err.Error(), "exists")
}

// toDestination reads the DNAT targets of a listed chain, per protocol.
var toDestination = regexp.MustCompile(`^-A \S+ -p (tcp|udp) .*-j DNAT --to-destination (\S+)$`)

// ensureChainContentsLocked rewrites the chains whose DNAT targets are not
// the wanted ones.
func (s *Setup) ensureChainContentsLocked(ctx context.Context) error {
	if s.fbWant == nil || s.cfg.FallbackAfter == 0 {
		return nil
	}
	var errs []error
	for _, fam := range []family{ipv4, ipv6} {
		ipt := s.tables[fam]
		if ipt == nil {
			continue
		}
		var restore bytes.Buffer
		n := 0
		for _, a := range s.cfg.Addrs {
			if familyOf(a) != fam {
				continue
			}
			want := s.fbWant.targets(a)
			chain := fallbackChain(a)
			lines, err := ipt.List("nat", chain)
			if err == nil && sameTargets(lines, want) {
				continue
			}
			writeChain(&restore, chain, want)
			n++
		}
		if n == 0 {
			continue
		}
		if err := s.restoreLocked(ctx, fam, "*nat\n"+restore.String()+"COMMIT\n"); err != nil {
			s.countIPTablesErr(err)
			errs = append(errs, err)
			continue
		}
		s.log.Info("fallback chains written", "family", fam.String(), "chains", n, "targets", fmt.Sprint(s.fbWant.UDP), "services", fmt.Sprint(s.fbWant.Services),
			"node_listener", fmt.Sprint(s.fbWant.Node))
	}
	return errors.Join(errs...)
}

// sameTargets reports whether a listed chain sends each protocol to want,
// in order.
func sameTargets(lines []string, want chainTargets) bool {
	var got chainTargets
	for _, l := range lines {
		m := toDestination.FindStringSubmatch(l)
		if m == nil {
			if strings.HasPrefix(l, "-A ") {
				return false // a rule we did not write
			}
			continue
		}
		ap, err := netip.ParseAddrPort(m[2])
		if err != nil {
			return false
		}
		if m[1] == "udp" {
			got.udp = append(got.udp, ap)
		} else {
			got.tcp = append(got.tcp, ap)
		}
	}
	return slices.Equal(got.udp, want.udp) && slices.Equal(got.tcp, want.tcp)
}

// writeChain writes chain for iptables-restore --noflush: declaring it
// flushes it, then one DNAT per target, spread evenly (each rule takes
// 1/(the targets left) of what reaches it), UDP to the pods' DNS port, TCP
// to their dns-tcp port.
func writeChain(b *bytes.Buffer, chain string, t chainTargets) {
	fmt.Fprintf(b, ":%s - [0:0]\n", chain)
	for _, p := range []struct {
		proto string
		to    []netip.AddrPort
	}{{"udp", t.udp}, {"tcp", t.tcp}} {
		for i, ap := range p.to {
			fmt.Fprintf(b, "-A %s -p %s -m comment --comment %q", chain, p.proto, commentPod)
			if left := len(p.to) - i; left > 1 {
				fmt.Fprintf(b, " -m statistic --mode random --probability %.10f", 1/float64(left))
			}
			fmt.Fprintf(b, " -j DNAT --to-destination %s\n", ap)
		}
	}
}

// restoreLocked feeds input to the family's iptables-restore --noflush.
func (s *Setup) restoreLocked(ctx context.Context, fam family, input string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LockWait+saveTimeout)
	defer cancel()
	name := binary(s.backend, fam) + "-restore"
	cmd := exec.CommandContext(ctx, name, "--noflush", "--wait", strconv.Itoa(lockWaitSeconds(s.cfg.LockWait)))
	cmd.Stdin = strings.NewReader(input)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netsetup: %s: %w: %s", name, err, bytes.TrimSpace(out))
	}
	return nil
}

// deleteChainsLocked removes the DNAT chains (after the jumps to them).
// A chain another group in this namespace still jumps to stays.
func (s *Setup) deleteChainsLocked(tables map[family]*iptables.IPTables) error {
	var errs []error
	for _, a := range s.cfg.Addrs {
		ipt := tables[familyOf(a)]
		chain := fallbackChain(a)
		if !s.tableLoaded(familyOf(a), "nat") {
			continue
		}
		if ok, err := ipt.ChainExists("nat", chain); err != nil || !ok {
			continue
		}
		if err := ipt.ClearAndDeleteChain("nat", chain); err != nil && !isBusy(err) {
			errs = append(errs, fmt.Errorf("netsetup: delete chain %s: %w", chain, err))
		}
	}
	return errors.Join(errs...)
}

// isBusy: a chain still jumped to cannot be deleted.
func isBusy(err error) bool {
	return strings.Contains(err.Error(), "in use") || strings.Contains(err.Error(), "busy") ||
		strings.Contains(err.Error(), "Too many links")
}

// Heartbeat opens the gate of every address (or keeps it open): the kernel
// gives their queries to our sockets for FallbackAfter from now. Call it
// while every serving loop is alive. It writes the xt_recent table, which
// exists once EnsureRules has put the rules in.
func (s *Setup) Heartbeat() error { return s.writeGate('+') }

// CloseGate closes the gate of every address at once: their next queries
// go to kube-dns. Call it before draining on an exit no twin takes over,
// so what is queued in the sockets is answered and nothing more comes.
func (s *Setup) CloseGate() error { return s.writeGate('-') }

func (s *Setup) writeGate(op byte) error {
	if !s.cfg.SetupIPTables || s.cfg.FallbackAfter == 0 {
		return nil
	}
	var errs []error
	for _, a := range s.cfg.Addrs {
		table := s.cfg.gateTable(a.Is6())
		// One command per open file: the kernel reads one, at offset 0.
		err := writeProc(recentDir+table, string(op)+a.String())
		var pe *fs.PathError
		written := errors.As(err, &pe) && pe.Op == "write"
		switch {
		case err == nil:
		case op == '-' && written && errors.Is(err, syscall.ENOENT):
			// Removing an entry that is not there: closed already.
		case !written && errors.Is(err, fs.ErrNotExist) && op == '-':
			// No table: no rule, no gate to close.
		case !written && errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("netsetup: gate: no xt_recent table %s (the rules are not in place): %w", table, err))
		default:
			errs = append(errs, fmt.Errorf("netsetup: gate %c%s: %w", op, a, err))
		}
	}
	return errors.Join(errs...)
}

// writeProc opens path, writes s in one write and closes it.
func writeProc(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// GateOpen lists the addresses whose gate entry exists (open, or closed by
// age but not removed), for tests and the log.
func (s *Setup) GateOpen() []netip.Addr {
	var out []netip.Addr
	for _, v6 := range []bool{false, true} {
		b, err := os.ReadFile(recentDir + s.cfg.gateTable(v6))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(f, "src="); ok {
				if a, err := netip.ParseAddr(v); err == nil {
					out = append(out, a)
				}
			}
		}
	}
	return out
}
