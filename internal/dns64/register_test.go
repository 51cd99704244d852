package dns64

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// Moved from internal/corefile with the directive's reading.
func TestDNS64Forms(t *testing.T) {
	srv, err := loadCorefile(t, ".:53 {\ndns64 {\n prefix 2001:db8::/32\n translate_all\n allow_ipv4\n}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c := srv[0].Config("dns64").(*Config); c == nil || c.Prefix.String() != "2001:db8::/32" || !c.TranslateAll || !c.AllowIPv4 {
		t.Fatalf("%+v", c)
	}
	srv, err = loadCorefile(t, ".:53 {\ndns64\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c := srv[0].Config("dns64").(*Config); c.Prefix.String() != "64:ff9b::/96" || c.TranslateAll || c.AllowIPv4 {
		t.Fatalf("%+v", c)
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
