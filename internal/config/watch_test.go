package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// drain empties the watcher's channel (the wake-up sent at start, and any
// for earlier steps).
func drain(w *Watcher) {
	for {
		select {
		case <-w.C:
		case <-time.After(200 * time.Millisecond): // longer than DefaultWatchSettle
			return
		}
	}
}

// waitChange waits for wake-ups until read returns want, for at most 2 s
// (the promise), and fails otherwise.
func waitChange(t *testing.T, w *Watcher, read func() string, want string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(2 * time.Second)
	for {
		select {
		case <-w.C:
			if got := read(); got == want {
				return time.Since(start)
			}
		case <-deadline:
			t.Fatalf("no wake-up showing %q within 2s (now %q)", want, read())
		}
	}
}

func TestWatcherSeesKubeletUpdate(t *testing.T) {
	dir := t.TempDir()
	kubeletWrite(t, dir, map[string]string{KeyStubDomains: `{"a.example": ["10.0.0.1"]}`})
	// Interval far beyond the test: only inotify can deliver in time.
	w := NewWatcher(WatchConfig{Paths: []string{dir}, Interval: time.Hour})
	defer w.Close()
	read := func() string {
		d, err := ReadConfigMapDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		return string(d.StubDomains) + "|" + string(d.UpstreamNameservers)
	}
	select {
	case <-w.C: // the initial wake-up
	case <-time.After(time.Second):
		t.Fatal("no initial wake-up")
	}
	for i, files := range []map[string]string{
		{KeyStubDomains: `{"a.example": ["10.0.0.2"]}`},
		{KeyStubDomains: `{"a.example": ["10.0.0.2"]}`, KeyUpstreamNameservers: `["1.1.1.1"]`},
		{KeyUpstreamNameservers: `["1.1.1.2"]`},
	} {
		drain(w)
		kubeletWrite(t, dir, files)
		took := waitChange(t, w, read, files[KeyStubDomains]+"|"+files[KeyUpstreamNameservers])
		t.Logf("update %d seen after %v", i, took)
	}
}

func TestWatcherSeesFileEditsAndLateDirectory(t *testing.T) {
	base := t.TempDir()
	rc := filepath.Join(base, "resolv.conf")
	cm := filepath.Join(base, "kube-dns") // does not exist yet
	if err := os.WriteFile(rc, []byte("nameserver 10.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(WatchConfig{Paths: []string{rc, cm}, Interval: time.Hour})
	defer w.Close()
	readRC := func() string { b, _ := os.ReadFile(rc); return string(b) }

	// Edited in place.
	drain(w)
	if err := os.WriteFile(rc, []byte("nameserver 10.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(t, w, readRC, "nameserver 10.0.0.2\n")

	// Replaced by rename, as editors and resolvconf do.
	drain(w)
	tmp := filepath.Join(base, ".resolv.conf.tmp")
	if err := os.WriteFile(tmp, []byte("nameserver 10.0.0.3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, rc); err != nil {
		t.Fatal(err)
	}
	waitChange(t, w, readRC, "nameserver 10.0.0.3\n")

	// A symlink retargeted (systemd-resolved's /etc/resolv.conf), then its
	// target edited.
	drain(w)
	target := filepath.Join(t.TempDir(), "stub-resolv.conf")
	if err := os.WriteFile(target, []byte("nameserver 10.0.0.4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, rc); err != nil {
		t.Fatal(err)
	}
	waitChange(t, w, readRC, "nameserver 10.0.0.4\n")
	drain(w)
	if err := os.WriteFile(target, []byte("nameserver 10.0.0.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(t, w, readRC, "nameserver 10.0.0.5\n")

	// The ConfigMap directory appears, then the kubelet updates it.
	readCM := func() string { d, _ := ReadConfigMapDir(cm); return string(d.UpstreamNameservers) }
	drain(w)
	if err := os.Mkdir(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeletWrite(t, cm, map[string]string{KeyUpstreamNameservers: `["1.1.1.1"]`})
	waitChange(t, w, readCM, `["1.1.1.1"]`)
	drain(w)
	kubeletWrite(t, cm, map[string]string{KeyUpstreamNameservers: `["1.1.1.2"]`})
	waitChange(t, w, readCM, `["1.1.1.2"]`)
}

func TestWatcherPeriodicFallbackAndClose(t *testing.T) {
	w := NewWatcher(WatchConfig{Paths: []string{filepath.Join(t.TempDir(), "x")}, Interval: 50 * time.Millisecond})
	for range 3 {
		select {
		case <-w.C:
		case <-time.After(2 * time.Second):
			t.Fatal("no periodic wake-up")
		}
	}
	done := make(chan struct{})
	go func() { w.Close(); w.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close hangs")
	}
}
