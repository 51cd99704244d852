package netsetup

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// saveTimeout bounds each iptables-save run during backend detection.
// 10 s: a node with tens of thousands of Service rules saves in about a
// second; a hung save must not stall startup for longer than this.
const saveTimeout = 10 * time.Second

// kubeletChains matches the chains kubelet (1.17 and later) creates in the
// backend the node uses, as iptables-save declares them.
var kubeletChains = regexp.MustCompile(`(?m)^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\s`)

// binary returns the iptables command of a backend and family, as Debian and
// the iptables-wrappers images install them.
func binary(backend string, f family) string {
	if f == ipv6 {
		return "ip6tables-" + backend
	}
	return "iptables-" + backend
}

// saveFunc runs an iptables-save command and returns its standard output,
// or nil if it could not run.
type saveFunc func(ctx context.Context, name string, args ...string) []byte

func runSave(ctx context.Context, name string, args ...string) []byte {
	ctx, cancel := context.WithTimeout(ctx, saveTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return nil
	}
	return out.Bytes()
}

// detectBackend picks legacy or nft as Kubernetes' iptables-wrappers does:
//
//  1. nft, if iptables-nft-save or ip6tables-nft-save of the mangle table
//     declares a kubelet chain;
//  2. legacy, if the full iptables-legacy-save or ip6tables-legacy-save does
//     (legacy is saved whole: naming a table would make the kernel create it);
//  3. legacy, if legacy holds more rules than nft (both families counted);
//  4. nft.
//
// Failures to run a save count as empty output. It returns the backend and
// the reason, for the log.
func detectBackend(ctx context.Context, save saveFunc) (backend, reason string) {
	for _, f := range []family{ipv4, ipv6} {
		cmd := binary(BackendNFT, f) + "-save"
		if kubeletChains.Match(save(ctx, cmd, "-t", "mangle")) {
			return BackendNFT, "kubelet chain found by " + cmd
		}
	}
	legacyRules := 0
	for _, f := range []family{ipv4, ipv6} {
		cmd := binary(BackendLegacy, f) + "-save"
		out := save(ctx, cmd)
		if kubeletChains.Match(out) {
			return BackendLegacy, "kubelet chain found by " + cmd
		}
		legacyRules += countRules(out)
	}
	nftRules := 0
	for _, f := range []family{ipv4, ipv6} {
		nftRules += countRules(save(ctx, binary(BackendNFT, f)+"-save"))
	}
	if legacyRules > nftRules {
		return BackendLegacy, fmt.Sprintf("no kubelet chain; legacy has more rules (%d against %d)", legacyRules, nftRules)
	}
	return BackendNFT, fmt.Sprintf("no kubelet chain; nft is the default (legacy %d rules, nft %d)", legacyRules, nftRules)
}

// countRules counts the rule lines ("-A ...") of iptables-save output.
func countRules(save []byte) int {
	n := 0
	for line := range bytes.Lines(save) {
		if bytes.HasPrefix(line, []byte("-")) {
			n++
		}
	}
	return n
}

// initTablesLocked chooses the backend on first use and opens an iptables
// handle for each family we have addresses of.
func (s *Setup) initTablesLocked(ctx context.Context) error {
	if s.backend == "" {
		backend, reason := s.cfg.Backend, "set by configuration"
		if backend == BackendAuto {
			backend, reason = detectBackend(ctx, runSave)
		}
		s.backend = backend
		s.log.Info("iptables backend chosen", "backend", backend, "reason", reason)
		s.obs.Backend(backend)
	}
	if s.tables != nil {
		return nil
	}
	tables, err := s.newTables(s.cfg.LockWait)
	if err != nil {
		return err
	}
	s.tables = tables
	return nil
}

// newTables opens the iptables handles of the chosen backend, waiting at
// most lockWait for the xtables lock on each call.
func (s *Setup) newTables(lockWait time.Duration) (map[family]*iptables.IPTables, error) {
	tables := make(map[family]*iptables.IPTables, 2)
	for _, a := range s.cfg.Addrs {
		f := familyOf(a)
		if tables[f] != nil {
			continue
		}
		proto := iptables.ProtocolIPv4
		if f == ipv6 {
			proto = iptables.ProtocolIPv6
		}
		ipt, err := iptables.New(
			iptables.IPFamily(proto),
			iptables.Path(binary(s.backend, f)),
			iptables.Timeout(lockWaitSeconds(lockWait)),
		)
		if err != nil {
			return nil, fmt.Errorf("netsetup: %s backend %s: %w", f, s.backend, err)
		}
		tables[f] = ipt
	}
	return tables, nil
}
