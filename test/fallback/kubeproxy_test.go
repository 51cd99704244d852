package fallback

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// service is a kube-dns Service the stand-in translates: its ClusterIP and
// the kube-dns pod it sends it to.
type service struct {
	name string // kube-system/NAME
	addr string
	pod  string
	ipv6 bool
}

func services(f addrs) []service {
	return []service{
		{"kube-dns", f.clusterIP.String(), f.kubeDNS.String(), f.clusterIP.Is6()},
		{"kube-dns-upstream", f.upstream.String(), f.kubeDNS.String(), f.clusterIP.Is6()},
	}
}

func dest(ip string, ipv6 bool) string {
	if ipv6 {
		return "[" + ip + "]:53"
	}
	return ip + ":53"
}

// kubeProxyIPTables writes what kube-proxy's iptables mode writes for the
// services, through the backend's iptables-restore: KUBE-SERVICES jumped to
// from nat PREROUTING and OUTPUT (prepended, as kube-proxy does), a
// KUBE-SVC chain per Service port that marks traffic from outside the pod
// network for masquerade, a KUBE-SEP chain per endpoint with its DNAT, and
// KUBE-POSTROUTING's masquerade of marked packets.
func kubeProxyIPTables(t *testing.T, backend string, f addrs) {
	t.Helper()
	ipv6 := f.clusterIP.Is6()
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	var rules []string
	for i, s := range services(f) {
		for _, p := range []string{"udp", "tcp"} {
			port := "dns"
			if p == "tcp" {
				port = "dns-tcp"
			}
			svc, sep := fmt.Sprintf("KUBE-SVC-%d%s", i, strings.ToUpper(p)), fmt.Sprintf("KUBE-SEP-%d%s", i, strings.ToUpper(p))
			fmt.Fprintf(&b, ":%s - [0:0]\n:%s - [0:0]\n", svc, sep)
			c := fmt.Sprintf(`-m comment --comment "kube-system/%s:%s`, s.name, port)
			rules = append(rules,
				fmt.Sprintf(`-A KUBE-SERVICES -d %s/%d -p %s %s cluster IP" -m %s --dport 53 -j %s`, s.addr, bits(ipv6), p, c, p, svc),
				fmt.Sprintf(`-A %s ! -s %s -d %s/%d -p %s %s cluster IP" -m %s --dport 53 -j KUBE-MARK-MASQ`, svc, f.podCIDR, s.addr, bits(ipv6), p, c, p),
				fmt.Sprintf(`-A %s %s -> %s" -j %s`, svc, c, dest(s.pod, ipv6), sep),
				fmt.Sprintf(`-A %s -s %s/%d %s" -j KUBE-MARK-MASQ`, sep, s.pod, bits(ipv6), c),
				fmt.Sprintf(`-A %s -p %s %s" -m %s -j DNAT --to-destination %s`, sep, p, c, p, dest(s.pod, ipv6)))
		}
	}
	rules = append(rules,
		"-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
		"-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
		"-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
		"-A KUBE-POSTROUTING -j MASQUERADE",
		`-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	b.WriteString(strings.Join(rules, "\n") + "\nCOMMIT\n")
	restore := "iptables-" + backend + "-restore"
	if ipv6 {
		restore = "ip6tables-" + backend + "-restore"
	}
	cmd := exec.Command(restore, "--noflush")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s\n%s", restore, err, out, b.String())
	}
}

func bits(ipv6 bool) int {
	if ipv6 {
		return 128
	}
	return 32
}

// kubeProxyNFTables writes what kube-proxy's nftables mode makes: a table of
// its own with nat chains at the dstnat and srcnat priorities (the same as
// iptables' nat table, so which runs first is the order of registration:
// kube-proxy's first, made before the cache starts), a services chain
// dispatching on address, protocol and port, per-Service chains marking
// traffic from outside the pod network for masquerade, and the DNAT.
func kubeProxyNFTables(t *testing.T, f addrs) {
	t.Helper()
	ipv6 := f.clusterIP.Is6()
	fam, saddr, daddr := "ip", "ip saddr", "ip daddr"
	if ipv6 {
		fam, saddr, daddr = "ip6", "ip6 saddr", "ip6 daddr"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s kube-proxy {\n", fam)
	b.WriteString("  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }\n")
	b.WriteString("  chain nat-output { type nat hook output priority -100; policy accept; jump services; }\n")
	b.WriteString("  chain nat-postrouting { type nat hook postrouting priority srcnat; policy accept; jump masquerading; }\n")
	b.WriteString("  chain masquerading { meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; masquerade fully-random; }\n")
	b.WriteString("  chain mark-for-masquerade { meta mark set meta mark | 0x4000; }\n")
	var dispatch []string
	for i, s := range services(f) {
		for _, p := range []string{"udp", "tcp"} {
			svc := fmt.Sprintf("service-%d-%s", i, p)
			fmt.Fprintf(&b, "  chain %s { %s != %s jump mark-for-masquerade; meta l4proto %s dnat to %s; }\n",
				svc, saddr, f.podCIDR, p, dest(s.pod, ipv6))
			dispatch = append(dispatch, fmt.Sprintf("%s %s %s dport 53 goto %s;", daddr, s.addr, p, svc))
		}
	}
	fmt.Fprintf(&b, "  chain services { %s }\n}\n", strings.Join(dispatch, " "))
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s\n%s", err, out, b.String())
	}
}
