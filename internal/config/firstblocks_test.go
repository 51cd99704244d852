package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// The block a name's cache settings come from (mapCacheTTLs: the cluster
// domain's, the root's) is the longest zone's, of a zone in two blocks
// the first (it was corefile.Policies).
func TestFirstBlocksLongestZone(t *testing.T) {
	srv, err := loadBlocks(t, "cluster.local {\n cache {\n  success 9984 30\n  denial 9984 5\n }\n forward . 10.0.0.10\n}\n"+
		"svc.cluster.local {\n cache 10\n forward . 10.0.0.10\n}\n.:53 {\n cache 30\n forward . /etc/resolv.conf\n}\nnocache.example {\n forward . 1.1.1.1\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	first := firstBlocks(srv)
	for _, tc := range []struct {
		q, zone string
		succ    time.Duration
		cached  bool
	}{
		{"a.default.svc.cluster.local.", "svc.cluster.local.", 10 * time.Second, true},
		{"x.pod.cluster.local.", "cluster.local.", 30 * time.Second, true},
		{"cluster.local.", "cluster.local.", 30 * time.Second, true},
		{"xcluster.local.", ".", 30 * time.Second, true},
		{"www.example.org.", ".", 30 * time.Second, true},
		{"a.nocache.example.", "nocache.example.", 0, false},
	} {
		s, ok := first.LookupStringZone(tc.q)
		var succ time.Duration
		if s.Cache != nil {
			succ = s.Cache.SuccessTTL
		}
		if !ok || !slices.Contains(s.Zones, tc.zone) || succ != tc.succ || (s.Cache != nil) != tc.cached {
			t.Errorf("%s: got %+v", tc.q, s)
		}
	}
}

func loadBlocks(t *testing.T, text string) ([]*corefile.Server, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return corefile.Load(path, nil, corefile.Options{})
}
