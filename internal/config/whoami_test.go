package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// whoami is accepted in a block of its own (-check-config says it is never
// cached, and what CoreDNS's cache in the same block would do), and beside
// a forward that answers every name of the block (never reached, said so);
// with a directive CoreDNS runs before it that passes some names on
// (forward with except, next or a narrower FROM; template, hosts, rewrite,
// dns64) it is refused with the reason, as it would answer only those.
func TestWhoamiBlock(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	root := ".:53 {\n  bind 169.254.25.10\n  forward . 10.0.0.1\n}\n"
	for _, tc := range []struct {
		block, err, note string
	}{
		{"  whoami\n", "", "never cached, coalesced or forwarded"},
		{"  cache 30\n  whoami\n", "", "CoreDNS's cache in the same block would keep one client's answer 5 s"},
		// forward . answers every name first: whoami is never reached,
		// in CoreDNS as here (Gardener's coredns-custom example).
		{"  whoami\n  forward . 10.0.0.2\n", "", "whoami: never reached, as in CoreDNS"},
		{"  whoami\n  forward . 10.0.0.2 {\n    except a.who.example\n  }\n", "whoami with forward in the same block is not supported", ""},
		{"  whoami\n  forward . 10.0.0.2 {\n    next NXDOMAIN\n  }\n", "whoami with forward in the same block is not supported", ""},
		{"  whoami\n  hosts {\n    10.0.0.3 a.who.example\n  }\n", "whoami with hosts in the same block", ""},
		{"  whoami here\n", "whoami: takes no arguments", ""},
	} {
		text := "who.example:53 {\n  bind 169.254.25.10\n" + tc.block + "}\n" + root
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Parse(base(t, dir, "-localip", "169.254.25.10", "-conf", conf), stockEnv(), io.Discard)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.block, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.block, err)
		}
		if shadowed := strings.Contains(strings.Join(c.DropIn.Notes, "\n"), "whoami is never reached"); shadowed != strings.Contains(tc.note, "never reached") {
			t.Errorf("%q: start notes %v", tc.block, c.DropIn.Notes)
		}
		if !c.DropIn.Corefile.Servers[0].Has("whoami") || !strings.Contains(strings.Join(c.DropIn.Corefile.Mapping, "\n"), tc.note) {
			t.Errorf("%q: whoami %v mapping %v", tc.block, c.DropIn.Corefile.Servers[0].Has("whoami"), c.DropIn.Corefile.Mapping)
		}
	}
}
