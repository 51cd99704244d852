package stubs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostsAndTemplateThroughRealClients: glibc's getaddrinfo and Go's
// resolver, as pods, get the Corefile's hosts and template answers, and
// with `template IN AAAA { rcode NOERROR }` no AAAA question reaches the
// upstream: the clients still ask (getaddrinfo with AF_UNSPEC asks both),
// the template answers NOERROR without records, and they use the A
// records.
func TestHostsAndTemplateThroughRealClients(t *testing.T) {
	inNetns(t, func(t *testing.T, bin string) {
		e := setupWith(t, bin, func(e *env, nodeResolv string) []string {
			hosts := filepath.Join(e.dir, "hosts")
			if err := os.WriteFile(hosts, []byte("10.77.0.1 pinned.example.com\nfd00::77 pinned.example.com\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(e.dir, "Corefile")
			if err := os.WriteFile(conf, []byte(`.:53 {
    bind `+cacheIP+`
    cache 30
    hosts `+hosts+` {
        fallthrough
    }
    template IN AAAA {
        rcode NOERROR
    }
    template IN A tmpl.example.com {
        answer "{{ .Name }} 60 IN A 10.88.0.1"
    }
    forward . `+upstreamIP+`
    prometheus `+cacheIP+`:9253
}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			return []string{"-local-mode", "-localip", cacheIP, "-conf", conf, "-basecorefile", filepath.Join(e.dir, "none"),
				"-health-port", "0", "-state-dir", "", "-lameduck", "0s", "-setupinterface=false", "-setupiptables=false"}
		})
		for _, kind := range []string{"glibc", "go"} {
			for _, c := range []struct{ name, want string }{
				// hosts: its A record; its AAAA entry is hidden by the
				// template, which comes first in plugin.cfg order.
				{"pinned.example.com", "ok\n10.77.0.1"},
				{"x.tmpl.example.com", "ok\n10.88.0.1"},
				// (The search list's expansions of these names do reach the
				// upstream: not in the hosts file, they fall through.)
				// An external name through the upstream: A only (the
				// upstream has AAAA records for it too).
				{"www.default.example.com", "ok\n198.51.100.1\n198.51.100.2\n198.51.100.3"},
				// The Service through the search list.
				{"api", "ok\n10.96.0.1"},
			} {
				r := e.cached(kind, "default", "gai", c.name)
				if r.out != c.want {
					t.Errorf("%s %s: got %q, want %q", kind, c.name, r.out, c.want)
				}
				for _, l := range r.upLog {
					if strings.HasSuffix(l, " AAAA") || strings.Contains(l, " pinned.example.com. ") || strings.Contains(l, "tmpl.example.com. ") {
						t.Errorf("%s %s: the upstream got %q", kind, c.name, l)
					}
				}
				t.Logf("%s %s: %d queries to the cache, upstream got %v", kind, c.name, r.queries, r.upLog)
			}
		}
	})
}
