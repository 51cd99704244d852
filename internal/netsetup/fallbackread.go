package netsetup

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Count is what went through an address's fallback: new conntrack flows
// (a UDP query from a source port not seen in the last 30 s or so, a TCP
// connection) that the kernel sent to kube-dns because no instance served
// the address, by where they came from.
type Count struct {
	Pods uint64 `json:"pods"` // through FORWARD: the pod network's clients
	Host uint64 `json:"host"` // through OUTPUT: the host's own (hostNetwork pods, the kubelet)
}

// counterField is the packet counter `iptables -S -v` writes into a rule.
var counterField = regexp.MustCompile(` -c (\d+) \d+`)

// FallbackCounts reads the counting rules' packet counters, per address
// (summed over its DNS ports). The counters live in the kernel with the
// rules, so they hold what happened while no process of ours ran.
func (s *Setup) FallbackCounts(ctx context.Context) (map[netip.Addr]Count, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.unlock()
	if s.closed || s.tables == nil || s.cfg.FallbackAfter == 0 {
		return nil, nil
	}
	out := map[netip.Addr]Count{}
	for _, chain := range []string{"FORWARD", "OUTPUT"} {
		listed := map[family][]string{}
		for _, r := range s.rules {
			if r.Table != "filter" || r.Chain != chain || !strings.Contains(r.saveLine(), commentCount) {
				continue
			}
			lines, ok := listed[r.family()]
			if !ok {
				var err error
				if lines, err = s.tables[r.family()].ListWithCounters("filter", chain); err != nil {
					s.countIPTablesErr(err)
					return nil, fmt.Errorf("netsetup: fallback counters: %w", err)
				}
				listed[r.family()] = lines
			}
			want := r.saveLine()
			for _, l := range lines {
				m := counterField.FindStringSubmatchIndex(l)
				if m == nil || l[:m[0]]+l[m[1]:] != want {
					continue
				}
				n, _ := strconv.ParseUint(l[m[2]:m[3]], 10, 64)
				a := countAddr(r)
				c := out[a]
				if chain == "FORWARD" {
					c.Pods += n
				} else {
					c.Host += n
				}
				out[a] = c
			}
		}
	}
	return out, nil
}

// countAddr is the address a counting rule names (--ctorigdst).
func countAddr(r Rule) netip.Addr {
	for i, w := range r.Spec {
		if w == "--ctorigdst" && i+1 < len(r.Spec) {
			a, _ := netip.ParseAddr(r.Spec[i+1])
			return a
		}
	}
	return netip.Addr{}
}

// KubeProxyView is what kube-proxy's iptables-mode rules say.
type KubeProxyView struct {
	// UDP and TCP are the endpoints kube-proxy sends the Service to.
	UDP, TCP []netip.AddrPort
	// Services are our addresses that some Service's ClusterIP rule names.
	Services []netip.Addr
}

// KubeProxy reads kube-proxy's iptables-mode rules (nat KUBE-SERVICES, the
// Service's KUBE-SVC-* chain, its KUBE-SEP-* DNATs) in the backend chosen:
// the endpoints it sends svc (the kube-dns address we forward to) to, and
// which of our addresses are Service ClusterIPs. It is the fallback's
// source of kube-dns' pods where the API server cannot be asked (the
// reference manifest grants no RBAC). Found nothing (kube-proxy in nftables
// or IPVS mode, a Service without endpoints): an empty view, no error.
func (s *Setup) KubeProxy(ctx context.Context, svc netip.AddrPort) (KubeProxyView, error) {
	var v KubeProxyView
	if err := s.lock(ctx); err != nil {
		return v, err
	}
	defer s.unlock()
	if s.closed || s.tables == nil {
		return v, nil
	}
	ipt := s.tables[familyOf(svc.Addr())]
	if ipt == nil {
		return v, nil
	}
	services, err := ipt.List("nat", "KUBE-SERVICES")
	if err != nil {
		if isNotExist(err) {
			return v, nil
		}
		return v, fmt.Errorf("netsetup: kube-proxy's rules: %w", err)
	}
	svcHost := netip.PrefixFrom(svc.Addr(), svc.Addr().BitLen()).String()
	for _, l := range services {
		w := ruleWords(l)
		d, _ := netip.ParsePrefix(w["-d"])
		if d.IsValid() && d.Bits() == d.Addr().BitLen() {
			for _, a := range s.cfg.Addrs {
				if a == d.Addr() && !slices.Contains(v.Services, a) {
					v.Services = append(v.Services, a)
				}
			}
		}
		if w["-d"] != svcHost || w["--dport"] != strconv.Itoa(int(svc.Port())) || !strings.HasPrefix(w["-j"], "KUBE-SVC-") {
			continue
		}
		eps, err := kubeProxyEndpoints(ipt.List, w["-j"])
		if err != nil {
			return v, err
		}
		if w["-p"] == "udp" {
			v.UDP = append(v.UDP, eps...)
		} else if w["-p"] == "tcp" {
			v.TCP = append(v.TCP, eps...)
		}
	}
	return v, nil
}

// kubeProxyEndpoints follows a KUBE-SVC chain to its KUBE-SEP chains'
// DNAT targets.
func kubeProxyEndpoints(list func(table, chain string) ([]string, error), svcChain string) ([]netip.AddrPort, error) {
	lines, err := list("nat", svcChain)
	if err != nil {
		return nil, fmt.Errorf("netsetup: kube-proxy's rules: %w", err)
	}
	var out []netip.AddrPort
	for _, l := range lines {
		sep := ruleWords(l)["-j"]
		if !strings.HasPrefix(sep, "KUBE-SEP-") {
			continue
		}
		seps, err := list("nat", sep)
		if err != nil {
			continue // gone meanwhile
		}
		for _, sl := range seps {
			w := ruleWords(sl)
			if w["-j"] != "DNAT" {
				continue
			}
			if ap, err := netip.ParseAddrPort(w["--to-destination"]); err == nil && !slices.Contains(out, ap) {
				out = append(out, ap)
			}
		}
	}
	return out, nil
}

// ruleWords maps each option of a listed rule to the word after it (the
// last one of a repeated option; quoted words unquoted).
func ruleWords(line string) map[string]string {
	w, err := splitRule(line)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for i := 0; i+1 < len(w); i++ {
		if strings.HasPrefix(w[i], "-") {
			out[w[i]] = w[i+1]
		}
	}
	return out
}
