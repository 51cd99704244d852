package config

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A "." block forwarding to kube-dns (kops' forwardToKubeDNS, Gardener's
// disableForwardToUpstreamDNS, __PILLAR__CLUSTER__DNS__ or the address
// written out) sends every name there, as the stock: "." is a kube-dns
// zone, and -check-config says the node's resolvers are not asked. A "."
// block to the node's resolvers stays theirs.
func TestRootBlockToKubeDNS(t *testing.T) {
	block := func(keys, target string) string {
		return keys + " {\n    cache 30\n    bind 169.254.20.10\n    forward . " + target + " {\n        force_tcp\n    }\n}\n"
	}
	tests := []struct {
		name, corefile string
		zones          []string
		root           bool
	}{
		{"kops forwardToKubeDNS", block("cluster.local:53", "10.96.0.11") + block(".:53", "10.96.0.11"), []string{"cluster.local.", "."}, true},
		{"the cluster block after", block(".:53", "10.96.0.11") + block("cluster.local:53", "10.96.0.11"), []string{".", "cluster.local."}, true},
		{"one block for both", block("cluster.local:53 .:53", "10.96.0.11"), []string{"cluster.local.", "."}, true},
		{"the node's resolvers", block("cluster.local:53", "10.96.0.11") + block(".:53", "/etc/resolv.conf"), []string{"cluster.local."}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			conf := filepath.Join(dir, "Corefile")
			if err := os.WriteFile(conf, []byte(tc.corefile), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := Parse(base(t, dir, "-localip", "169.254.20.10", "-conf", conf), stockEnv(), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.DropIn.KubeDNSZones, tc.zones) || c.RootToKubeDNS() != tc.root {
				t.Fatalf("kube-dns zones %v, root to kube-dns %v; want %v, %v", c.DropIn.KubeDNSZones, c.RootToKubeDNS(), tc.zones, tc.root)
			}
			var out bytes.Buffer
			Describe(&out, c)
			kube := "kube-dns:         10.96.0.11:53 (from Corefile " + conf
			none := `node resolvers:   none asked: the Corefile's "." block forwards every other name to kube-dns`
			if !strings.Contains(out.String(), kube) || !strings.Contains(out.String(), strings.Join(tc.zones, " ")+"\n") ||
				strings.Contains(out.String(), none) != tc.root {
				t.Errorf("-check-config says:\n%s", out.String())
			}
		})
	}
}
