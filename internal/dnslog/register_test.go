package dnslog

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// Moved from internal/corefile with the directive's reading.
// TestLogForms: the log lines CoreDNS's log setup reads, into rules.
func TestLogForms(t *testing.T) {
	srv, err := loadCorefile(t, ".:53 {\nlog\nlog example.org\nlog a.example b.example \"{remote} {combined}\" {\n class denial\n class error\n}\nlog {common}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range srv[0].Config("log").([]Rule) {
		got = append(got, r.String())
	}
	want := []string{
		`. class all format "` + strings.ReplaceAll(CommonFormat, `"`, `\"`) + `"`,
		`example.org. class all format "` + strings.ReplaceAll(CommonFormat, `"`, `\"`) + `"`,
		`a.example. class denial,error format "{remote} ` + strings.ReplaceAll(CombinedFormat, `"`, `\"`) + `"`,
		`b.example. class denial,error format "{remote} ` + strings.ReplaceAll(CombinedFormat, `"`, `\"`) + `"`,
		// One argument is a name, as in CoreDNS, even with a brace.
		`{common}. class all format "` + strings.ReplaceAll(CommonFormat, `"`, `\"`) + `"`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rules\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// loadCorefile reads Corefile text as the daemon does (corefile.Load): the
// directive is read by this package (corefile.Register).
func loadCorefile(t *testing.T, text string) ([]*corefile.Server, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return corefile.Load(path, nil, corefile.Options{})
}
