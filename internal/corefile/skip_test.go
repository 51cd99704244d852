package corefile_test

import (
	"slices"
	"strings"
	"testing"

	. "github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/hosts"
	"github.com/nodelocaldns/nodelocaldns/internal/template"
)

// hostsOf and templatesOf are a block's hosts and template configurations
// (read by their own packages).
func hostsOf(s *Server) *hosts.Config         { return s.Config("hosts").(*hosts.Config) }
func templatesOf(s *Server) []template.Config { return s.Config("template").([]template.Config) }

// What CoreDNS skips, we skip, and record (file:line, the entry, why); what
// it refuses (a server key or forward FROM that is no domain name), we
// refuse. The stock node-cache starts with each skipped entry below
// (test/dropin TestSkippedEntriesWithStockNodeCache runs them).
func TestSkippedAsCoreDNS(t *testing.T) {
	tests := []struct {
		name, body string
		skipped    []string // "line entry"
		check      func(t *testing.T, s *Server)
	}{
		{"hosts entry with no address", "hosts {\n 10.0.0.1 a.example\n not-an-ip b.example\n 10.0.0.3 c.example\n}", []string{"4 not-an-ip b.example"},
			func(t *testing.T, s *Server) {
				if !slices.Equal(hostsOf(s).Inline, []string{"10.0.0.1 a.example", "10.0.0.3 c.example"}) {
					t.Errorf("inline %q", hostsOf(s).Inline)
				}
			}},
		{"hosts address without a name", "hosts {\n 10.0.0.2\n}", []string{"3 10.0.0.2"}, nil},
		{"hosts option misspelt", "hosts {\n tll 30\n fallthrough\n}", []string{"3 tll 30"},
			func(t *testing.T, s *Server) {
				if hostsOf(s).TTL != 3600 || !slices.Equal(hostsOf(s).Fallthrough, []string{"."}) {
					t.Errorf("ttl %d fallthrough %v", hostsOf(s).TTL, hostsOf(s).Fallthrough)
				}
			}},
		{"hosts zones", "hosts /etc/hosts a..b example", []string{"2 a..b"},
			func(t *testing.T, s *Server) {
				if !slices.Equal(hostsOf(s).Zones, []string{"example."}) {
					t.Errorf("zones %v", hostsOf(s).Zones)
				}
			}},
		{"hosts every zone invalid: none, not the block's", "hosts /etc/hosts a..b", []string{"2 a..b"},
			func(t *testing.T, s *Server) {
				if hostsOf(s).Zones == nil || len(hostsOf(s).Zones) != 0 {
					t.Errorf("zones %#v", hostsOf(s).Zones)
				}
			}},
		{"hosts fallthrough", "hosts {\n 10.0.0.1 a.example\n fallthrough a..b example\n}", []string{"4 a..b"},
			func(t *testing.T, s *Server) {
				if !slices.Equal(hostsOf(s).Fallthrough, []string{"example."}) {
					t.Errorf("fallthrough %v", hostsOf(s).Fallthrough)
				}
			}},
		{"template zones", "template IN A a..b example {\n answer \"{{ .Name }} 60 IN A 10.1.1.1\"\n fallthrough x..y\n}", []string{"2 a..b", "4 x..y"},
			func(t *testing.T, s *Server) {
				if c := templatesOf(s)[0]; !slices.Equal(c.Zones, []string{"example."}) {
					t.Errorf("zones %v", c.Zones)
				}
			}},
		{"cache zones", "cache 30 a..b example", []string{"2 a..b"},
			func(t *testing.T, s *Server) {
				if !s.Cache.Covers("example.") || s.Cache.Covers(".") {
					t.Errorf("zones %v", s.Cache.Zones)
				}
			}},
		{"cache every zone invalid caches nothing", "cache 30 a..b", []string{"2 a..b"},
			func(t *testing.T, s *Server) {
				if s.Cache.Covers(".") || s.Cache.Covers("example.") {
					t.Errorf("zones %#v cover names", s.Cache.Zones)
				}
			}},
		{"cache disable", "cache {\n disable denial a..b\n}", []string{"3 a..b"},
			func(t *testing.T, s *Server) {
				if _, den := s.Cache.DisabledAt("example."); den {
					t.Errorf("denial disabled for every name: %+v", s.Cache)
				}
			}},
		{"forward except", "forward . 10.0.0.1 {\n except a..b example\n}", []string{"3 a..b"},
			func(t *testing.T, s *Server) {
				if !slices.Equal(s.Forward.Except, []string{"example."}) {
					t.Errorf("except %v", s.Forward.Except)
				}
			}},
		{"metadata", "metadata a..b", []string{"2 a..b"}, nil},
		{"hosts file a directory", "hosts /etc {\n 10.0.0.1 a.example\n}", []string{"2 /etc"},
			func(t *testing.T, s *Server) {
				if hostsOf(s).Path != "/etc" || len(hostsOf(s).Inline) != 1 {
					t.Errorf("path %q inline %q", hostsOf(s).Path, hostsOf(s).Inline)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := load(t, ".:53 {\n"+tc.body+"\n}\n")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range Skips(srv) {
				got = append(got, strings.TrimPrefix(k.Pos.String(), k.Pos.File+":")+" "+k.Entry)
				if !strings.HasPrefix(k.String(), k.Pos.String()+": ") || k.Why == "" {
					t.Errorf("%s", k)
				}
			}
			if !slices.Equal(got, tc.skipped) {
				t.Errorf("skipped %q, want %q", got, tc.skipped)
			}
			if tc.check != nil {
				tc.check(t, srv[0])
			}
		})
	}
	for _, text := range []string{"a..b:53 {\n forward . 10.0.0.1\n}\n", ".:53 {\n forward a..b 10.0.0.1\n}\n"} {
		if _, err := load(t, text); err == nil || !strings.Contains(err.Error(), "is not a domain name") {
			t.Errorf("%q: %v, want refused as CoreDNS refuses it", text, err)
		}
	}
	// A block on two ports is two servers: its skipped entries once.
	srv, err := load(t, "a.example:53 b.example:54 {\n hosts {\n  bogus\n }\n}\n")
	if err != nil || len(srv) != 2 || len(Skips(srv)) != 1 {
		t.Fatalf("%d servers, skips %v: %v", len(srv), Skips(srv), err)
	}
}
