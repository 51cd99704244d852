package config

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCacheSnapshotFlags: the snapshot is on by default (every 5 s, 8 MiB)
// where there is a state directory, off with -cache-snapshot-interval=0 or
// without one, and -check-config says where it is kept or why not.
func TestCacheSnapshotFlags(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	base := []string{"-kube-dns", "10.96.0.10", "-resolv-conf", rc}
	for _, tc := range []struct {
		args     []string
		interval time.Duration
		max      int64
		says     string
	}{
		{nil, 5 * time.Second, 8 << 20, "/run/nodelocaldns/<group>/cache.snapshot (the group: a hash of the network namespace, addresses and port; the start logs the path; every process that mounts /run/nodelocaldns can read the cached names: -cache-snapshot-dir keeps it private), written every 5s when the cache changed and at exit, at most 8388608 bytes"},
		{[]string{"-cache-snapshot-dir=/var/cache/nld"}, 5 * time.Second, 8 << 20, "cache snapshot:   /var/cache/nld/cache.snapshot, written every 5s"},
		{[]string{"-cache-snapshot-dir=/var/cache/nld", "-state-dir="}, 5 * time.Second, 8 << 20, "cache snapshot:   /var/cache/nld/cache.snapshot, written every 5s"},
		{[]string{"-cache-snapshot-interval=30s", "-cache-snapshot-max-bytes=2Mi"}, 30 * time.Second, 2 << 20, "written every 30s when the cache changed and at exit, at most 2097152 bytes"},
		{[]string{"-cache-snapshot-interval=0"}, 0, 8 << 20, "cache snapshot:   off (-cache-snapshot-interval=0"},
		{[]string{"-state-dir="}, 5 * time.Second, 8 << 20, "cache snapshot:   off: no -state-dir nor -cache-snapshot-dir"},
	} {
		c, err := Parse(append(append([]string{}, base...), tc.args...), envOf(nil), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.Cache.SnapshotInterval != tc.interval || c.Cache.SnapshotMaxBytes != tc.max {
			t.Errorf("%v: every %v, at most %d", tc.args, c.Cache.SnapshotInterval, c.Cache.SnapshotMaxBytes)
		}
		var out strings.Builder
		Describe(&out, c)
		if !strings.Contains(out.String(), tc.says) {
			t.Errorf("%v: -check-config does not say %q:\n%s", tc.args, tc.says, out.String())
		}
	}
	for _, bad := range []string{"-cache-snapshot-interval=500ms", "-cache-snapshot-interval=2h", "-cache-snapshot-interval=-1s",
		"-cache-snapshot-max-bytes=0", "-cache-snapshot-max-bytes=64Ki", "-cache-snapshot-max-bytes=8MB", "-cache-snapshot-dir=cache"} {
		_, err := Parse(append(append([]string{}, base...), bad), envOf(nil), io.Discard)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), strings.Split(bad, "=")[0]) {
			t.Errorf("%s: %v; want a usage error naming the flag", bad, err)
		}
	}
}
