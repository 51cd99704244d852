package corefile

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Nesting is bounded at maxDepth '{' with an error naming the line of the
// first one past it, whether the lexer sees it in one file or the parser
// across an import; a Corefile at the limit parses.
func TestNestingDepthLimit(t *testing.T) {
	nested := func(depth int) string {
		var b strings.Builder
		b.WriteString(".:53 {\n")
		for range depth - 1 {
			b.WriteString("x {\n")
		}
		for range depth {
			b.WriteString("}\n")
		}
		return b.String()
	}
	if _, err := Parse("Corefile", []byte(nested(maxDepth)), nil); err != nil {
		t.Fatalf("depth %d: %v", maxDepth, err)
	}
	_, err := Parse("Corefile", []byte(nested(maxDepth+1)), nil)
	if want := "Corefile:17: blocks nested more than 16 deep"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("depth %d: %v, want %q", maxDepth+1, err, want)
	}
	// Across an import: each file nests 10, together 19.
	dir := t.TempDir()
	inner := strings.Repeat("y {\n", 9) + strings.Repeat("}\n", 9)
	if err := os.WriteFile(filepath.Join(dir, "inner"), []byte(inner), 0o644); err != nil {
		t.Fatal(err)
	}
	outer := ".:53 {\n" + strings.Repeat("x {\n", 9) + "import inner\n" + strings.Repeat("}\n", 10)
	_, err = Parse(filepath.Join(dir, "Corefile"), []byte(outer), nil)
	if want := filepath.Join(dir, "inner") + ":7: y: blocks nested more than 16 deep"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("across an import: %v, want %q", err, want)
	}
}

// A 1 MiB Corefile of nested blocks (a ConfigMap's most) is refused at
// its 17th '{' having allocated next to nothing: before the limit it took
// the daemon from 22 to 325 MiB resident on reload.
func TestNestedCorefileCostsLittle(t *testing.T) {
	var b strings.Builder
	b.WriteString(".:53 {\n")
	for b.Len() < 1<<20 {
		b.WriteString("x {\n")
	}
	data := []byte(b.String())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Parse("Corefile", data, nil)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "Corefile:17: blocks nested more than 16 deep") {
		t.Fatalf("%v", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("parsing allocated %d bytes, want under 64 KiB", got)
	}
}

// The text read in one parse is bounded: a Corefile over maxFileSize, and
// imports that together pass maxTotalSize, are refused at the line that
// names them, before they are read whole.
func TestTotalSizeLimit(t *testing.T) {
	big := make([]byte, maxFileSize+1)
	if _, err := Parse("Corefile", big, nil); err == nil || !strings.Contains(err.Error(), "Corefile:1: the Corefile is larger than") {
		t.Fatalf("%d bytes: %v", len(big), err)
	}
	dir := t.TempDir()
	part := []byte(strings.Repeat("# padding\n", (3<<20)/10)) // 3 MiB of comments each
	for _, n := range []string{"a.conf", "b.conf", "c.conf"} {
		if err := os.WriteFile(filepath.Join(dir, n), part, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	text := ".:53 {\n  forward . 10.0.0.1\n}\nimport *.conf\n"
	_, err := Parse(filepath.Join(dir, "Corefile"), []byte(text), nil)
	if want := "Corefile:4: import " + filepath.Join(dir, "c.conf") + ": the Corefile and its imports are larger than 8388608 bytes"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%v, want %q", err, want)
	}
	// Two of them are within the bound.
	if err := os.Remove(filepath.Join(dir, "c.conf")); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(filepath.Join(dir, "Corefile"), []byte(text), nil); err != nil {
		t.Fatalf("6 MiB: %v", err)
	}
}
