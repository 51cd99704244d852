package config

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestLastKnownGoodFlag: -last-known-good turns prefer_positive on for the
// zones it lists, with the caps of the domain each is in; "." for every
// name; nothing by default.
func TestLastKnownGoodFlag(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	parse := func(args ...string) (*Config, error) {
		return Parse(append([]string{"-kube-dns", "10.96.0.10", "-resolv-conf", rc}, args...), envOf(nil), io.Discard)
	}
	c, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	def, zones := c.FlagPolicies()
	if def.PreferPositive || len(zones) != 1 || zones[0].Name != "cluster.local." || zones[0].TTL.PreferPositive {
		t.Fatalf("default: %+v %+v", def, zones)
	}
	c, err = parse("-last-known-good", "Example.COM, corp.internal.,example.com,svc.cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Cache.LastKnownGood; len(got) != 3 || got[0] != "corp.internal." || got[1] != "example.com." || got[2] != "svc.cluster.local." {
		t.Fatalf("zones %q", got)
	}
	def, zones = c.FlagPolicies()
	if def.PreferPositive || zones[0].TTL.PreferPositive {
		t.Fatalf("the default and the cluster domain are not listed: %+v %+v", def, zones[0])
	}
	byName := map[string]FlagZone{}
	for _, z := range zones {
		byName[z.Name] = z
	}
	if z := byName["example.com."]; !z.TTL.PreferPositive || z.TTL.SuccessMax != 30*time.Second || z.TTL.LastKnownGood == nil || z.TTL.LastKnownGood.Zone != "example.com." {
		t.Fatalf("example.com.: %+v", z)
	}
	if z := byName["svc.cluster.local."]; !z.TTL.PreferPositive || z.TTL.DenialMax != 5*time.Second {
		t.Fatalf("svc.cluster.local. gets the cluster caps: %+v", z)
	}
	// "." covers the cluster domain too; a parent of it as well.
	for _, list := range []string{".", "local"} {
		c, err = parse("-last-known-good", list)
		if err != nil {
			t.Fatal(err)
		}
		_, zones = c.FlagPolicies()
		if !zones[0].TTL.PreferPositive || zones[0].TTL.DenialMax != 5*time.Second {
			t.Fatalf("%s: cluster domain %+v", list, zones[0])
		}
	}
	for _, bad := range [][]string{{"-last-known-good", "a..b"}, {"-last-known-good", ".", "-serve-stale", "0"}} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestServeStaleCorefileMapping: serve_stale's arguments and
// serve_stale_policy become the zone's policy.
func TestServeStaleCorefileMapping(t *testing.T) {
	c, err := corefileConfig(t, `a.example:53 {
    cache {
        serve_stale 1h immediate 30s 0s
        serve_stale_policy prefer_positive
    }
    forward . 10.150.0.9
}
b.example:53 {
    cache {
        serve_stale 2h verify 250ms 10s 1m
    }
    forward . 10.150.0.9
}
c.example:53 {
    cache {
        serve_stale 1h verify
    }
    forward . 10.150.0.9
}
.:53 {
    cache 30
    forward . 10.150.0.9
}
`)
	if err != nil {
		t.Fatal(err)
	}
	a := zonePolicy(t, c, "a.example.")
	if !a.TTL.PreferPositive || a.TTL.LastKnownGood == nil || !a.TTL.StaleTTLSet || a.TTL.StaleTTL != 30 || a.StaleRecheck >= 0 || a.StaleClientTimeout != immediateStale {
		t.Fatalf("a: %+v", a)
	}
	b := zonePolicy(t, c, "b.example.")
	if b.TTL.PreferPositive || b.StaleWindow != 2*time.Hour || b.StaleClientTimeout != 250*time.Millisecond || b.TTL.StaleTTL != 10 || b.StaleRecheck != time.Minute {
		t.Fatalf("b: %+v", b)
	}
	cc := zonePolicy(t, c, "c.example.")
	if cc.StaleClientTimeout != c.ForwardTimeout || cc.TTL.StaleTTLSet || cc.StaleRecheck >= 0 {
		t.Fatalf("c: %+v", cc)
	}
	if root := zonePolicy(t, c, "."); root.StaleWindow != 0 || root.TTL.PreferPositive {
		t.Fatalf(".: %+v", root)
	}
	// An explicit -last-known-good decides for every block with serve_stale.
	c, err = corefileConfig(t, `a.example:53 {
    cache {
        serve_stale
        serve_stale_policy prefer_positive
    }
    forward . 10.150.0.9
}
b.example:53 {
    cache {
        serve_stale
    }
    forward . 10.150.0.9
}
`, "-last-known-good", "b.example")
	if err != nil {
		t.Fatal(err)
	}
	if zonePolicy(t, c, "a.example.").TTL.PreferPositive || !zonePolicy(t, c, "b.example.").TTL.PreferPositive {
		t.Fatal("-last-known-good does not win over the Corefile")
	}
	// A listed zone whose block has no serve_stale: a note, nothing kept.
	c, err = corefileConfig(t, `b.example:53 {
    cache
    forward . 10.150.0.9
}
`, "-last-known-good", "b.example")
	if err != nil {
		t.Fatal(err)
	}
	if zonePolicy(t, c, "b.example.").TTL.PreferPositive || !strings.Contains(strings.Join(c.DropIn.Notes, "\n"), "has no serve_stale") {
		t.Fatalf("no serve_stale: %+v, notes %q", zonePolicy(t, c, "b.example."), c.DropIn.Notes)
	}
}
