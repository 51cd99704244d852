package netsetup

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestNew(t *testing.T) {
	v4 := []netip.Addr{testV4}
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"defaults", Config{Addrs: v4, SetupInterface: true, SetupIPTables: true}, false},
		{"no address, nothing to set up", Config{}, false},
		{"no address", Config{SetupIPTables: true}, true},
		{"invalid address", Config{Addrs: []netip.Addr{{}}}, true},
		{"zoned address", Config{Addrs: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}}, true},
		{"long name", Config{Addrs: v4, InterfaceName: "sixteen-bytes-xx"}, true},
		{"port", Config{Addrs: v4, Port: 65536}, true},
		{"health port", Config{Addrs: v4, HealthPort: -1}, true},
		{"backend", Config{Addrs: v4, Backend: "iptables"}, true},
		{"legacy", Config{Addrs: v4, Backend: BackendLegacy}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if (err != nil) != tt.wantErr {
				t.Errorf("New = %v, want error %v", err, tt.wantErr)
			}
		})
	}

	s, err := New(Config{Addrs: []netip.Addr{testV4, netip.MustParseAddr("::ffff:169.254.20.10"), testV6}})
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.InterfaceName != defaultInterfaceName || c.Port != defaultPort || c.Backend != BackendAuto ||
		c.SyncInterval != defaultSyncInterval || c.LockWait != defaultLockWait || c.Logger == nil || c.Observer == nil {
		t.Errorf("defaults not applied: %+v", c)
	}
	if want := []netip.Addr{testV4, testV6}; !slices.Equal(c.Addrs, want) {
		t.Errorf("addresses = %v, want %v (unmapped, deduplicated)", c.Addrs, want)
	}
}

// TestRulesFor compares the rule set with the stock node-cache set written
// out in stockRules.
func TestRulesFor(t *testing.T) {
	for _, fam := range testFamilies {
		for _, healthPort := range []int{0, 8080} {
			got := map[tableLine]int{}
			for _, r := range rulesFor(&Config{Addrs: fam.addrs, Port: 53, HealthPort: healthPort}) {
				got[tableLine{r.Table, r.saveLine()}]++
			}
			var want []tableLine
			for _, f := range []family{ipv4, ipv6} {
				want = append(want, expectedRules(fam.addrs, f, 53, healthPort)...)
			}
			for _, w := range want {
				if got[w] != 1 {
					t.Errorf("%s health %d: %s -t %s listed %d times", fam.name, healthPort, w.line, w.table, got[w])
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s health %d: %d rules, want %d", fam.name, healthPort, len(got), len(want))
			}
		}
	}
	// A health port equal to the DNS port repeats no rule.
	if n, m := len(rulesFor(&Config{Addrs: []netip.Addr{testV4}, Port: 53, HealthPort: 53})), len(rulesFor(&Config{Addrs: []netip.Addr{testV4}, Port: 53})); n != m {
		t.Errorf("health port = DNS port: %d rules, want %d", n, m)
	}
	// An extra DNS port gets the stock DNS rules of its own (not the health
	// ones), after the address's stock set.
	for _, fam := range testFamilies {
		got := map[tableLine]int{}
		for _, r := range rulesFor(&Config{Addrs: fam.addrs, Port: 53, ExtraPorts: []int{1053, 53}, HealthPort: 8080}) {
			got[tableLine{r.Table, r.saveLine()}]++
		}
		var want []tableLine
		for _, f := range []family{ipv4, ipv6} {
			want = append(want, expectedRules(fam.addrs, f, 53, 8080)...)
			want = append(want, expectedRules(fam.addrs, f, 1053, 0)...)
		}
		for _, w := range want {
			if got[w] != 1 {
				t.Errorf("%s extra port: %s -t %s listed %d times", fam.name, w.line, w.table, got[w])
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s extra port: %d rules, want %d", fam.name, len(got), len(want))
		}
	}
}

func TestLockWaitSeconds(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int
	}{{0, 1}, {-time.Second, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {5 * time.Second, 5}} {
		if got := lockWaitSeconds(tt.d); got != tt.want {
			t.Errorf("lockWaitSeconds(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestIsLockErr(t *testing.T) {
	lock := errors.New("running [/usr/sbin/iptables-legacy -t raw -S OUTPUT --wait 1]: exit status 4: Another app is currently holding the xtables lock. Stopped waiting after 1s.")
	if !isLockErr(lock) {
		t.Error("lock timeout not recognised")
	}
	if isLockErr(errors.New("exit status 1: iptables: Bad rule")) || isLockErr(nil) {
		t.Error("other error taken for a lock timeout")
	}
}

func TestSetupErrorKinds(t *testing.T) {
	want := []string{"iptables", "iptables_lock", "interface_add", "interface_check", "configmap"}
	if !slices.Equal(SetupErrorKinds, want) {
		t.Errorf("SetupErrorKinds = %v, want %v", SetupErrorKinds, want)
	}
}
