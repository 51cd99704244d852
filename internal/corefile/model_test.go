package corefile

import (
	"slices"
	"testing"
)

// The zones CoreDNS 1.15 prints at start for the same keys.
func TestCIDRKeyZones(t *testing.T) {
	for _, tc := range []struct {
		key   string
		zones []string
	}{
		{"10.0.0.0/15", []string{"0.10.in-addr.arpa.", "1.10.in-addr.arpa."}},
		{"10.0.0.0/8", []string{"10.in-addr.arpa."}},
		{"10.1.2.3/8", []string{"10.in-addr.arpa."}},
		{"192.168.0.0/23:1053", []string{"0.168.192.in-addr.arpa.", "1.168.192.in-addr.arpa."}},
		{"0.0.0.0/0", []string{"in-addr.arpa."}},
		{"fd00:1::/30", []string{"0.0.0.0.0.0.d.f.ip6.arpa.", "1.0.0.0.0.0.d.f.ip6.arpa.", "2.0.0.0.0.0.d.f.ip6.arpa.", "3.0.0.0.0.0.d.f.ip6.arpa."}},
		{"fd00::/8", []string{"d.f.ip6.arpa."}},
		{"255.255.255.254/31", []string{"254.255.255.255.in-addr.arpa.", "255.255.255.255.in-addr.arpa."}},
	} {
		zones, _, err := parseKey(tc.key, 53)
		if err != nil || !slices.Equal(zones, tc.zones) {
			t.Errorf("%s: %v, %v; want %v", tc.key, zones, err, tc.zones)
		}
	}
	if zones, _, _ := parseKey("172.16.5.0/26", 53); len(zones) != 64 || zones[0] != "0.5.16.172.in-addr.arpa." || zones[63] != "63.5.16.172.in-addr.arpa." {
		t.Errorf("172.16.5.0/26: %d zones %v", len(zones), zones)
	}
	if zones, _, _ := parseKey("0.0.0.0/1", 53); len(zones) != 128 {
		t.Errorf("0.0.0.0/1: %d zones, want 128", len(zones))
	}
	if zones, _, err := parseKey("10.0.0.0/33", 53); err != nil || !slices.Equal(zones, []string{"10.0.0.0/33."}) {
		t.Errorf("10.0.0.0/33 (not a network: a name, as CoreDNS takes it): %v, %v", zones, err)
	}
}
