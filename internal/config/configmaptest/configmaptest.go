// Package configmaptest updates a ConfigMap volume directory the way the
// kubelet does, for tests of code that watches one (see
// config.ReadConfigMapDir and config.Watcher).
package configmaptest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Write updates dir as the kubelet's AtomicWriter does: the new content
// goes into a fresh "..<timestamp>" directory, a "..data_tmp" symlink to it
// is renamed over "..data", then top-level "key -> ..data/key" symlinks are
// added for new keys, the old timestamped directory is removed, and
// symlinks of removed keys go last.
func Write(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(ts, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, tmp := filepath.Join(dir, "..data"), filepath.Join(dir, "..data_tmp")
	old, _ := os.Readlink(data)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		t.Fatal(err)
	}
	for k := range files {
		if _, err := os.Lstat(filepath.Join(dir, k)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if n := e.Name(); n[0] != '.' {
			if _, ok := files[n]; !ok {
				_ = os.Remove(filepath.Join(dir, n))
			}
		}
	}
}
