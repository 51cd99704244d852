package config

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

func corefileConfig(t *testing.T, text string, more ...string) (*Config, error) {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	text = strings.ReplaceAll(text, "DIR/", dir+"/")
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return Parse(base(t, dir, append([]string{"-localip", "169.254.20.10", "-conf", conf}, more...)...), stockEnv(), io.Discard)
}

func zonePolicy(t *testing.T, c *Config, zone string) ZonePolicy {
	t.Helper()
	for _, zp := range c.DropIn.Corefile.ZonePolicies {
		if zp.Zone == zone {
			return zp
		}
	}
	t.Fatalf("no policy for %s in %+v", zone, c.DropIn.Corefile.ZonePolicies)
	return ZonePolicy{}
}

// Each block's cache directive becomes the policy of its zones, with
// CoreDNS's semantics; a block without cache caches nothing.
func TestZonePoliciesFromBlocks(t *testing.T) {
	c, err := corefileConfig(t, `cluster.local:53 {
    cache {
        success 9984 30
        denial 9984 5
    }
    forward . 10.96.0.11
}
corp.example:53 {
    cache 10 {
        success 100 60 2
        denial 50 20 30
        prefetch 3 1m 20%
        serve_stale 10m verify
        servfail 1m
        disable denial
        keepttl
    }
    forward . 10.150.0.9
}
nocache.example:53 {
    forward . 10.150.0.9
}
.:53 {
    cache 30
    forward . 10.0.0.2
}
`)
	if err != nil {
		t.Fatal(err)
	}
	cl := zonePolicy(t, c, "cluster.local.")
	if cl.TTL.SuccessMax != 30*time.Second || cl.TTL.DenialMax != 5*time.Second || cl.TTL.MinTTL != 5*time.Second || cl.TTL.DenialMinTTL != 5*time.Second ||
		!cl.TTL.Uniform || !cl.TTL.PrefetchSet || cl.TTL.PrefetchHits != 0 || cl.StaleWindow != 0 || cl.ServFailTTL != 5*time.Second {
		t.Errorf("cluster.local: %+v", cl)
	}
	corp := zonePolicy(t, c, "corp.example.")
	if corp.TTL.SuccessMax != 60*time.Second || corp.TTL.MinTTL != 2*time.Second ||
		corp.TTL.DenialMax != 20*time.Second || corp.TTL.DenialMinTTL != 20*time.Second || // floor under the cap, as CoreDNS's min(max(ttl, MINTTL), TTL)
		corp.TTL.PrefetchHits != 3 || corp.TTL.PrefetchPercent != 20 ||
		corp.StaleWindow != 10*time.Minute || corp.StaleClientTimeout != c.ForwardTimeout ||
		corp.ServFailTTL != 0 || !corp.TTL.NoDenial || corp.TTL.NoSuccess || !corp.TTL.KeepTTL { // disable denial: SERVFAIL not cached either, as CoreDNS

		t.Errorf("corp.example: %+v", corp)
	}
	if !strings.Contains(strings.Join(c.DropIn.Notes, "\n"), "cache servfail 1m0s: SERVFAIL is cached 5s at most") {
		t.Errorf("servfail note missing: %v", c.DropIn.Notes)
	}
	if nc := zonePolicy(t, c, "nocache.example."); !nc.TTL.NoSuccess || !nc.TTL.NoDenial || nc.ServFailTTL != 0 || nc.StaleWindow != 0 {
		t.Errorf("nocache.example: %+v", nc)
	}
	if root := zonePolicy(t, c, "."); root.TTL.SuccessMax != 30*time.Second || root.TTL.DenialMax != 30*time.Second {
		t.Errorf(".: %+v", root)
	}
	if c.Cache.SuccessCapacity != 9984+100+10000 || c.Cache.DenialCapacity != 9984+50+10000 {
		t.Errorf("capacities do not add up: %d %d", c.Cache.SuccessCapacity, c.Cache.DenialCapacity)
	}
}

// `disable success|denial ZONE...`: the names under those zones are not
// cached (success) or their denials and SERVFAILs are not (denial); a zone
// strictly inside the block's gets a policy of its own, one that another
// block serves stays that block's; the last line of a kind wins, as
// CoreDNS's; a zone holding the block's disables the whole block.
func TestCacheDisableZones(t *testing.T) {
	c, err := corefileConfig(t, `other.example:53 {
    cache 30
    forward . 10.0.0.3
}
.:53 {
    cache 30 {
        disable success nocache.example other.example
        disable denial skip.example
        disable denial Nodenial.example. x.nodenial.example
    }
    forward . 10.0.0.2
}
whole.example:53 {
    cache 30 {
        disable success example
    }
    forward . 10.0.0.2
}
`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, zp := range c.DropIn.Corefile.ZonePolicies {
		got[zp.Zone] = fmt.Sprintf("success=%v denial=%v servfail=%v", !zp.TTL.NoSuccess, !zp.TTL.NoDenial, zp.ServFailTTL)
	}
	want := map[string]string{
		"other.example.":      "success=true denial=true servfail=5s",
		".":                   "success=true denial=true servfail=5s",
		"nocache.example.":    "success=false denial=true servfail=5s",
		"nodenial.example.":   "success=true denial=false servfail=0s",
		"x.nodenial.example.": "success=true denial=false servfail=0s",
		"whole.example.":      "success=false denial=true servfail=5s",
	}
	if !maps.Equal(got, want) {
		t.Errorf("zone policies\n got %v\nwant %v", got, want)
	}
}

// A flag given explicitly wins over every block.
func TestZonePoliciesFlagsWin(t *testing.T) {
	c, err := corefileConfig(t, ".:53 {\n cache 300 {\n  prefetch 5\n  serve_stale 1h immediate\n }\n forward . 10.0.0.2\n}\n",
		"-success-ttl", "20s", "-min-ttl", "1s", "-prefetch", "2")
	if err != nil {
		t.Fatal(err)
	}
	root := zonePolicy(t, c, ".")
	if root.TTL.SuccessMax != 20*time.Second || root.TTL.DenialMax != 300*time.Second || root.TTL.MinTTL != time.Second || root.TTL.PrefetchSet ||
		root.StaleWindow != time.Hour || root.StaleClientTimeout != immediateStale {
		t.Errorf(".: %+v", root)
	}
}

// The "." block's literal targets are not replaced by upstreamNameservers.
func TestRootLiteral(t *testing.T) {
	for text, want := range map[string]bool{
		".:53 {\n forward . 10.0.0.2 10.0.0.3\n}\n": true,
		".:53 {\n forward . DIR/resolv.conf\n}\n":   false,
	} {
		c, err := corefileConfig(t, text)
		if err != nil {
			t.Fatal(err)
		}
		if c.DropIn.Corefile.RootLiteral != want {
			t.Errorf("%q: RootLiteral %v", text, !want)
		}
	}
}

// After a ConfigMap change -conf is written again with the new stub
// domains (as node-cache does); a stub that duplicates a block is named.
func TestRewriteAndStubConflict(t *testing.T) {
	dir := t.TempDir()
	baseFile, conf, cm := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile"), filepath.Join(dir, "kube-dns")
	if err := os.WriteFile(baseFile, []byte("corp.example:53 {\n    forward . 10.150.0.9\n}\n.:53 {\n    bind 169.254.20.10\n    forward . __PILLAR__UPSTREAM__SERVERS__\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	args := base(t, dir, "-localip", "169.254.20.10", "-conf", conf)
	args = append(args, "-basecorefile", baseFile, "-kubednscm", cm)
	c, err := Parse(args, stockEnv(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.DropIn.Corefile
	if cc.RootLiteral {
		t.Error("the . block's placeholder is not a literal target")
	}
	if changed, err := cc.Rewrite(c); changed || err != nil {
		t.Fatalf("unchanged ConfigMap rewrote: %v %v", changed, err)
	}
	if err := os.WriteFile(filepath.Join(cm, "stubDomains"), []byte(`{"acme.local": ["1.2.3.4"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := cc.Rewrite(c); !changed || err != nil {
		t.Fatalf("rewrite: %v %v", changed, err)
	}
	if written, _ := os.ReadFile(conf); !strings.Contains(string(written), "acme.local:53 {") {
		t.Fatalf("written:\n%s", written)
	}
	if at := cc.StubConflict("corp.example."); !strings.HasSuffix(at, "Corefile:1") {
		t.Errorf("StubConflict(corp.example.) = %q", at)
	}
	if at := cc.StubConflict("acme.local."); at != "" {
		t.Errorf("StubConflict(acme.local.) = %q", at)
	}
}

// A block's forward options become its group's; max_fails 0 means never
// down; except is accepted only where another block takes the names.
func TestForwardOptionsMapped(t *testing.T) {
	c, err := corefileConfig(t, `cluster.local:53 {
    forward . 10.96.0.11 {
        force_tcp
        max_fails 0
        expire 30s
    }
}
corp.example:53 {
    forward . 10.150.0.9 10.150.0.10 {
        policy sequential
        max_fails 4
        health_check 2s no_rec
        max_concurrent 100
    }
}
.:53 {
    forward . 10.0.0.2 10.0.0.3 {
        except cluster.local
    }
}
`)
	if err != nil {
		t.Fatal(err)
	}
	if k := c.DropIn.KubeForward; k == nil || k.MaxFails != -1 || k.IdleTimeout != 30*time.Second || !k.Spread {
		t.Errorf("kube-dns options %+v", k)
	}
	if len(c.DropIn.Routes) != 1 {
		t.Fatalf("routes %+v", c.DropIn.Routes)
	}
	if o := c.DropIn.Routes[0].Opts; o.Spread || o.MaxFails != 4 || o.ProbeInterval != 2*time.Second || o.MaxInflight != 100 || o.IdleTimeout != 10*time.Second {
		t.Errorf("corp.example options %+v", o)
	}
	if n := c.DropIn.NodeForward; n == nil || !n.Spread || n.MaxFails != 2 || n.ProbeInterval != 500*time.Millisecond || n.MaxInflight != c.MaxInflight {
		t.Errorf(". options %+v", n)
	}
	// except without a block of its own: accepted, its names SERVFAIL
	// (internal/blocks, TestForwardExceptAndNext in test/dropin).
	c, err = corefileConfig(t, ".:53 {\n forward . 10.0.0.2 {\n  except corp.example\n  next NXDOMAIN\n }\n}\n")
	if err != nil || !strings.Contains(strings.Join(c.DropIn.Corefile.Mapping, "\n"), "forward except [corp.example.]: names there") {
		t.Errorf("except without a block: %v", err)
	}
	c, err = corefileConfig(t, ".:53 {\n forward . 10.0.0.2 {\n  health_check 1s no_rec domain Example.ORG\n }\n}\n")
	if err != nil || c.DropIn.NodeForward == nil || c.DropIn.NodeForward.ProbeName != "example.org." || c.DropIn.NodeForward.ProbeInterval != time.Second {
		t.Errorf("health_check domain: %v %+v", err, c.DropIn.NodeForward)
	}
	for _, bad := range []string{"health_check 1s domain", "health_check 1s domain a..b", "health_check 1s frob", "health_check"} {
		if _, err := corefileConfig(t, ".:53 {\n forward . 10.0.0.2 {\n  "+bad+"\n }\n}\n"); err == nil || !strings.Contains(err.Error(), "health_check") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// `cache 30 ZONE...`: the zones inside the block get its policy, its own
// zone passes uncached; a zone another block serves stays that block's.
func TestCacheZonesPolicies(t *testing.T) {
	c, err := corefileConfig(t, "other.example:53 {\n forward . 10.0.0.3\n}\n.:53 {\n cache 30 cached.example other.example x.other.example\n forward . 10.0.0.2\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, zp := range c.DropIn.Corefile.ZonePolicies {
		got[zp.Zone] = !zp.TTL.Pass
	}
	if len(got) != 3 || !got["cached.example."] || got["."] || got["other.example."] {
		t.Fatalf("zones cached: %v", got)
	}
}

// dns64 without allow_ipv4: dropped on IPv4 listen addresses (no client is
// translated), kept on IPv6 ones, refused on both.
func TestDNS64WithoutAllowIPv4ByFamily(t *testing.T) {
	c, err := corefileConfig(t, ".:53 {\n dns64\n forward . 10.0.0.2\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if s := c.DropIn.Corefile.Servers[0]; s.Config("dns64") != nil || slices.ContainsFunc(s.Plugins, func(p corefile.Plugin) bool { return p.Name == "dns64" }) ||
		!strings.Contains(strings.Join(c.DropIn.Corefile.Mapping, "\n"), "dns64 without allow_ipv4: every listen address") {
		t.Errorf("IPv4: dns64 kept: %+v", s)
	}
	c, err = corefileConfig(t, ".:53 {\n dns64\n forward . 10.0.0.2\n}\n", "-localip", "fd00::10")
	if err != nil || c.DropIn.Corefile.Servers[0].Config("dns64") == nil {
		t.Errorf("IPv6: %v", err)
	}
	_, err = corefileConfig(t, ".:53 {\n dns64\n forward . 10.0.0.2\n}\n", "-localip", "169.254.20.10,fd00::10")
	if err == nil || !strings.Contains(err.Error(), "IPv4 and IPv6") {
		t.Errorf("both families: %v", err)
	}
}
