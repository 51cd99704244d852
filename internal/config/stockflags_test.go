package config

import (
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
)

func stockEnv() Env {
	return envOf(map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11", "KUBE_DNS_SERVICE_HOST": "10.96.0.10"})
}

// base are flags every test here passes: no host file may leak in.
func base(t *testing.T, dir string, more ...string) []string {
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 10.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return append([]string{"-resolv-conf", rc, "-kubednscm", "", "-basecorefile", filepath.Join(dir, "none")}, more...)
}

// Every flag of the stock image parses, in every spelling Go's flag takes.
func TestStockFlagsEverySpelling(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(".:53 {\n forward . 10.0.0.2\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bools := map[string]bool{"setupinterface": true, "setupiptables": true, "skipteardown": true, "reloadwithsignal": true, "quiet": true}
	for _, spell := range []func(k, v string) []string{
		func(k, v string) []string { return []string{"-" + k, v} },
		func(k, v string) []string { return []string{"-" + k + "=" + v} },
		func(k, v string) []string { return []string{"--" + k, v} },
		func(k, v string) []string { return []string{"--" + k + "=" + v} },
	} {
		var args []string
		for _, kv := range [][2]string{
			{"localip", "169.254.20.10,10.96.0.10"}, {"setupinterface", "false"}, {"interfacename", "nodelocaldns"},
			{"syncinterval", "1ns"}, {"metrics-listen-address", "0.0.0.0:9353"}, {"setupiptables", "false"},
			{"corefile", conf}, {"upstreamsvc", "kube-dns-upstream"},
			{"health-port", "8080"}, {"skipteardown", "true"}, {"reloadwithsignal", "true"},
			{"prometheus-listen-address", ":9253"}, {"pidfile", "/tmp/x.pid"}, {"dns.port", "53"}, {"p", "53"}, {"quiet", "true"},
			{"log-format", "text"},
		} {
			if bools[kv[0]] && !strings.Contains(strings.Join(spell("k", "v"), " "), "=") {
				// Go's flag takes a bool's value only after '=': -x alone is true.
				if kv[1] == "true" {
					args = append(args, spell(kv[0], "")[0])
				} else {
					args = append(args, spell(kv[0], kv[1])[0]+"="+kv[1])
				}
				continue
			}
			args = append(args, spell(kv[0], kv[1])...)
		}
		c, err := Parse(base(t, dir, args...), stockEnv(), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if c.SyncInterval != time.Second || c.DropIn.PidFile != "/tmp/x.pid" || !c.DropIn.Quiet || !c.DropIn.ReloadWithSignal || !c.SkipTeardown || c.SetupIPTables {
			t.Fatalf("%+v", c)
		}
	}
}

func TestSyncIntervalQuirk(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		arg  []string
		want time.Duration
	}{
		{nil, 60 * time.Second},
		{[]string{"-syncinterval", "1ns"}, time.Second},
		{[]string{"-syncinterval", "60ns"}, 60 * time.Second},
		{[]string{"-syncinterval", "30s"}, 30 * time.Second},
		{[]string{"-syncinterval=2m"}, 2 * time.Minute},
	} {
		c, err := Parse(base(t, dir, append([]string{"-localip", "169.254.20.10"}, tc.arg...)...), stockEnv(), io.Discard)
		if err != nil || c.SyncInterval != tc.want {
			t.Errorf("%v: %v %v, want %v", tc.arg, c.SyncInterval, err, tc.want)
		}
	}
	if _, err := Parse(base(t, dir, "-syncinterval", "0"), stockEnv(), io.Discard); err == nil {
		t.Error("-syncinterval 0 accepted")
	}
}

func TestVersionAndPlugins(t *testing.T) {
	dir := t.TempDir()
	c, err := Parse(base(t, dir, "-version"), stockEnv(), io.Discard)
	if err != nil || !strings.HasPrefix(c.DropIn.Exit, "nodelocaldns-") {
		t.Fatalf("%v %q", err, c.DropIn.Exit)
	}
	c, err = Parse(base(t, dir, "--plugins"), stockEnv(), io.Discard)
	if err != nil || !strings.Contains(c.DropIn.Exit, "  dns.forward\n") || !strings.Contains(c.DropIn.Exit, "  dns.cache\n") {
		t.Fatalf("%v %q", err, c.DropIn.Exit)
	}
}

const refTmpl = "../corefile/testdata/reference.Corefile.tmpl"

// The reference manifest in iptables mode: args as it passes them, the
// ConfigMap as Corefile.base, the kube-dns ConfigMap directory.
func TestReferenceManifestCorefileMode(t *testing.T) {
	dir := t.TempDir()
	tmpl, err := os.ReadFile(refTmpl)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.NewReplacer("__PILLAR__LOCAL__DNS__", "169.254.20.10", "__PILLAR__DNS__DOMAIN__", "cluster.local", "__PILLAR__DNS__SERVER__", "10.96.0.10").Replace(string(tmpl))
	baseFile := filepath.Join(dir, "Corefile.base")
	if err := os.WriteFile(baseFile, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	cm := filepath.Join(dir, "kube-dns")
	if err := os.MkdirAll(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cm, "stubDomains"), []byte(`{"acme.local": ["1.2.3.4"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "Corefile")
	args := base(t, dir, "-localip", "169.254.20.10,10.96.0.10", "-conf", conf, "-upstreamsvc", "kube-dns-upstream", "-pidfile", "/tmp/node-cache.pid")
	args = append(args, "-basecorefile", baseFile, "-kubednscm", cm)
	c, err := Parse(args, stockEnv(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	written, err := os.ReadFile(conf)
	if err != nil || !strings.Contains(string(written), "acme.local:53 {\n    errors\n    cache 30\n    bind 169.254.20.10 10.96.0.10\n    forward . 1.2.3.4\n}\n") {
		t.Fatalf("written Corefile: %v\n%s", err, written)
	}
	if c.KubeDNS != netip.MustParseAddrPort("10.96.0.11:53") || strings.Join(c.DropIn.KubeDNSZones, " ") != "cluster.local. in-addr.arpa. ip6.arpa." {
		t.Fatalf("kube-dns %v zones %v", c.KubeDNS, c.DropIn.KubeDNSZones)
	}
	if len(c.LocalIPs) != 2 || c.HealthAddr != "169.254.20.10:8080" || c.HealthPort != 8080 || c.MetricsAddr != ":9253" {
		t.Fatalf("listen %v health %s metrics %s", c.LocalIPs, c.HealthAddr, c.MetricsAddr)
	}
	if c.Cache.ClusterSuccessTTL != 30*time.Second || c.Cache.ClusterDenialTTL != 5*time.Second || c.Cache.SuccessTTL != 30*time.Second ||
		c.Cache.SuccessCapacity != 9984+3*10000 || c.Cache.MinTTL != 5*time.Second || c.Cache.StaleWindow != 0 || c.Cache.PrefetchHits != 0 {
		t.Fatalf("cache %+v", c.Cache)
	}
	if c.DropIn.NodeCacheMetricsAddr != "0.0.0.0:9353" {
		t.Fatalf("node-cache's metrics endpoint %q", c.DropIn.NodeCacheMetricsAddr)
	}
	if len(c.DropIn.Routes) != 0 || c.ResolvConf != "/etc/resolv.conf" && !strings.HasSuffix(c.ResolvConf, "resolv.conf") {
		t.Fatalf("routes %v resolv %s", c.DropIn.Routes, c.ResolvConf)
	}
}

func TestCorefileAsIsAndFlagsWin(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	text := "cluster.local:53 {\n  cache 10\n  bind 169.254.25.10\n  forward . 10.233.0.3 {\n    force_tcp\n  }\n  health 169.254.25.10:9254\n  prometheus 169.254.25.10:9253\n}\n" +
		"corp.example:53 {\n  bind 169.254.25.10\n  forward . 10.1.0.1 10.1.0.2:5353\n}\n" +
		".:53 {\n  cache 30\n  bind 169.254.25.10\n  forward . " + filepath.Join(dir, "resolv.conf") + "\n  log\n}\n"
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Parse(base(t, dir, "-localip", "169.254.25.10", "-conf", conf, "-cluster-success-ttl", "20s"), stockEnv(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.KubeDNS != netip.MustParseAddrPort("10.233.0.3:53") || c.QueryLog || c.HealthPort != 9254 {
		t.Fatalf("%+v", c)
	}
	// log is the "." block's only: CoreDNS's lines for its names.
	// (Which block answers a name, and so logs it, is the block table's:
	// internal/blocks, internal/running.)
	logRules := func(s *corefile.Server) []dnslog.Rule { r, _ := s.Config("log").([]dnslog.Rule); return r }
	if srv := c.DropIn.Corefile.Servers; len(srv) != 3 || logRules(srv[0]) != nil || logRules(srv[1]) != nil || srv[2].Zones[0] != "." ||
		len(logRules(srv[2])) != 1 || logRules(srv[2])[0].Format != dnslog.DefaultFormat {
		t.Fatalf("block log %+v", srv)
	}
	if len(c.DropIn.Routes) != 1 || c.DropIn.Routes[0].Zone != "corp.example." || len(c.DropIn.Routes[0].Servers) != 2 {
		t.Fatalf("routes %+v", c.DropIn.Routes)
	}
	if c.Cache.ClusterSuccessTTL != 20*time.Second || !strings.Contains(strings.Join(c.DropIn.Notes, "\n"), "-cluster-success-ttl 20s wins over the Corefile's 10s") {
		t.Fatalf("%v %v", c.Cache.ClusterSuccessTTL, c.DropIn.Notes)
	}
	// An unsupported directive stops the start: one line, file and line.
	if err := os.WriteFile(conf, []byte(".:53 {\n  forward . 1.1.1.1\n  kubernetes cluster.local\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Parse(base(t, dir, "-localip", "169.254.25.10", "-conf", conf), stockEnv(), io.Discard)
	if err == nil || !strings.Contains(err.Error(), conf+":3: directive kubernetes is not supported") {
		t.Fatal(err)
	}
}
