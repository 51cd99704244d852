package daemon

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
)

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestCacheSnapshotWarmsAStartWithoutATwin: an instance writes its cache
// to the state directory while it serves; one that starts with no twin
// (here after a clean exit; test/deploy kills the binary with SIGKILL)
// loads it and answers the names from it, without asking upstream; one
// that finds the last loader died young does not load it; one whose
// configuration changed the names' policy drops them; with the interval 0
// the file is removed and nothing is loaded.
func TestCacheSnapshotWarmsAStartWithoutATwin(t *testing.T) {
	node := startUpstream(t, records)
	twin, ip, port, pidns := twins(t, node.addr)
	mk := func() *config.Config {
		c := twin()
		c.Cache.SuccessTTL = 5 * time.Minute
		c.Cache.SnapshotInterval = 100 * time.Millisecond
		c.Cache.SnapshotMaxBytes = 8 << 20
		return c
	}
	addr := netip.AddrPortFrom(ip, uint16(port)).String()
	names := make([]string, 2000)
	for i := range names {
		names[i] = fmt.Sprintf("snap%d.example.com.", i)
	}
	const pidA, pidB, pidC, pidD, pidY = 5000021, 5000022, 5000023, 5000024, 5000025
	a, logsA, stopA := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidA))
	askAll(t, addr, names)
	path := ""
	waitFor(t, "a snapshot of every name", func() bool {
		m, _ := filepath.Glob(filepath.Join(mk().StateDir, "*", snapshotFile))
		if len(m) == 1 {
			path = m[0]
		}
		return strings.Contains(scrape(t, a), "nodelocaldns_cache_snapshot_entries 2000")
	})
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot %s: %v %v", path, st, err)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logsA.String(), "no cache snapshot: the cache starts empty") {
		t.Errorf("A's start did not say it found no snapshot:\n%s", logsA)
	}

	before := node.count()
	b, logsB, stopB := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidB))
	if !strings.Contains(logsB.String(), "loaded the cache snapshot") || !strings.Contains(logsB.String(), "kept=2000 expired=0 policy_changed=0 not_kept=0 invalid=0") {
		t.Fatalf("B did not load A's snapshot:\n%s", logsB)
	}
	t.Log(grepLines(logsB.String(), "snapshot"))
	askAll(t, addr, names)
	if sent := node.count() - before; sent != 0 {
		t.Fatalf("%d of %d names went upstream after the snapshot was loaded", sent, len(names))
	}
	if m := scrape(t, b); !strings.Contains(m, `nodelocaldns_cache_snapshot_loaded_entries_total{result="kept"} 2000`) {
		t.Errorf("metrics:\n%s", grepLines(m, "snapshot"))
	}
	marker := filepath.Join(filepath.Dir(path), snapshotLoadedFile)
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("B loaded the snapshot and left no marker: %v", err)
	}
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("B exited cleanly and left the marker: %v", err)
	}

	// The marker of an instance that loaded the snapshot and died young
	// (SIGKILLed in test/deploy): the next start does not load it again.
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, logsY, stopY := startDaemon(t, mk(), fmt.Sprintf("%d-%d", pidns, pidY))
	if !strings.Contains(logsY.String(), "died within 1m0s of starting: not loaded again") || strings.Contains(logsY.String(), `msg="loaded the cache snapshot"`) {
		t.Fatalf("a start after a young death loaded the snapshot:\n%s", logsY)
	}
	_ = stopY()

	// Another TTL cap: every entry's policy changed.
	changed := mk()
	changed.Cache.SuccessTTL = 4 * time.Minute
	_, logsC, stopC := startDaemon(t, changed, fmt.Sprintf("%d-%d", pidns, pidC))
	if !strings.Contains(logsC.String(), "kept=0 expired=0 policy_changed=2000") {
		t.Fatalf("C kept entries whose policy changed:\n%s", logsC)
	}
	_ = stopC()

	off := mk()
	off.Cache.SnapshotInterval = 0
	_, logsD, _ := startDaemon(t, off, fmt.Sprintf("%d-%d", pidns, pidD))
	if _, err := os.Stat(path); !os.IsNotExist(err) || !strings.Contains(logsD.String(), "cache snapshot off: removed the one an earlier run left") {
		t.Fatalf("with the snapshot off the file is still there (%v):\n%s", err, logsD)
	}
	if strings.Contains(logsD.String(), `msg="loaded the cache snapshot"`) {
		t.Fatalf("D loaded a snapshot with the snapshot off:\n%s", logsD)
	}
}

// scrape is the daemon's /metrics.
func scrape(t *testing.T, d *Daemon) string {
	t.Helper()
	_, body := httpStatus(t, "http://"+d.MetricsAddr().String()+"/metrics")
	return body
}

// TestCacheSnapshotInItsOwnDirectory: with -cache-snapshot-dir the
// snapshot lives there (the manifest's pod-private emptyDir), with or
// without a state directory, and nothing of it in the state directory.
func TestCacheSnapshotInItsOwnDirectory(t *testing.T) {
	node := startUpstream(t, records)
	dir := filepath.Join(t.TempDir(), "cache")
	mk := func() *config.Config {
		c := testConfig(node.addr)
		c.LocalIPs = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
		c.Port = 0
		c.Cache.SuccessTTL = 5 * time.Minute
		c.Cache.SnapshotInterval = 100 * time.Millisecond
		c.Cache.SnapshotMaxBytes = 1 << 20
		c.Cache.SnapshotDir = dir
		return c
	}
	a, _, stopA := startDaemon(t, mk(), "")
	names := []string{"own1.example.com.", "own2.example.com."}
	askAll(t, a.Server.Addr().String(), names)
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshotFile)); err != nil {
		t.Fatalf("no snapshot in %s: %v", dir, err)
	}
	before := node.count()
	b, logsB, _ := startDaemon(t, mk(), "")
	if !strings.Contains(logsB.String(), `msg="loaded the cache snapshot"`) || !strings.Contains(logsB.String(), " kept=2 ") {
		t.Fatalf("B did not load the snapshot in %s:\n%s", dir, logsB)
	}
	askAll(t, b.Server.Addr().String(), names)
	if sent := node.count() - before; sent != 0 {
		t.Fatalf("%d names went upstream after the snapshot was loaded", sent)
	}
}
