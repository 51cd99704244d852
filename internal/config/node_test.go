package config

import (
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNodeListenerKeepsTheNodesRealResolvers: the node listener's
// addresses are ours like -localip's, so a resolv.conf that points the node
// at them (after the operator did, docs/deploy.md) loses them and keeps
// the node's real resolvers; one that lists nothing else is refused, as a
// loop, naming the address. The interface and the rules get them.
func TestNodeListenerKeepsTheNodesRealResolvers(t *testing.T) {
	rc := writeFile(t, "nameserver 169.254.20.11\nnameserver 10.0.0.2\n")
	c, err := Parse([]string{"-kube-dns", "10.96.0.11", "-node-listen", "169.254.20.11", "-resolv-conf", rc}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Nameservers, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:53")}) {
		t.Fatalf("nameservers %v: the node listener's own address must be dropped", c.Nameservers)
	}
	wantSockets := []netip.AddrPort{netip.MustParseAddrPort("169.254.20.10:53"), netip.MustParseAddrPort("169.254.20.11:53")}
	if !slices.Equal(c.Sockets(), wantSockets) {
		t.Fatalf("sockets %v, want %v (the node listener's last)", c.Sockets(), wantSockets)
	}
	if !slices.Equal(c.InterfaceIPs, []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("169.254.20.11")}) {
		t.Fatalf("interface addresses %v", c.InterfaceIPs)
	}
	var out strings.Builder
	Describe(&out, c)
	if !strings.Contains(out.String(), "node listener:    [169.254.20.11] port 53: every name to the node's resolvers [10.0.0.2:53]") {
		t.Fatalf("describe:\n%s", out.String())
	}

	self := writeFile(t, "nameserver 169.254.20.11\n")
	_, err = Parse([]string{"-kube-dns", "10.96.0.11", "-node-listen", "169.254.20.11", "-resolv-conf", self}, envOf(nil), io.Discard)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "only our own addresses (169.254.20.11)") {
		t.Fatalf("a resolv.conf naming only the node listener: %v", err)
	}
}

func TestNodeFlagsRefused(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	core := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(core, []byte(".:53 {\n  forward . /etc/resolv.conf\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-node-listen", "169.254.20.10"}, "also a -localip address"},
		{[]string{"-node-listen", "0.0.0.0"}, "cannot be a listen address"},
		{[]string{"-node-listen", "169.254.20.11", "-kube-dns", "169.254.20.11"}, "is a -node-listen address: forwarding there loops"},
		{[]string{"-external-upstream", "coredns"}, `"coredns" is not node or kube-dns`},
		{[]string{"-external-upstream", "kube-dns", "-local-mode", "-kube-dns", ""}, "needs a cluster"},
		{[]string{"-node-listen", "169.254.20.11", "-conf", core, "-basecorefile", ""}, "-node-listen is the flags' configuration"},
		{[]string{"-external-upstream", "kube-dns", "-conf", core, "-basecorefile", ""}, "-external-upstream is the flags' configuration"},
		{[]string{"-node-condition", "Ready", "-node-name", "n1"}, "the kubelet's own condition"},
		{[]string{"-node-condition", "nodelocaldns.io/DNS Ready", "-node-name", "n1"}, "is not a condition type"},
		{[]string{"-node-condition", "nodelocaldns.io/DNSReady"}, "need this node's name"},
		{[]string{"-node-ready-label", "kubernetes.io/dns", "-node-name", "n1"}, "Kubernetes' own"},
		{[]string{"-node-ready-label", "a/b/c", "-node-name", "n1"}, "is not a label key"},
		{[]string{"-node-condition", "x.io/Y", "-node-name", "n1", "-node-status-as", "root"}, `"root" is not node or serviceaccount`},
	} {
		args := append([]string{"-resolv-conf", rc}, tc.args...)
		if !slices.Contains(args, "-kube-dns") {
			args = append(args, "-kube-dns", "10.96.0.11")
		}
		_, err := Parse(args, envOf(nil), io.Discard)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestNodeStatusFlags(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	c, err := Parse([]string{"-kube-dns", "10.96.0.11", "-resolv-conf", rc, "-node-condition", "nodelocaldns.io/DNSReady",
		"-node-ready-label", "addon.gke.io/node-local-dns-ds-ready", "-external-upstream", "kube-dns"},
		envOf(map[string]string{"NODE_NAME": "node1"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.PublishesNodeStatus() || c.Node.StatusAs != StatusAsNode || !c.Node.ExternalToKubeDNS || c.Autopath.NodeName != "node1" {
		t.Fatalf("%+v", c.Node)
	}
	var out strings.Builder
	Describe(&out, c)
	for _, want := range []string{
		"node status:      node node1: condition nodelocaldns.io/DNSReady",
		"label addon.gke.io/node-local-dns-ds-ready=true",
		"as the node itself (constrained impersonation of system:node:node1)",
		"external names:   to kube-dns 10.96.0.11:53 (-external-upstream=kube-dns)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, out.String())
		}
	}
}

// TestConfigMapServersMayNotBeTheNodeListener: upstreamNameservers naming
// the node listener would send the pods' names there and back: refused
// like our -localip.
func TestConfigMapServersMayNotBeTheNodeListener(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	c, err := Parse([]string{"-kube-dns", "10.96.0.11", "-node-listen", "169.254.20.11", "-resolv-conf", rc}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ParseKubeDNSConfigMap(ConfigMapData{UpstreamNameservers: []byte(`["169.254.20.11"]`)})
	if err == nil || !strings.Contains(err.Error(), "our own listen address") {
		t.Fatalf("upstreamNameservers naming the node listener: %v", err)
	}
}
