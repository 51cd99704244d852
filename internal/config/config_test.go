package config

import (
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func envOf(m map[string]string) Env { return func(k string) string { return m[k] } }

func TestParseDefaultsAndUpstreamSvc(t *testing.T) {
	rc := writeFile(t, "search default.svc.cluster.local\nnameserver 10.0.0.2\nnameserver 2001:db8::53\noptions ndots:5\n")
	c, err := Parse([]string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream", "-resolv-conf", rc},
		envOf(map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11", "KUBE_DNS_UPSTREAM_SERVICE_PORT": "5353"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.KubeDNS != netip.MustParseAddrPort("10.96.0.11:5353") || c.KubeDNSSource != "$KUBE_DNS_UPSTREAM_SERVICE_HOST" {
		t.Fatalf("kube-dns %v from %s", c.KubeDNS, c.KubeDNSSource)
	}
	if len(c.LocalIPs) != 2 || c.Port != 53 || c.ClusterDomain != "cluster.local." {
		t.Fatalf("%+v", c)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:53"), netip.MustParseAddrPort("[2001:db8::53]:53")}
	if len(c.Nameservers) != 2 || c.Nameservers[0] != want[0] || c.Nameservers[1] != want[1] {
		t.Fatalf("nameservers %v", c.Nameservers)
	}
	if c.MetricsAddr != "169.254.20.10:9253" || c.SyncInterval != time.Minute || !c.SetupInterface || !c.SetupIPTables {
		t.Fatalf("defaults: %+v", c)
	}
	if c.Cache.SuccessCapacity != 9984 || c.Cache.DenialCapacity != 9984 || c.Cache.ClusterDenialTTL != 5*time.Second || c.Cache.DenialTTL != 30*time.Second {
		t.Fatalf("cache defaults %+v", c.Cache)
	}
	// We advertise 1232 (upstream answers above it come over TCP) and
	// answer clients up to their EDNS size, at most 4096.
	if c.MaxUDPSize != 1232 || c.MaxClientUDPSize != 4096 {
		t.Fatalf("udp sizes: advertise %d, client cap %d", c.MaxUDPSize, c.MaxClientUDPSize)
	}
}

func TestUDPSizeFlagsAreSeparate(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	c, err := Parse([]string{"-kube-dns", "10.96.0.10", "-resolv-conf", rc, "-max-udp-size", "1400", "-max-client-udp-size", "65535"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxUDPSize != 1400 || c.MaxClientUDPSize != 65535 {
		t.Fatalf("advertise %d, client cap %d", c.MaxUDPSize, c.MaxClientUDPSize)
	}
	var out strings.Builder
	Describe(&out, c)
	if !strings.Contains(out.String(), "at most 65535 (512 without EDNS); we advertise 1400") {
		t.Fatalf("describe:\n%s", out.String())
	}
}

func TestExplicitKubeDNSWins(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	c, err := Parse([]string{"-kube-dns", "[fd00::a]:53", "-resolv-conf", rc}, envOf(map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.KubeDNS != netip.MustParseAddrPort("[fd00::a]:53") {
		t.Fatalf("kube-dns %v", c.KubeDNS)
	}
}

func TestLocalMode(t *testing.T) {
	rc := writeFile(t, "nameserver 127.0.0.1\nnameserver 192.0.2.1\n")
	c, err := Parse([]string{"-local-mode", "-localip", "127.0.0.1", "-resolv-conf", rc}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.SetupInterface || c.SetupIPTables || c.KubeDNS.IsValid() {
		t.Fatalf("local mode: %+v", c)
	}
	// Our own address on our port is dropped: it would be a loop.
	if len(c.Nameservers) != 1 || c.Nameservers[0].Addr() != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("nameservers %v", c.Nameservers)
	}
}

// TestCleanupNeedsNoKubeDNS: -cleanup removes what instances left on the
// node; it asks kube-dns nothing, so a node debugging pod, whose
// environment names no kube-dns Service, can run it.
func TestCleanupNeedsNoKubeDNS(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	c, err := Parse([]string{"-cleanup", "-localip", "169.254.20.10,10.96.0.10", "-resolv-conf", rc}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Cleanup || !c.SetupIPTables || c.FallbackAfter != 2*time.Second || c.Teardown != "auto" {
		t.Errorf("-cleanup: %+v", c)
	}
}

func TestBadInputIsOneClearError(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	only := writeFile(t, "nameserver 169.254.20.10\n")
	empty := writeFile(t, "search cluster.local\n")
	bad := writeFile(t, "nameserver not-an-ip\n")
	k := []string{"-kube-dns", "10.96.0.10", "-resolv-conf", rc}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-resolv-conf", rc}, "$KUBE_DNS_SERVICE_HOST is not set"},
		{append([]string{"-localip", "169.254.20.300"}, k...), "-localip"},
		{append([]string{"-localip", ""}, k...), "-localip"},
		{append([]string{"-port", "70000"}, k...), "-port"},
		{append([]string{"-port", "x"}, k...), "-port"},
		{append([]string{"-syncinterval", "60"}, k...), "syncinterval"},
		{append([]string{"-nosuchflag"}, k...), "nosuchflag"},
		{[]string{"-kube-dns", "10.96.0.10:0", "-resolv-conf", rc}, "-kube-dns"},
		{[]string{"-kube-dns", "kube-dns.svc", "-resolv-conf", rc}, "-kube-dns"},
		{append([]string{"-servfail-ttl", "1m"}, k...), "-servfail-ttl"},
		{append([]string{"-cluster-denial-ttl", "0s"}, k...), "-cluster-denial-ttl"},
		{append([]string{"-iptables-mode", "xtables"}, k...), "-iptables-mode"},
		{append([]string{"-fallback-after", "1500ms"}, k...), "-fallback-after"},
		{append([]string{"-fallback-after", "2m"}, k...), "-fallback-after"},
		{append([]string{"-teardown", "never"}, k...), "-teardown"},
		{append([]string{"-cache-max-bytes", "12Q"}, k...), "-cache-max-bytes"},
		{append([]string{"-interfacename", "a-very-long-interface-name"}, k...), "-interfacename"},
		{append([]string{"-max-udp-size", "511"}, k...), "-max-udp-size"},
		{append([]string{"-max-client-udp-size", "511"}, k...), "-max-client-udp-size"},
		{append([]string{"-max-client-udp-size", "65536"}, k...), "-max-client-udp-size"},
		{[]string{"-kube-dns", "10.96.0.10", "-resolv-conf", "/nonexistent/resolv.conf"}, "no such file"},
		{[]string{"-kube-dns", "10.96.0.10", "-resolv-conf", only}, "only our own addresses"},
		{[]string{"-kube-dns", "10.96.0.10", "-resolv-conf", empty}, "lists no nameserver"},
		{[]string{"-kube-dns", "10.96.0.10", "-resolv-conf", bad}, "not-an-ip"},
		{append([]string{"-local-mode"}, k...), "exclude"},
		{append([]string{"-port", "0"}, k...), "-port"},
		{append([]string{"-socket-uid", "-2"}, k...), "-socket-uid"},
		{append([]string{"-socket-uid", "4294967295"}, k...), "-socket-uid"},
		// Serving the kube-dns ClusterIP and forwarding to it loops.
		{append([]string{"-localip", "169.254.20.10,10.96.0.10"}, k...), "our own listen addresses"},
	}
	for _, tc := range tests {
		_, err := Parse(tc.args, envOf(nil), io.Discard)
		if err == nil || !errors.Is(err, ErrUsage) {
			t.Errorf("%v: err %v, want a usage error", tc.args, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") || strings.Contains(msg, "<nil>") {
			t.Errorf("%v: %q should be one line naming %q", tc.args, msg, tc.want)
		}
	}
}

// TestKubeDNSOnOwnAddressLoops: in iptables mode the cache serves the
// kube-dns ClusterIP; taking kube-dns from that very Service (the stock
// -upstreamsvc default) would send every cluster query back to us.
func TestKubeDNSOnOwnAddressLoops(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	env := envOf(map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10", "KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"})
	args := []string{"-localip", "169.254.20.10,10.96.0.10", "-resolv-conf", rc}
	_, err := Parse(append(args, "-upstreamsvc", "kube-dns"), env, io.Discard)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "$KUBE_DNS_SERVICE_HOST") || !strings.Contains(err.Error(), "kube-dns-upstream") {
		t.Fatalf("err %v, want a usage error naming the source and the way out", err)
	}
	if _, err := Parse(append(args, "-upstreamsvc", "kube-dns-upstream"), env, io.Discard); err != nil {
		t.Fatal(err)
	}
	// Another port on the same address is no loop.
	if _, err := Parse(append(args, "-kube-dns", "10.96.0.10:5353"), env, io.Discard); err != nil {
		t.Fatal(err)
	}
}

func TestSystemdStubIsFollowed(t *testing.T) {
	stub := writeFile(t, "nameserver 127.0.0.53\noptions edns0 trust-ad\n")
	real := writeFile(t, "nameserver 192.0.2.53\nnameserver not-valid\n")
	old := SystemdResolvConf
	SystemdResolvConf = real
	defer func() { SystemdResolvConf = old }()
	ns, err := LoadResolvConf(stub, nil, 53)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 1 || ns[0] != netip.MustParseAddrPort("192.0.2.53:53") {
		t.Fatalf("nameservers %v", ns)
	}
}

func TestAutopathFlags(t *testing.T) {
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 192.0.2.53\nsearch corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		return map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10", "NODE_NAME": "node-a"}[k]
	}
	c, err := Parse([]string{"-resolv-conf", rc, "-autopath"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Autopath.Enabled || c.Autopath.NodeName != "node-a" || c.Autopath.NodeResolvConf != rc {
		t.Errorf("autopath config %+v", c.Autopath)
	}
	c, err = Parse([]string{"-resolv-conf", rc}, env, io.Discard)
	if err != nil || c.Autopath.Enabled {
		t.Errorf("autopath on by default: %+v %v", c.Autopath, err)
	}
	noNode := func(k string) string { return map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10"}[k] }
	if _, err := Parse([]string{"-resolv-conf", rc, "-autopath"}, noNode, io.Discard); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("-autopath without a node name: %v", err)
	}
	if _, err := Parse([]string{"-resolv-conf", rc, "-autopath", "-local-mode"}, env, io.Discard); !errors.Is(err, ErrUsage) {
		t.Errorf("-autopath -local-mode: %v", err)
	}
}

// TestPProfIsLoopbackUnlessGiven: -pprof alone serves on loopback; an
// explicit address is taken as given and -check-config says it is not
// loopback; a Corefile's pprof without an address is loopback too.
func TestPProfIsLoopbackUnlessGiven(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	for _, tc := range []struct {
		args []string
		want string
		says string
	}{
		{nil, "", "pprof:            off"},
		{[]string{"-pprof"}, DefaultPProfAddr, "(loopback only)"},
		{[]string{"-pprof=false"}, "", "pprof:            off"},
		{[]string{"-pprof=[::1]:6060"}, "[::1]:6060", "(loopback only)"},
		{[]string{"-pprof=0.0.0.0:6060"}, "0.0.0.0:6060", "NOT loopback"},
	} {
		c, err := Parse(append([]string{"-kube-dns", "10.96.0.10", "-resolv-conf", rc}, tc.args...), envOf(nil), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.PProf != tc.want {
			t.Fatalf("%v: pprof %q, want %q", tc.args, c.PProf, tc.want)
		}
		var out strings.Builder
		Describe(&out, c)
		if !strings.Contains(out.String(), tc.says) {
			t.Fatalf("%v: -check-config does not say %q:\n%s", tc.args, tc.says, out.String())
		}
	}
	if _, err := Parse([]string{"-kube-dns", "10.96.0.10", "-resolv-conf", rc, "-pprof=6060"}, envOf(nil), io.Discard); err == nil {
		t.Fatal("-pprof=6060 (no host) accepted")
	}
}

// The -max-inflight flag bounds both the resolver's flights and each
// upstream group; their owners' defaults must agree.
func TestMaxInflightDefaultsAgree(t *testing.T) {
	if resolve.DefaultMaxInflight != forward.DefaultMaxInflight {
		t.Fatalf("resolve.DefaultMaxInflight %d, forward.DefaultMaxInflight %d", resolve.DefaultMaxInflight, forward.DefaultMaxInflight)
	}
}
