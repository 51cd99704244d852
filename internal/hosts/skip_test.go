package hosts

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
)

// A line CoreDNS skips (no address, an address without a name) is skipped,
// never silently: logged once per content of the file with its line
// number, counted, and listed by CheckFile; the other lines answer. A
// garbage file logs a bounded number of lines.
func TestSkippedLinesLoggedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hosts")
	write := func(s string, mtime time.Time) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	write("# comment\n10.0.0.1 a.example\nnot-an-ip b.example\n10.0.0.3\n\n10.0.0.4 d.example # x\n", time.Unix(1e9, 0))
	var logs bytes.Buffer
	clk := clock.NewFake(time.Unix(1e9, 0))
	h := New(Config{Path: path, Zones: []string{"."}, Reload: time.Second}, clk, slog.New(slog.NewTextHandler(&logs, nil)))
	for _, want := range []string{"line=3 text=\"not-an-ip b.example\"", "line=4 text=10.0.0.3", "file=" + path} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if h.Stats.Skipped.Load() != 2 || h.lookup("d.example.", true) == nil || h.lookup("a.example.", true) == nil {
		t.Fatalf("skipped %d, d.example %v", h.Stats.Skipped.Load(), h.lookup("d.example.", true))
	}
	first, n, err := CheckFile(path)
	if err != nil || n != 2 || len(first) != 2 || first[0].Line != 3 || first[1].Line != 4 {
		t.Fatalf("CheckFile: %v %d %v", first, n, err)
	}
	logged := strings.Count(logs.String(), "skipped")
	clk.Advance(2 * time.Second)
	h.maybeReload() // unchanged: not logged again
	if c := strings.Count(logs.String(), "skipped"); c != logged {
		t.Errorf("unchanged file logged again:\n%s", logs.String())
	}
	var garbage strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&garbage, "garbage line %d\n", i)
	}
	write(garbage.String(), time.Unix(1e9+10, 0))
	clk.Advance(2 * time.Second)
	h.maybeReload()
	if h.Stats.Skipped.Load() != 1000 || strings.Count(logs.String(), "\n") > 2+maxSkippedKept+1+2 || !strings.Contains(logs.String(), "more=990") {
		t.Errorf("skipped %d; log:\n%s", h.Stats.Skipped.Load(), logs.String())
	}
	if _, n, err := CheckFile(filepath.Join(dir, "absent")); err != nil || n != 0 {
		t.Errorf("absent file: %d %v", n, err)
	}
}
