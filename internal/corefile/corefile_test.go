package corefile_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/nodelocaldns/nodelocaldns/internal/corefile"
	_ "github.com/nodelocaldns/nodelocaldns/internal/plugins" // the directives read by their own packages
)

var update = flag.Bool("update", false, "rewrite the golden files")

// sedIPTables and sedIPVS are the official docs' substitutions of the
// reference manifest (kube-proxy in iptables mode / IPVS mode).
func sedIPTables(s, local, domain, kubedns string) string {
	return strings.NewReplacer("__PILLAR__LOCAL__DNS__", local, "__PILLAR__DNS__DOMAIN__", domain, "__PILLAR__DNS__SERVER__", kubedns).Replace(s)
}

func sedIPVS(s, local, domain, kubedns string) string {
	s = strings.NewReplacer("__PILLAR__LOCAL__DNS__", local, "__PILLAR__DNS__DOMAIN__", domain).Replace(s)
	s = strings.ReplaceAll(s, ",__PILLAR__DNS__SERVER__", "")
	return strings.ReplaceAll(s, "__PILLAR__CLUSTER__DNS__", kubedns)
}

func TestRenderGolden(t *testing.T) {
	tmpl, err := os.ReadFile("testdata/reference.Corefile.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	stub := map[string][]string{"acme.local": {"1.2.3.4"}, "corp.example": {"10.150.0.1", "10.150.0.2:5353"}}
	up := []string{"8.8.8.8", "8.8.4.4"}
	for _, tc := range []struct {
		name     string
		mode     func(s, local, domain, kubedns string) string
		local    string // the -localip value after the sed
		kubedns  string
		upstream string // kube-dns-upstream's IP (iptables mode)
		stub     map[string][]string
		up       []string
	}{
		{"iptables-v4", sedIPTables, "169.254.20.10,10.96.0.10", "10.96.0.10", "10.96.0.11", nil, nil},
		{"iptables-v4-kubednscm", sedIPTables, "169.254.20.10,10.96.0.10", "10.96.0.10", "10.96.0.11", stub, up},
		{"iptables-v6", sedIPTables, "fd00::a,fd00:10:96::a", "fd00:10:96::a", "fd00:10:96::b", nil, nil},
		{"iptables-v6-kubednscm", sedIPTables, "fd00::a,fd00:10:96::a", "fd00:10:96::a", "fd00:10:96::b", stub, up},
		{"ipvs-v4", sedIPVS, "169.254.20.10", "10.96.0.10", "", nil, nil},
		{"ipvs-v4-kubednscm", sedIPVS, "169.254.20.10", "10.96.0.10", "", stub, up},
		{"ipvs-v6", sedIPVS, "fd00::a", "fd00:10:96::a", "", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := strings.Split(tc.local, ",")[0]
			tm := string(tmpl)
			if strings.Contains(local, ":") {
				// CoreDNS's health takes [IPv6]:port; IPv6 users bracket it.
				tm = strings.ReplaceAll(tm, "health __PILLAR__LOCAL__DNS__:8080", "health [__PILLAR__LOCAL__DNS__]:8080")
			}
			base := tc.mode(tm, local, "cluster.local", tc.kubedns)
			got := Render([]byte(base), RenderParams{LocalIP: tc.local, Port: 53, ClusterDNS: tc.upstream, StubDomains: tc.stub, UpstreamNameservers: tc.up})
			golden := filepath.Join("testdata/render", tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("rendered Corefile differs from %s:\n%s", golden, got)
			}
			// Every rendering is a Corefile we run.
			path := filepath.Join(t.TempDir(), "Corefile")
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			srv, err := Load(path, nil, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(srv) != 4+len(tc.stub) {
				t.Fatalf("%d blocks, want %d", len(srv), 4+len(tc.stub))
			}
			if strings.Contains(string(got), "__PILLAR__") {
				t.Fatal("a placeholder is left")
			}
		})
	}
}

// node-cache drops force_tcp from the "." block when upstreamNameservers
// are set, by replacing the exact text of the TCP block.
func TestRenderUpstreamDropsForceTCP(t *testing.T) {
	base := ".:53 {\n    forward . __PILLAR__UPSTREAM__SERVERS__ {\n            force_tcp\n    }\n}\n"
	got := string(Render([]byte(base), RenderParams{UpstreamNameservers: []string{"1.1.1.1"}}))
	if want := ".:53 {\n    forward . 1.1.1.1\n}\n"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	got = string(Render([]byte(base), RenderParams{}))
	if !strings.Contains(got, "forward . /etc/resolv.conf {\n            force_tcp") {
		t.Fatalf("without upstreamNameservers the TCP block stays: %q", got)
	}
	// Other indentation: node-cache only substitutes the servers.
	odd := strings.ReplaceAll(base, "    forward", "\tforward")
	got = string(Render([]byte(odd), RenderParams{UpstreamNameservers: []string{"1.1.1.1"}}))
	if !strings.Contains(got, "forward . 1.1.1.1 {") {
		t.Fatalf("got %q", got)
	}
}

func TestDistributionCorefilesLoad(t *testing.T) {
	files, _ := filepath.Glob("testdata/distros/*.Corefile")
	if len(files) < 6 {
		t.Fatalf("%d distribution Corefiles", len(files))
	}
	for _, f := range files {
		srv, err := Load(f, nil, Options{})
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if srv[0].Zones[0] != "cluster.local." || srv[0].Forward == nil || srv[0].Cache == nil || srv[0].Cache.DenialTTL != 5*time.Second {
			t.Errorf("%s: first block %+v", f, srv[0])
		}
	}
}

func load(t *testing.T, text string) ([]*Server, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(path, func(k string) string { return map[string]string{"LOCAL": "169.254.20.10", "PORT": "5353"}[k] }, Options{})
}

func TestSyntax(t *testing.T) {
	srv, err := load(t, "# comment\n"+
		"(common) {\n  errors\n  reload 10s\n}\n"+
		"cluster.local:53 extra.zone.:53 {   \n"+
		"\timport common\n"+
		"  bind {$LOCAL} \n"+ // the IPVS-mode sed leaves a trailing space
		"  cache {\n  }\n"+
		"  forward . 10.0.0.10:53 [fd00::10]:5353 dns://10.0.0.11 { # trailing comment\n    force_tcp\n    max_fails 3\n  }\n"+
		"  health :8080 {\n    lameduck 5s\n  }\n"+
		"}\n"+
		"dns://.:{$PORT} {\n  forward . \"/etc/resolv.conf\"\n  prometheus [::1]:9253\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	a := srv[0]
	if strings.Join(a.Zones, " ") != "cluster.local. extra.zone." || a.Port != 53 || a.Bind[0].String() != "169.254.20.10" {
		t.Fatalf("%+v", a)
	}
	if !a.Errors || !a.Reload || a.Cache.SuccessTTL != DefaultSuccessTTL || a.Forward.MaxFails != 3 || !a.Forward.ForceTCP || a.Health.LameDuck != 5*time.Second {
		t.Fatalf("%+v %+v %+v", a, a.Cache, a.Forward)
	}
	if got := a.Forward.To; len(got) != 3 || got[1].Addr.String() != "[fd00::10]:5353" || got[2].Addr.String() != "10.0.0.11:53" {
		t.Fatalf("%v", got)
	}
	// Plugin order is CoreDNS's, not the lines'.
	var names []string
	for _, p := range a.Plugins {
		names = append(names, p.Name)
	}
	if got := strings.Join(names, " "); got != "reload bind health errors cache forward" {
		t.Fatalf("plugin order %q", got)
	}
	b := srv[1]
	if b.Zones[0] != "." || b.Port != 5353 || b.Forward.To[0].ResolvConf != "/etc/resolv.conf" || b.Prometheus != "[::1]:9253" {
		t.Fatalf("%+v", b)
	}
}

func TestImportGlobRelative(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	must := func(p, s string) {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must("Corefile", ".:53 {\n  import opts/*.conf\n  forward . 1.1.1.1\n}\nimport conf.d/*.server\n")
	must("conf.d/a.server", "a.example {\n  forward . 10.0.0.1\n}\n")
	must("conf.d/b.server", "b.example {\n  forward . 10.0.0.2\n  bogus\n}\n")
	_, err := Load(filepath.Join(dir, "Corefile"), nil, Options{})
	if err == nil || !strings.Contains(err.Error(), "b.server:3: unknown directive bogus") {
		t.Fatalf("error names the imported file and line: %v", err)
	}
	must("conf.d/b.server", "b.example {\n  forward . 10.0.0.2\n}\n")
	srv, err := Load(filepath.Join(dir, "Corefile"), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(srv) != 3 || srv[2].Zones[0] != "b.example." {
		t.Fatalf("%d blocks", len(srv))
	}
}

// Each refused directive or option is one line naming file, line,
// directive and what is supported.
func TestUnsupportedOneLineErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"kubernetes cluster.local", ":2: directive kubernetes is not supported by nodelocaldns; supported: metadata, timeouts, reload, bufsize, bind, debug, trace, health, pprof, prometheus, errors, log, dnstap, dns64, loadbalance"},
		{"hosts {\n ttl 0\n}", ":3: hosts: ttl takes"},
		{"hosts {\n fallthrough\n 10.0.0.1 a.example\n}", ":4: hosts: unknown property 10.0.0.1"},
		{"hosts {\n fallthrough_unsupported\n}", ":2: hosts: fallthrough_unsupported requires fallthrough"},
		{"hosts\nhosts", ":3: hosts: given twice"},
		{"template IN", ":2: template: CLASS and TYPE are required"},
		{"template IN FOO", ":2: template: invalid query type FOO"},
		{"template IN A {\n answer \"x. IN TXT {{ .Var.x }}\"\n}", "uses .Var"},
		{"template IN A {\n match (\n}", ":2: template: match: \"(\""},
		{"template IN A {\n expr true\n}", ":3: template: option expr is not supported"},
		{"template IN A {\n rcode FOO\n}", ":3: template: unknown rcode FOO"},
		{"template IN A {\n ederror\n}", ":3: template: ederror takes an extended error code"},
		{"template IN A {\n ederror 1 a b\n}", ":3: template: ederror takes an extended error code"},
		{"template IN A {\n ederror 70000\n}", ":3: template: extended DNS error code 70000 is not a number from 0 to 65535"},
		{"template IN A {\n ederror 17 " + strings.Repeat("x", 256) + "\n}", ":3: template: extended DNS error text of 256 bytes: at most 255"},
		{"rewrite name a", ":2: rewrite: too few arguments for a name rule"},
		{"rewrite ttl a 3-2", ":2: rewrite: invalid TTL '3-2' for a ttl rule"},
		{"rewrite rcode a NXDOMAIN", ":2: rewrite: too few (2) arguments for a rcode rule"},
		{"rewrite edns0 local set 0xffee {client_port}", ":2: rewrite: variable {client_port} is not supported"},
		{"metadata {\n x\n}", ":3: metadata: option x is not supported"},
		{"metadata\n log . \"{/forward/upstream}\"", ":3: log: the metadata label forward/upstream"},
		{"rewrite edns0 subnet set 33 56", ":2: rewrite: invalid IPv4 bit mask length 33"},
		{"rewrite cname bogus a b", ":2: rewrite: unknown cname rewrite type: bogus"},
		{"rewrite name exact a b {\n answer auto\n}", ":3: rewrite: option answer is not supported"},
		{"dns64 10.0.0.0/8", ":2: dns64: \"10.0.0.0/8\" is not an IPv6 prefix"},
		{"dns64 {\n prefix 64:ff9b::/33\n}", ":3: dns64: invalid prefix length 33"},
		{"dns64 {\n frob\n}", ":3: dns64: unknown property frob"},
		{"frobnicate", ":2: unknown directive frobnicate"},
		{"forward . https://1.1.1.1", ":2: forward: TO \"https://1.1.1.1\": transport https:// is not supported"},
		{"forward . tls://1.1.1.1 /etc/resolv.conf", ":2: forward: a resolv.conf beside tls:// upstreams in one forward is not supported"},
		{"forward . tls://1.1.1.1 {\n tls a b c d\n}", ":3: forward: tls takes [CA], [CERT KEY] or [CERT KEY CA]"},
		{"forward . tls://1.1.1.1 {\n tls_servername\n}", ":3: forward: tls_servername takes one argument"},
		{"forward . 1.1.1.1 {\n frob x\n}", ":3: forward: option frob is not supported; supported: forward FROM TO..."},
		{"cache {\n serve_stale 1h verify 5s 30 1m\n}", ":3: cache: serve_stale response TTL \"30\" is not a duration"},
		{"cache {\n serve_stale_policy prefer_positive\n}", ":2: cache: serve_stale_policy requires serve_stale"},
		{"cache {\n disable sometimes example.org\n}", ":3: cache: cache type for disable must be \"success\" or \"denial\""},
		{"cache {\n disable\n}", ":3: cache: disable takes success or denial"},
		{"health {\n  frob\n}", ":3: health: option frob is not supported"},
		{"bind eth0", ":2: bind: \"eth0\" is not an IP address"},
		{"log . {\n class denial frob\n}", ":3: log: class: invalid class \"frob\""},
		{"log . {\n classes denial\n}", ":3: log: unknown property \"classes\""},
		{"log . {\n class\n}", ":3: log: class takes at least one"},
		{"cache 0", ":2: cache: TTL 0: must be positive"},
		{"timeouts", ":2: timeouts: a timeouts block with no timeouts"},
		{"loadbalance weighted /nonexistent/w {\n reload 0\n}", ":2: loadbalance: weight file open error"},
		{"loadbalance weighted", ":2: loadbalance: missing weight file argument"},
		{"loadbalance weighted /w {\n prefer 10.0.0.0/8\n}", ":3: loadbalance: unknown property 'prefer'"},
		{"loadbalance weighted /w {\n reload soon\n}", ":3: loadbalance: invalid reload duration 'soon'"},
		{"forward . tls://1.1.1.1%dns.example {\n tls_servername x.example\n}", ":2: forward: both forward (\"x.example\") and proxy level (\"dns.example\") TLS servernames"},
		{"forward . 1.1.1.1%eth0", "on a plain target"},
		{"forward . 1.1.1.1 {\n failover NOERROR\n}", ":3: forward: NoError cannot be used in failover"},
		{"forward . 1.1.1.1 {\n max_connect_attempts x\n}", ":3: forward: max_connect_attempts: \"x\" is not a count"},
		{"pprof {\n block often\n}", ":3: pprof: property 'block' invalid integer value 'often'"},
		{"pprof {\n mutex\n}", ":3: pprof: unknown property 'mutex'"},
		{"trace zipkin localhost:9411 {\n foo 1\n }", ":3: trace: option foo is not supported"},
		{"trace otlp localhost:4317", ":2: trace: tracing endpoint type 'otlp' is not supported"},
		{"trace datadog localhost:8126 {\n zipkin_max_batch_size 10\n }", ":3: trace: zipkin_max_batch_size applies to zipkin only"},
		{"trace {\n datadog_analytics_rate 0.5\n }", ":3: trace: datadog_analytics_rate applies to datadog only"},
		{"trace datadog localhost:8126 {\n datadog_analytics_rate 2\n }", ":3: trace: datadog analytics rate must be between 0 and 1"},
		{"trace {\n every x\n }", ":3: trace: every: \"x\" is not a count"},
		{"loadbalance random", ":2: loadbalance: unknown policy: random"},
		{"loadbalance {\n prefer 10.0.0.0/33\n}", ":3: loadbalance: invalid CIDR \"10.0.0.0/33\""},
		{"loadbalance {\n frob 10.0.0.0/8\n}", ":3: loadbalance: unknown property 'frob'"},
		{"timeouts {\n read 500ms\n}", ":3: timeouts: read: 500ms needs to be between 1 second and 24 hours"},
		{"timeouts {\n maxtcpqueries 0\n}", ":3: timeouts: maxtcpqueries provided '0' needs to be -1 (unlimited) or a positive integer"},
		{"timeouts {\n maxtcpqueries many\n}", ":3: timeouts: invalid value for maxtcpqueries 'many'"},
		{"timeouts {\n frob 5\n}", ":3: timeouts: option frob is not supported"},
		{"prometheus 9253", ":2: prometheus: \"9253\": not HOST:PORT"},
		{"dnstap", ":2: dnstap: takes a socket"},
		{"dnstap /s full 1 1 x", ":2: dnstap: takes a socket and at most three more arguments"},
		{"dnstap /s nofull", ":2: dnstap: the second argument is full or nothing, not \"nofull\""},
		{"dnstap /s full 0", ":2: dnstap: write buffer (MiB) \"0\": want 1 to 1024"},
		{"dnstap /s full 1 4097", ":2: dnstap: queue (x10000 messages) \"4097\": want 1 to 4096"},
		{"dnstap tcp://127.0.0.1", ":2: dnstap: tcp://127.0.0.1: want tcp://HOST:PORT"},
		{"dnstap /s {\n skipverify\n}", ":3: dnstap: skipverify is for a tls:// socket"},
		{"dnstap /s {\n identity\n}", ":3: dnstap: identity takes one argument"},
		{"dnstap /s {\n extra {type}\n}", ":3: dnstap: extra with {placeholders} is not supported"},
		{"dnstap /s {\n frob\n}", ":3: dnstap: option frob is not supported"},
	} {
		_, err := load(t, ".:53 {\n"+tc.body+"\n}\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "/Corefile:") {
			t.Errorf("%q: got %v, want one line containing %q", tc.body, err, tc.want)
		}
	}
}

// TestForwardTLS: tls:// upstreams (port 853 by default) with tls and
// tls_servername.
func TestForwardTLS(t *testing.T) {
	srv, err := load(t, ".:53 {\nforward . tls://1.1.1.1 tls://[2606:4700::1111]:8853 {\n tls /ca.pem\n tls_servername cloudflare-dns.com\n failfast_all_unhealthy_upstreams\n}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	f := srv[0].Forward
	if len(f.To) != 2 || f.To[0].String() != "tls://1.1.1.1:853" || f.To[1].String() != "tls://[2606:4700::1111]:8853" || !f.UsesTLS() ||
		*f.TLS != (ForwardTLS{CA: "/ca.pem", ServerName: "cloudflare-dns.com"}) || !f.FailFast {
		t.Fatalf("%+v %+v", f, f.TLS)
	}
}

func TestCacheForms(t *testing.T) {
	srv, err := load(t, ".:53 {\ncache 30 . {\n success 9984 30 5\n denial 100 5 1\n prefetch 10 1m 25%\n serve_stale 1h immediate\n servfail 2s\n keepttl\n}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	c := srv[0].Cache
	if c.SuccessCap != 9984 || c.SuccessTTL != 30*time.Second || c.SuccessMinTTL != 5*time.Second || c.DenialCap != 100 ||
		c.DenialTTL != 5*time.Second || c.DenialMinTTL != time.Second || c.Prefetch != 10 || c.PrefetchPercent != 25 ||
		c.ServeStale != time.Hour || c.ServFail != 2*time.Second || !c.KeepTTL {
		t.Fatalf("%+v", c)
	}
}

// TestServeStaleForms: CoreDNS 1.15's serve_stale and serve_stale_policy,
// what they set and what they refuse (as CoreDNS's setup refuses it).
func TestServeStaleForms(t *testing.T) {
	type want struct {
		window, verifyTimeout, ttl, recheck time.Duration
		verify, ttlSet, recheckSet, prefer  bool
	}
	for _, tc := range []struct {
		opts string
		want want
	}{
		{"serve_stale", want{window: time.Hour}},
		{"serve_stale 10m", want{window: 10 * time.Minute}},
		{"serve_stale 1h IMMEDIATE 30s", want{window: time.Hour, ttl: 30 * time.Second, ttlSet: true}},
		{"serve_stale 1h immediate 0s 45s", want{window: time.Hour, ttlSet: true, recheck: 45 * time.Second, recheckSet: true}},
		{"serve_stale 1h verify", want{window: time.Hour, verify: true}},
		{"serve_stale 1h verify 100ms", want{window: time.Hour, verify: true, verifyTimeout: 100 * time.Millisecond}},
		{"serve_stale 1h verify 0s 30s", want{window: time.Hour, verify: true, ttl: 30 * time.Second, ttlSet: true}},
		{"serve_stale 1h verify 100ms 30s 5m", want{window: time.Hour, verify: true, verifyTimeout: 100 * time.Millisecond, ttl: 30 * time.Second, ttlSet: true, recheck: 5 * time.Minute, recheckSet: true}},
		{"serve_stale 1h immediate 30s 30s\n serve_stale 2h", want{window: 2 * time.Hour}},
		{"serve_stale 1h\n serve_stale_policy prefer_positive", want{window: time.Hour, prefer: true}},
		{"serve_stale_policy PREFER_POSITIVE\n serve_stale", want{window: time.Hour, prefer: true}},
	} {
		srv, err := load(t, ".:53 {\ncache {\n "+tc.opts+"\n}\n}\n")
		if err != nil {
			t.Errorf("%q: %v", tc.opts, err)
			continue
		}
		c := srv[0].Cache
		got := want{c.ServeStale, c.ServeStaleVerifyTimeout, c.ServeStaleTTL, c.ServeStaleRecheck, c.ServeStaleVerify, c.ServeStaleTTLSet, c.ServeStaleRecheckSet, c.PreferPositive}
		if got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.opts, got, tc.want)
		}
	}
	for _, opts := range []string{
		"serve_stale -1s",
		"serve_stale 1h sometimes",
		"serve_stale 1h immediate 30s 30s 30s",
		"serve_stale 1h verify 1s 30s 30s 30s",
		"serve_stale 1h verify -1s",
		"serve_stale 1h immediate 1500ms",
		"serve_stale 1h immediate 30",
		"serve_stale 1h immediate -30s",
		"serve_stale 1h immediate 30s 6m",
		"serve_stale 1h immediate 30s -1s",
		"serve_stale 1h immediate 4294967296s",
		"serve_stale\n serve_stale_policy prefer_negative",
		"serve_stale\n serve_stale_policy",
		"serve_stale\n serve_stale_policy prefer_positive\n serve_stale_policy prefer_positive",
		"serve_stale_policy prefer_positive",
	} {
		if _, err := load(t, ".:53 {\ncache {\n "+opts+"\n}\n}\n"); err == nil {
			t.Errorf("%q: accepted", opts)
		}
	}
}

func TestDuplicateZoneRefused(t *testing.T) {
	_, err := load(t, "a.example {\n forward . 1.1.1.1\n}\na.example:53 {\n forward . 1.1.1.1\n}\n")
	if err == nil || !strings.Contains(err.Error(), "already served") {
		t.Fatal(err)
	}
	// Same zone on different binds is fine (CoreDNS allows it).
	if _, err := load(t, "a.example {\n bind 10.0.0.1\n}\na.example:53 {\n bind 10.0.0.2\n}\n"); err != nil {
		t.Fatal(err)
	}
}

func TestParseErrorsArePositioned(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{".:53 {\n forward . 1.1.1.1 {\n force_tcp\n", ":2: forward: missing '}'"},
		{".:53 {\n}\n}\n", ":3: unexpected '}'"},
		{".:53 {\nhealth fd00::a:8080\n}\n", ":2: health: \"fd00::a:8080\": an IPv6 address needs brackets"},
		{".:53 {\n \"unterminated\n", ":2: unterminated quoted string"},
		{"import\n", ":1: import: a file"},
		{"import nothere.conf\n", "nothere.conf not found"},
		{"import /dev/zero\n", ":1: import /dev/zero: /dev/zero is not a regular file"},
	} {
		_, err := load(t, tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v want %q", tc.text, err, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		".:53 {\n forward . 1.1.1.1\n cache 30\n}\n",
		"(s) {\n errors\n}\na b, c {\n import s\n cache {\n success 1 2 3\n }\n}\n",
		"\"quoted \\\" x\" {\n}\n# c\n",
	} {
		f.Add([]byte(s))
	}
	tmpl, _ := os.ReadFile("testdata/reference.Corefile.tmpl")
	f.Add(tmpl)
	f.Fuzz(func(t *testing.T, data []byte) {
		bs, err := Parse("fuzz/Corefile", data, nil)
		if err == nil {
			_, err = Build("fuzz/Corefile", bs, Options{})
		}
		// Every error says where: a positioned Error, or no blocks at all.
		var pe *Error
		if err != nil && !errors.As(err, &pe) && !errors.Is(err, ErrNoBlocks) {
			t.Fatalf("error without a position: %v", err)
		}
	})
}
