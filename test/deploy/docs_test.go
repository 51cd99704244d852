package deploy

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// docs/deploy.md marks each fenced block with the HTML comment line before
// it, so no command escapes this test:
//
//	<!-- ci: run -->      runs here (bash, in a copy of the module)
//	<!-- ci: cluster -->  needs a cluster, a node or a Docker engine
//	<!-- ci: k8s -->      a Kubernetes object, decoded strictly
//	<!-- ci: output -->   what a command prints
const deployDoc = repoRoot + "/docs/deploy.md"

type docBlock struct {
	marker, lang, body string
	line               int
}

var (
	fenceOpen  = regexp.MustCompile("^(\\s*)```([a-z]*)\\s*$")
	fenceClose = regexp.MustCompile("^\\s*```\\s*$")
	ciMarker   = regexp.MustCompile(`^\s*<!-- ci: ([a-z0-9]+) -->\s*$`)
)

func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docBlock
	var cur *docBlock
	indent, prev := "", ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && fenceClose.MatchString(line):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body += strings.TrimPrefix(line, indent) + "\n"
		case fenceOpen.MatchString(line):
			m := fenceOpen.FindStringSubmatch(line)
			indent = m[1]
			cur = &docBlock{lang: m[2], line: n}
			if mm := ciMarker.FindStringSubmatch(prev); mm != nil {
				cur.marker = mm[1]
			}
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unclosed code block", path, cur.line)
	}
	return out
}

// copyModule copies what a build needs (go.mod, go.sum, cmd, internal,
// deploy, Dockerfile) to dir, so doc commands that write files (the
// binary, nodelocaldns.yaml) leave the work tree alone.
func copyModule(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{"go.mod", "go.sum", "Dockerfile", "cmd", "internal", "deploy"} {
		src := filepath.Join(repoRoot, name)
		err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repoRoot, p)
			dst := filepath.Join(dir, rel)
			if d.IsDir() {
				return os.MkdirAll(dst, 0o755)
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, data, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// shellArgs splits the -check-config command of a block into its flags:
// continuation lines joined, the environment assignments and the binary
// dropped. The doc's commands use no quoting.
func shellArgs(body string) []string {
	fields := strings.Fields(strings.ReplaceAll(body, "\\\n", " "))
	for len(fields) > 0 && (strings.Contains(fields[0], "=") || !strings.HasPrefix(fields[0], "-")) {
		fields = fields[1:]
	}
	return fields
}

// TestDocCommands runs every command of docs/deploy.md that can run
// without a cluster, in order, each block in its own bash with
// `set -euo pipefail`: the build, both modes' sed lines (whose output must
// be exactly the manifest TestDeployManifest checks), -check-config with
// the manifest's args, and the local run queried with dig and curl. Blocks
// that need a cluster are only required to say so; Kubernetes objects in
// the doc are decoded strictly.
func TestDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it")
	}
	need(t, "bash")
	need(t, "dig")
	need(t, "curl")
	blocks := docBlocks(t, deployDoc)
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	rendered := map[string]mode{
		substitute(string(raw), iptablesMode): iptablesMode,
		substitute(string(raw), ipvsMode):     ipvsMode,
	}
	entry := dockerfileEntrypoint(t)

	var runs []docBlock
	for _, b := range blocks {
		switch b.marker {
		case "run":
			runs = append(runs, b)
		case "k8s":
			if objs, err := decodeObjects([]byte(b.body)); err != nil || len(objs) == 0 {
				t.Errorf("%s:%d: %d objects, %v", deployDoc, b.line, len(objs), err)
			}
		case "cluster", "output":
		default:
			t.Errorf("%s:%d: code block without a <!-- ci: run|cluster|k8s|output --> line before it", deployDoc, b.line)
		}
	}
	// The documented -check-config is the manifest's own.
	objs := loadManifest(t, iptablesMode)
	manifestArgs := daemonSets(objs)[0].Spec.Template.Spec.Containers[0].Args
	checked := false
	for _, b := range runs {
		if strings.Contains(b.body, "-check-config") {
			checked = true
			args := slices.DeleteFunc(shellArgs(b.body), func(a string) bool { return a == "-check-config" })
			if !slices.Equal(args, manifestArgs) {
				t.Errorf("%s:%d: -check-config with %q; the manifest (iptables mode) has %q", deployDoc, b.line, args, manifestArgs)
			}
		}
	}
	if !checked {
		t.Error("the doc runs no -check-config")
	}

	dir := t.TempDir()
	copyModule(t, dir)
	ip := testhost.Loopback() // instead of 127.0.0.1: no port is shared with another test
	seen := map[mode]bool{}
	for _, b := range runs {
		script := "set -euo pipefail\n" +
			"trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" +
			// What the doc's cluster block sets.
			"localdns=" + testLocalDNS + " kubedns=" + testKubeDNS + " domain=" + testDomain + " image=" + testImage + "\n" +
			strings.ReplaceAll(b.body, "127.0.0.1", ip)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		c := exec.CommandContext(ctx, "bash", "-c", script)
		c.Dir = dir
		// A daemon still in its lame duck holds the output pipe: do not
		// wait for it (the trap's second signal ends it at once).
		c.WaitDelay = 3 * time.Second
		out, err := c.CombinedOutput()
		cancel()
		if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
			t.Fatalf("%s:%d: %v\n%s\n%s", deployDoc, b.line, err, b.body, out)
		}
		t.Logf("%s:%d ok:\n%s", deployDoc, b.line, out)
		yml := filepath.Join(dir, "nodelocaldns.yaml")
		if data, err := os.ReadFile(yml); err == nil {
			_ = os.Remove(yml)
			m, ok := rendered[string(data)]
			if !ok {
				t.Errorf("%s:%d: nodelocaldns.yaml is neither mode's manifest as the test renders it", deployDoc, b.line)
				continue
			}
			seen[m] = true
			objs, err := decodeObjects(data)
			if err != nil {
				t.Fatal(err)
			}
			for _, err := range checkDeployment(objs, m, entry, nodeResolvConf(t)) {
				t.Errorf("%s:%d (%s mode): %v", deployDoc, b.line, m, err)
			}
		}
	}
	if !seen[iptablesMode] || !seen[ipvsMode] {
		t.Errorf("the doc's sed lines rendered %v; want both modes", seen)
	}
}
