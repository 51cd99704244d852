package rewrite

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// Moved from internal/corefile with the directive's reading.
func TestRewriteForms(t *testing.T) {
	srv, err := loadCorefile(t, ".:53 {\nrewrite name exact a.test b.test\nrewrite stop {\n name regex ^(.*)\\.x\\.$ {1}.y.\n answer auto\n}\nforward . 1.1.1.1\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if rs := srv[0].Config("rewrite").([]*Rule); len(rs) != 2 || rs[1].String() != `stop name regex ^(.*)\.x\.$ {1}.y. answer auto` {
		t.Fatalf("%v", rs)
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
