package hosts

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// Moved from internal/corefile with the directive's reading.
func TestHostsForms(t *testing.T) {
	srv, err := loadCorefile(t, "example.org:53 {\nhosts /nonexistent/hosts a.example.org {\n 10.0.0.1 x.a.example.org y\n ttl 60\n no_reverse\n reload 0\n fallthrough b.example.org\n fallthrough_unsupported\n}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	h := srv[0].Config("hosts").(*Config)
	if h == nil || h.Path != "/nonexistent/hosts" || !slices.Equal(h.Zones, []string{"a.example.org."}) || !slices.Equal(h.Inline, []string{"10.0.0.1 x.a.example.org y"}) ||
		h.TTL != 60 || !h.NoReverse || h.Reload != 0 || !slices.Equal(h.Fallthrough, []string{"b.example.org."}) || !h.FallthroughUnsupported {
		t.Fatalf("%+v", h)
	}
	srv, err = loadCorefile(t, ".:53 {\nhosts\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if h := srv[0].Config("hosts").(*Config); h.Path != "/etc/hosts" || h.TTL != 3600 || h.Reload != 5*time.Second || h.Fallthrough != nil || !slices.Equal(h.Zones, []string{"."}) {
		t.Fatalf("defaults %+v", h)
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
