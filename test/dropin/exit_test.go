package dropin

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// An unsupported directive stops the start and -check-config with exit 2
// and one line naming file, line, directive and what is supported; a good
// Corefile's -check-config prints it block by block with the mapping.
func TestCorefileExitCodes(t *testing.T) {
	bin := buildNodelocaldns(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	base := []string{"-localip", "169.254.20.10", "-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm=",
		"-setupinterface=false", "-setupiptables=false", "-state-dir="}
	for _, tc := range []struct{ directive, want string }{
		{"kubernetes cluster.local", ":3: directive kubernetes is not supported by nodelocaldns; supported: "},
		{"template IN AAAA {\n    answer \"x. IN TXT {{ .Var.x }}\"\n  }", ":3: template: answer: \"x. IN TXT {{ .Var.x }}\" uses .Var"},
		{"hosts {\n    ttl 0\n  }", ":4: hosts: ttl takes a number of seconds from 1 to 65535"},
		{"forward . https://1.1.1.1", ":3: forward: TO \"https://1.1.1.1\": transport https:// is not supported (dns:// and tls:// only); supported: forward FROM TO..."},
		{"forward . tls://1.1.1.1 {\n    tls /nonexistent/ca.pem\n  }", ":3: forward tls: open /nonexistent/ca.pem: no such file or directory"},
		{"dnstap /tmp/dnstap.sock nofull", ":3: dnstap: the second argument is full or nothing, not \"nofull\""},
		{"trace zipkin localhost:9411 {\n    sample 3\n  }", ":4: trace: option sample is not supported"},
	} {
		text := ".:53 {\n  bind 169.254.20.10\n  " + tc.directive + "\n}\n"
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, extra := range [][]string{nil, {"-check-config"}} {
			cmd := exec.Command(bin, append(append([]string{}, base...), extra...)...)
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("%q %v: exit %v, want 2\n%s", tc.directive, extra, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], conf+tc.want) {
				t.Errorf("%q %v: want one line with %q, got:\n%s", tc.directive, extra, conf+tc.want, out)
			}
		}
	}
	text := "cluster.local:53 {\n  cache 30\n  bind 169.254.20.10\n  forward . 10.96.0.11 {\n    force_tcp\n  }\n  health 169.254.20.10:8080\n  reload\n}\n" +
		".:53 {\n  cache 30\n  bind 169.254.20.10\n  forward . 192.0.2.53\n  prometheus :9253\n}\n"
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// 169.254.20.10 is on no interface of this host: without
	// -setupinterface the start would fail, so -check-config says so.
	out, err := exec.Command(bin, append(base, "-check-config", "-lameduck", "3s")...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "cannot listen: not addresses of this host: dns 169.254.20.10") {
		t.Errorf("-setupinterface=false, 169.254.20.10 nowhere: %v\n%s", err, out)
	}
	// -setupinterface creates it: valid.
	withIface := append(slices.DeleteFunc(slices.Clone(base), func(a string) bool { return a == "-setupinterface=false" }), "-check-config", "-lameduck", "3s")
	out, err = exec.Command(bin, withIface...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"block " + conf + ":1  keys cluster.local:53  zones cluster.local.  port 53  plugins (CoreDNS order) reload bind health cache forward",
		"forward . [10.96.0.11:53]: zones [cluster.local.] go to kube-dns 10.96.0.11:53 over pipelined TCP (force_tcp)",
		"reload: accepted, no-op",
		"block " + conf + ":10  keys .:53",
		"forward . [192.0.2.53:53]: every other name goes to [192.0.2.53:53]",
		"kube-dns:         10.96.0.11:53 (from Corefile " + conf + ":1)",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-check-config lacks %q:\n%s", want, out)
		}
	}
}
