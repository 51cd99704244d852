package netsetup

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

const (
	hintChain   = ":KUBE-IPTABLES-HINT - [0:0]\n"
	canaryChain = ":KUBE-KUBELET-CANARY - [0:0]\n"
)

func rulesSave(n int) string {
	s := "*filter\n:INPUT ACCEPT [0:0]\n"
	for range n {
		s += "-A INPUT -p tcp --dport 22 -j ACCEPT\n"
	}
	return s + "COMMIT\n"
}

// TestDetectBackendDecision walks the iptables-wrappers decision with canned
// save outputs, keyed by command line.
func TestDetectBackendDecision(t *testing.T) {
	mangle := func(chain string) string { return "*mangle\n" + chain + "COMMIT\n" }
	tests := []struct {
		name  string
		saves map[string]string
		want  string
	}{
		{"nothing anywhere", nil, BackendNFT},
		{"hint in nft mangle", map[string]string{"iptables-nft-save -t mangle": mangle(hintChain), "iptables-legacy-save": rulesSave(9)}, BackendNFT},
		{"canary in ip6 nft mangle", map[string]string{"ip6tables-nft-save -t mangle": mangle(canaryChain), "iptables-legacy-save": rulesSave(9)}, BackendNFT},
		{"hint in legacy", map[string]string{"iptables-legacy-save": mangle(hintChain), "iptables-nft-save": rulesSave(9)}, BackendLegacy},
		{"canary in ip6 legacy", map[string]string{"ip6tables-legacy-save": mangle(canaryChain), "iptables-nft-save": rulesSave(9)}, BackendLegacy},
		{"hint on both sides: nft checked first", map[string]string{"iptables-nft-save -t mangle": mangle(hintChain), "iptables-legacy-save": mangle(hintChain)}, BackendNFT},
		{"more legacy rules", map[string]string{"iptables-legacy-save": rulesSave(3), "ip6tables-legacy-save": rulesSave(1), "iptables-nft-save": rulesSave(3)}, BackendLegacy},
		{"as many rules: nft", map[string]string{"iptables-legacy-save": rulesSave(2), "iptables-nft-save": rulesSave(2)}, BackendNFT},
		{"more nft rules", map[string]string{"iptables-legacy-save": rulesSave(2), "ip6tables-nft-save": rulesSave(3)}, BackendNFT},
		{"a rule naming the hint is not the chain", map[string]string{"iptables-legacy-save": "-A INPUT -j KUBE-IPTABLES-HINT\n", "iptables-nft-save": rulesSave(2)}, BackendNFT},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.name, " ", "_"), func(t *testing.T) {
			save := func(_ context.Context, name string, args ...string) []byte {
				return []byte(tt.saves[strings.Join(append([]string{name}, args...), " ")])
			}
			got, reason := detectBackend(t.Context(), save)
			if got != tt.want {
				t.Errorf("detectBackend = %s (%s), want %s", got, reason, tt.want)
			}
		})
	}
}

// TestDetectBackend creates kubelet's chains on one side in a namespace and
// checks that EnsureRules picks that side, reports it, and puts the rules
// there and only there.
func TestDetectBackend(t *testing.T) {
	tests := []struct {
		name    string
		force   string
		prepare [][]string
		want    string
	}{
		{name: "empty", want: BackendNFT},
		{name: "hint-legacy", want: BackendLegacy, prepare: [][]string{
			{"iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
			// nft holds more rules: the hint must win over the count.
			{"iptables-nft", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"},
			{"iptables-nft", "-A", "INPUT", "-p", "tcp", "--dport", "23", "-j", "ACCEPT"},
		}},
		{name: "hint-nft", want: BackendNFT, prepare: [][]string{
			{"iptables-nft", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
			{"iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"},
			{"iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "23", "-j", "ACCEPT"},
		}},
		{name: "canary-legacy-ipv6", want: BackendLegacy, prepare: [][]string{
			{"ip6tables-legacy", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"},
		}},
		{name: "more-rules-legacy", want: BackendLegacy, prepare: [][]string{
			{"iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"},
			{"iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "23", "-j", "ACCEPT"},
			{"iptables-nft", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"},
		}},
		{name: "forced-nft-over-legacy-hint", force: BackendNFT, want: BackendNFT, prepare: [][]string{
			{"iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			inNetns(t, nil, func(t *testing.T) {
				for _, cmd := range tt.prepare {
					sh(t, cmd[0], cmd[1:]...)
				}
				rec := &recorder{}
				addrs := []netip.Addr{testV4}
				s, err := New(Config{Addrs: addrs, SetupIPTables: true, Backend: tt.force, Logger: testLogger(t), Observer: rec})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.EnsureRules(t.Context()); err != nil {
					t.Fatal(err)
				}
				if got := rec.backendsSeen(); len(got) != 1 || got[0] != tt.want {
					t.Errorf("Observer.Backend calls = %v, want [%s]", got, tt.want)
				}
				if got := s.backendName(); got != tt.want {
					t.Errorf("backendName = %s, want %s", got, tt.want)
				}
				checkRulesOnce(t, tt.want, addrs, defaultPort, 0)
				other := map[string]string{BackendLegacy: BackendNFT, BackendNFT: BackendLegacy}[tt.want]
				if save := saveOf(t, other, ipv4); strings.Contains(save, "nodelocaldns") {
					t.Errorf("rules in the %s backend too:\n%s", other, save)
				}
				if err := s.Teardown(t.Context()); err != nil {
					t.Fatal(err)
				}
				if save := saveOf(t, tt.want, ipv4); strings.Contains(save, "nodelocaldns") {
					t.Errorf("rules left after teardown:\n%s", save)
				}
				rec.noErrors(t)
			})
		})
	}
}
