package template

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// Moved from internal/corefile with the directive's reading.
func TestTemplateForms(t *testing.T) {
	srv, err := loadCorefile(t, "example.org:53 {\ntemplate IN AAAA\ntemplate ANY A a.example.org B.Example.Org. {\n match ^x ^y\n answer \"{{ .Name }} 60 IN A 1.2.3.4\"\n additional \"a. IN A 1.1.1.1\"\n authority \"b. IN NS c.\"\n rcode NXDOMAIN\n fallthrough\n ederror 17 \"filtered here\"\n}\nforward . 1.1.1.1\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	ts := srv[0].Config("template").([]Config)
	if len(ts) != 2 || ts[0].Type != dns.TypeAAAA || ts[0].Class != dns.ClassINET || !slices.Equal(ts[0].Zones, []string{"example.org."}) || ts[0].Rcode != 0 || ts[0].Fallthrough != nil {
		t.Fatalf("first: %+v", ts)
	}
	b := ts[1]
	if b.Class != dns.ClassANY || !slices.Equal(b.Zones, []string{"a.example.org.", "b.example.org."}) || len(b.Match) != 2 || len(b.Answer) != 1 ||
		len(b.Additional) != 1 || len(b.Authority) != 1 || b.Rcode != dns.RcodeNameError || !slices.Equal(b.Fallthrough, []string{"."}) ||
		b.EDE == nil || b.EDE.Code != 17 || b.EDE.Text != "filtered here" || ts[0].EDE != nil {
		t.Fatalf("second: %+v", b)
	}
	var names []string
	for _, p := range srv[0].Plugins {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"template", "template", "forward"}) {
		t.Fatalf("plugins %v", names)
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
