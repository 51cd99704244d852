package netsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stockRules is the node-cache rule set as iptables-save prints it, written
// out independently of rulesFor: %[1]s is the address with its prefix
// length, %[2]d the DNS port, %[3]d the health port.
var stockRules = []struct {
	table, line string
	health      bool // only with a health port
}{
	{"raw", `-A PREROUTING -d %[1]s -p tcp -m tcp --dport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, false},
	{"raw", `-A PREROUTING -d %[1]s -p udp -m udp --dport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, false},
	{"filter", `-A INPUT -d %[1]s -p tcp -m tcp --dport %[2]d -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`, false},
	{"filter", `-A INPUT -d %[1]s -p udp -m udp --dport %[2]d -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`, false},
	{"raw", `-A OUTPUT -s %[1]s -p tcp -m tcp --sport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, false},
	{"raw", `-A OUTPUT -s %[1]s -p udp -m udp --sport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, false},
	{"filter", `-A OUTPUT -s %[1]s -p tcp -m tcp --sport %[2]d -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`, false},
	{"filter", `-A OUTPUT -s %[1]s -p udp -m udp --sport %[2]d -m comment --comment "nodelocaldns: accept DNS" -j ACCEPT`, false},
	{"raw", `-A OUTPUT -d %[1]s -p tcp -m tcp --dport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, false},
	{"raw", `-A OUTPUT -d %[1]s -p udp -m udp --dport %[2]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, false},
	{"raw", `-A OUTPUT -d %[1]s -p tcp -m tcp --dport %[3]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, true},
	{"raw", `-A OUTPUT -s %[1]s -p tcp -m tcp --sport %[3]d -m comment --comment "nodelocaldns: skip conntrack" -j NOTRACK`, true},
}

type tableLine struct{ table, line string }

// expectedRules lists the rules a family's save output must hold.
func expectedRules(addrs []netip.Addr, f family, port, healthPort int) []tableLine {
	var out []tableLine
	for _, a := range addrs {
		if familyOf(a) != f {
			continue
		}
		for _, r := range stockRules {
			if r.health && healthPort == 0 {
				continue
			}
			out = append(out, tableLine{r.table, fmt.Sprintf(r.line, netip.PrefixFrom(a, a.BitLen()), port, healthPort)})
		}
	}
	return out
}

// parseSave splits iptables-save output into table -> rule lines.
func parseSave(save string) map[string][]string {
	tables := map[string][]string{}
	table := ""
	for line := range strings.Lines(save) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, "-A "):
			tables[table] = append(tables[table], line)
		}
	}
	return tables
}

func saveOf(t *testing.T, backend string, f family) string {
	t.Helper()
	return stdout(t, binary(backend, f)+"-save")
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// snapshot is every backend's and family's rule set, without the comment
// lines (they hold timestamps) and with chain counters zeroed (traffic moves
// them).
func snapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, backend := range []string{BackendLegacy, BackendNFT} {
		for _, f := range []family{ipv4, ipv6} {
			fmt.Fprintf(&b, "## %s\n", binary(backend, f))
			for line := range strings.Lines(saveOf(t, backend, f)) {
				if strings.HasPrefix(line, "#") {
					continue
				}
				b.WriteString(counters.ReplaceAllString(line, "[0:0]"))
			}
		}
	}
	return b.String()
}

// checkRulesOnce asserts that every expected rule is in the backend's save
// output exactly once, that no other rule names nodelocaldns, and that in
// each chain our rules come before the foreign ones.
func checkRulesOnce(t *testing.T, backend string, addrs []netip.Addr, port, healthPort int) {
	t.Helper()
	for _, f := range []family{ipv4, ipv6} {
		tables := parseSave(saveOf(t, backend, f))
		want := expectedRules(addrs, f, port, healthPort)
		for _, w := range want {
			n := 0
			for _, l := range tables[w.table] {
				if l == w.line {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s -t %s: %d copies of %s", binary(backend, f), w.table, n, w.line)
			}
		}
		ours := 0
		for table, lines := range tables {
			lastOurs, firstForeign := map[string]int{}, map[string]int{}
			for i, l := range lines {
				chain := strings.Fields(l)[1]
				if strings.Contains(l, "nodelocaldns") {
					ours++
					lastOurs[chain] = i
				} else if _, ok := firstForeign[chain]; !ok {
					firstForeign[chain] = i
				}
			}
			for chain, i := range firstForeign {
				if j, ok := lastOurs[chain]; ok && j > i {
					t.Errorf("%s -t %s %s: our rules are not before the foreign ones:\n%s", binary(backend, f), table, chain, strings.Join(lines, "\n"))
				}
			}
		}
		if ours != len(want) {
			t.Errorf("%s: %d rules name nodelocaldns, want %d", binary(backend, f), ours, len(want))
		}
	}
}

// addForeignRules puts rules we must not touch in every chain we use, so
// that every table and chain exists before setup (teardown then restores
// the rule set byte for byte). One differs from ours only by its port.
func addForeignRules(t *testing.T, backend string, addrs []netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		ipt := binary(backend, familyOf(a))
		host := netip.PrefixFrom(a, a.BitLen()).String()
		sh(t, ipt, "-t", "raw", "-A", "PREROUTING", "-p", "udp", "--dport", "9999", "-j", "NOTRACK")
		sh(t, ipt, "-t", "raw", "-A", "OUTPUT", "-p", "tcp", "--dport", "9999", "-m", "comment", "--comment", "foreign rule", "-j", "NOTRACK")
		sh(t, ipt, "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
		sh(t, ipt, "-t", "filter", "-A", "INPUT", "-d", host, "-p", "udp", "--dport", "54", "-j", "ACCEPT")
		sh(t, ipt, "-t", "filter", "-A", "OUTPUT", "-p", "udp", "--sport", "123", "-j", "ACCEPT")
	}
}

var testFamilies = []struct {
	name  string
	addrs []netip.Addr
}{
	{"ipv4", []netip.Addr{testV4}},
	{"ipv6", []netip.Addr{testV6}},
	{"dual", []netip.Addr{testV4, testV6}},
}

// TestRules runs the whole lifecycle for both backends and every family:
// rules exactly once after setup and after more EnsureRules calls, extra
// copies folded, a hand-deleted rule and a hand-removed address restored by
// the reconciler, and a teardown that restores the rule set byte for byte.
func TestRules(t *testing.T) {
	for _, backend := range []string{BackendLegacy, BackendNFT} {
		for _, fam := range testFamilies {
			t.Run(backend+"/"+fam.name, func(t *testing.T) {
				t.Parallel()
				inNetns(t, nil, func(t *testing.T) { testRulesLifecycle(t, backend, fam.addrs) })
			})
		}
	}
}

func testRulesLifecycle(t *testing.T, backend string, addrs []netip.Addr) {
	const port, healthPort = 53, 8080
	adoptableLink(t, defaultInterfaceName)
	addForeignRules(t, backend, addrs)
	before := snapshot(t)

	rec := &recorder{}
	s, err := New(Config{
		Addrs:          addrs,
		HealthPort:     healthPort,
		SetupInterface: true,
		SetupIPTables:  true,
		Backend:        backend,
		SyncInterval:   200 * time.Millisecond,
		LockWait:       2 * time.Second,
		Logger:         testLogger(t),
		Observer:       rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.EnsureLink(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureRules(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.backendsSeen(); len(got) != 1 || got[0] != backend {
		t.Errorf("Observer.Backend calls = %v, want [%s]", got, backend)
	}
	checkRulesOnce(t, backend, addrs, port, healthPort)
	other := map[string]string{BackendLegacy: BackendNFT, BackendNFT: BackendLegacy}[backend]
	for _, f := range familiesOf(addrs) {
		if save := saveOf(t, other, f); strings.Contains(save, "nodelocaldns") {
			t.Errorf("rules leaked into the %s backend:\n%s", other, save)
		}
	}

	for range 3 {
		if err := s.EnsureRules(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkRulesOnce(t, backend, addrs, port, healthPort)

	// Copies left by someone else (the stock node-cache piles them up) are
	// folded into one.
	dup := s.installedRules()[1]
	ipt := binary(backend, dup.family())
	for range 2 {
		sh(t, ipt, append([]string{"-t", dup.Table, "-I", dup.Chain, "1"}, dup.Spec...)...)
	}
	if err := s.EnsureRules(ctx); err != nil {
		t.Fatal(err)
	}
	checkRulesOnce(t, backend, addrs, port, healthPort)

	// The reconciler puts back a rule deleted by hand and an address
	// removed by hand.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(runCtx) }()

	gone := s.installedRules()[0]
	ipt = binary(backend, gone.family())
	sh(t, ipt, append([]string{"-t", gone.Table, "-D", gone.Chain}, gone.Spec...)...)
	eventually(t, 5*time.Second, "deleted rule restored", func() bool {
		return strings.Contains(saveOf(t, backend, gone.family()), gone.saveLine())
	})
	a := addrs[len(addrs)-1]
	sh(t, "ip", "addr", "del", netip.PrefixFrom(a, a.BitLen()).String(), "dev", defaultInterfaceName)
	took := eventually(t, time.Second, "removed address restored", func() bool { return hasAddr(t, defaultInterfaceName, a) })
	t.Logf("address restored after %v", took)
	checkRulesOnce(t, backend, addrs, port, healthPort)

	stop()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return within 2s of its context ending")
	}

	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Teardown(tctx); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t); after != before {
		t.Errorf("rule set after teardown differs from before setup:\n--- before\n%s\n--- after\n%s", before, after)
	}
	// The adopted link stays; the addresses we added go.
	for _, a := range addrs {
		if hasAddr(t, defaultInterfaceName, a) {
			t.Errorf("address %s left on the adopted link", a)
		}
	}
	rec.noErrors(t)
	if err := s.EnsureRules(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("EnsureRules after Teardown = %v, want ErrClosed", err)
	}
}

// TestLockWait holds the xtables lock (a private lock file, through
// XTABLES_LOCKFILE, so the host's lock is not involved) while rules are
// ensured and torn down with iptables-legacy; iptables-nft takes no lock.
func TestLockWait(t *testing.T) {
	t.Parallel()
	lockFile := filepath.Join(t.TempDir(), "xtables.lock")
	if os.Getenv(childEnv) != "" {
		lockFile = os.Getenv("XTABLES_LOCKFILE")
	}
	inNetns(t, []string{"XTABLES_LOCKFILE=" + lockFile}, func(t *testing.T) {
		adoptableLink(t, defaultInterfaceName)
		f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		flock := func(how int) {
			t.Helper()
			if err := unix.Flock(int(f.Fd()), how); err != nil {
				t.Fatal(err)
			}
		}

		rec := &recorder{}
		s, err := New(Config{
			Addrs: []netip.Addr{testV4}, SetupInterface: true, SetupIPTables: true,
			Backend: BackendLegacy, LockWait: time.Second, Logger: testLogger(t), Observer: rec,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		if err := s.EnsureLink(ctx); err != nil {
			t.Fatal(err)
		}

		flock(unix.LOCK_EX)
		start := time.Now()
		err = s.EnsureRules(ctx)
		took := time.Since(start)
		if err == nil || !isLockErr(err) {
			t.Fatalf("EnsureRules with the lock held = %v, want a lock error", err)
		}
		if rec.count(KindIPTablesLock) != 1 || rec.count(KindIPTables) != 0 {
			t.Errorf("counted %v, want one iptables_lock", rec.errs)
		}
		// One call waits LockWait, then the pass gives up.
		if took < time.Second || took > 4*time.Second {
			t.Errorf("EnsureRules took %v with a 1s lock wait", took)
		}

		flock(unix.LOCK_UN)
		if err := s.EnsureRules(ctx); err != nil {
			t.Fatal(err)
		}
		checkRulesOnce(t, BackendLegacy, []netip.Addr{testV4}, 53, 0)

		// Teardown gives up at its deadline when the lock stays held.
		flock(unix.LOCK_EX)
		tctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		start = time.Now()
		err = s.Teardown(tctx)
		took = time.Since(start)
		if err == nil {
			t.Error("Teardown with the lock held returned nil")
		}
		if took > 3*time.Second {
			t.Errorf("Teardown took %v with a 1.5s deadline", took)
		}
		flock(unix.LOCK_UN)
	})
}

// TestRulesExtraPort: a Corefile's blocks on another port (kubespray's
// external zones on 1053) get the DNS rules on that port too, once each,
// with both backends; the teardown takes them away with the rest. The
// stock node-cache names its -dns.port only (checked with the oracle:
// 1053 had no rule), so its second port is tracked by conntrack.
func TestRulesExtraPort(t *testing.T) {
	for _, backend := range []string{BackendLegacy, BackendNFT} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) {
				addrs := []netip.Addr{testV4, testV6}
				adoptableLink(t, defaultInterfaceName)
				addForeignRules(t, backend, addrs)
				before := snapshot(t)
				s, err := New(Config{Addrs: addrs, ExtraPorts: []int{1053}, HealthPort: 8080, SetupInterface: true, SetupIPTables: true,
					Backend: backend, LockWait: 2 * time.Second, Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				ctx := t.Context()
				if err := s.EnsureLink(ctx); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if err := s.EnsureRules(ctx); err != nil {
						t.Fatal(err)
					}
				}
				for _, f := range []family{ipv4, ipv6} {
					tables := parseSave(saveOf(t, backend, f))
					want := append(expectedRules(addrs, f, 53, 8080), expectedRules(addrs, f, 1053, 0)...)
					ours := 0
					for _, lines := range tables {
						for _, l := range lines {
							if strings.Contains(l, "nodelocaldns") {
								ours++
							}
						}
					}
					for _, w := range want {
						if n := slices.Index(tables[w.table], w.line); n < 0 {
							t.Errorf("%s: missing -t %s %s", f, w.table, w.line)
						}
					}
					if ours != len(want) {
						t.Errorf("%s: %d rules name nodelocaldns, want %d", f, ours, len(want))
					}
				}
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				if err := s.Teardown(tctx); err != nil {
					t.Fatal(err)
				}
				if after := snapshot(t); after != before {
					t.Errorf("rule set after teardown differs from before setup:\n--- before\n%s\n--- after\n%s", before, after)
				}
			})
		})
	}
	if _, err := New(Config{Addrs: []netip.Addr{testV4}, ExtraPorts: []int{70000}}); err == nil {
		t.Error("extra port 70000 accepted")
	}
}
