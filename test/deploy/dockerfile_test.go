package deploy

import (
	"bufio"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// There is no Docker engine here: the Dockerfile is parsed and checked, and
// its go build command is run exactly as written (only the output path
// moves), then the binary it makes is inspected and run.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// stage is one FROM and what follows it.
type stage struct {
	from, name string
	ins        []instruction
}

func parseDockerfile(t *testing.T) (args map[string]string, stages []*stage) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args = map[string]string{}
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, rest, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.Join(strings.Fields(rest), " ")}
		switch {
		case in.cmd == "FROM":
			fields := strings.Fields(in.args)
			fields = slices.DeleteFunc(fields, func(s string) bool { return strings.HasPrefix(s, "--platform=") })
			st := &stage{from: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				st.name = fields[2]
			}
			stages = append(stages, st)
		case len(stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			args[k] = v
		case len(stages) == 0:
			t.Fatalf("Dockerfile: %s before the first FROM", in.cmd)
		default:
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // comments, parser directives; inside a continuation too
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	if len(stages) == 0 {
		t.Fatal("Dockerfile has no FROM")
	}
	return args, stages
}

// dockerfileEntrypoint is the final stage's ENTRYPOINT in exec form.
func dockerfileEntrypoint(t *testing.T) []string {
	t.Helper()
	_, stages := parseDockerfile(t)
	var entry []string
	for _, in := range stages[len(stages)-1].ins {
		if in.cmd == "ENTRYPOINT" {
			entry = nil
			if err := json.Unmarshal([]byte(in.args), &entry); err != nil {
				t.Fatalf("ENTRYPOINT %s is not in exec form (a JSON array): %v", in.args, err)
			}
		}
	}
	if len(entry) == 0 {
		t.Fatal("the final stage has no ENTRYPOINT")
	}
	return entry
}

// goBuildCommand is the build stage's RUN that runs go build, without its
// --mount options.
func goBuildCommand(t *testing.T, st *stage) string {
	t.Helper()
	for _, in := range st.ins {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		fields := strings.Fields(in.args)
		for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
			fields = fields[1:]
		}
		return strings.Join(fields, " ")
	}
	t.Fatalf("stage %s runs no go build", st.name)
	return ""
}

// TestDockerfile checks the image's structure: a build stage making a
// static, stripped binary; a final stage with both iptables backends and
// nothing else, OCI labels and a fixed entrypoint that the DaemonSet's
// probes also run.
func TestDockerfile(t *testing.T) {
	args, stages := parseDockerfile(t)
	if len(stages) < 2 {
		t.Fatalf("%d stages: want a build stage and a runtime stage", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	if build.name == "" || !strings.HasPrefix(build.from, "golang:") {
		t.Errorf("first stage FROM %s AS %q: want a named golang stage", build.from, build.name)
	}
	// The Go toolchain is the one go.mod asks for.
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goDirective := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(data)
	if goDirective == nil {
		t.Fatal("go.mod has no go directive")
	}
	if args["GO_VERSION"] != string(goDirective[1]) || !strings.Contains(build.from, "${GO_VERSION}") {
		t.Errorf("ARG GO_VERSION=%s used in FROM %s; go.mod says go %s", args["GO_VERSION"], build.from, goDirective[1])
	}
	cmd := goBuildCommand(t, build)
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags="-s -w"`, "-o /out/nodelocaldns", "./cmd/nodelocaldns"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("go build command %q lacks %s", cmd, want)
		}
	}

	if final.from != "debian:bookworm-slim" {
		t.Errorf("runtime stage FROM %s, want debian:bookworm-slim (see the Dockerfile for why)", final.from)
	}
	labels := map[string]bool{}
	var copies, runs []string
	for _, in := range final.ins {
		switch in.cmd {
		case "LABEL":
			for _, f := range strings.Fields(in.args) {
				if k, _, ok := strings.Cut(f, "="); ok {
					labels[k] = true
				}
			}
		case "COPY", "ADD":
			copies = append(copies, in.cmd+" "+in.args)
		case "RUN":
			runs = append(runs, in.args)
		case "CMD":
			t.Errorf("CMD %s in the runtime stage: the DaemonSet passes every flag", in.args)
		}
	}
	for _, l := range []string{"title", "description", "source", "version", "revision"} {
		if !labels["org.opencontainers.image."+l] {
			t.Errorf("no LABEL org.opencontainers.image.%s", l)
		}
	}
	if want := []string{"COPY --from=" + build.name + " /out/nodelocaldns /nodelocaldns"}; !slices.Equal(copies, want) {
		t.Errorf("runtime stage copies %q, want only %q", copies, want)
	}
	// Exactly one package, without its recommends (the nft CLI), and no
	// apt lists left in the layer.
	if len(runs) != 1 || !strings.Contains(runs[0], "apt-get install -y --no-install-recommends iptables &&") ||
		!strings.Contains(runs[0], "rm -rf /var/lib/apt/lists/*") {
		t.Errorf("runtime stage RUN %q: want one apt-get install --no-install-recommends iptables, lists removed", runs)
	}
	if entry := dockerfileEntrypoint(t); !slices.Equal(entry, []string{"/nodelocaldns"}) {
		t.Errorf("ENTRYPOINT %q, want [\"/nodelocaldns\"]", entry)
	}
}

// TestDockerfileBuild runs the Dockerfile's go build command as written
// (output moved to a temporary directory; TARGETOS/TARGETARCH as BuildKit
// sets them for this machine), checks that the binary is static, stripped,
// path-free and stamped with the commit, and runs it: -check-config with
// the manifest's args, and the manifest's probe.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	_, stages := parseDockerfile(t)
	out := t.TempDir()
	cmdline := strings.ReplaceAll(goBuildCommand(t, stages[0]), "/out/nodelocaldns", filepath.Join(out, "nodelocaldns"))
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sh", "-c", cmdline)
	c.Dir = root
	c.Env = append(os.Environ(), "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH)
	if b, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, b)
	}
	bin := filepath.Join(out, "nodelocaldns")

	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary is dynamically linked (%v)", p.Type)
		}
	}
	if ef.Section(".symtab") != nil {
		t.Error("binary has a symbol table: -ldflags -s did not apply")
	}
	ef.Close()
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("build settings %v: want CGO_ENABLED=0 and -trimpath", settings)
	}
	if data, err := os.ReadFile(bin); err == nil && bytes.Contains(data, []byte(root+"/internal/")) {
		t.Errorf("binary contains the build path %s", root)
	}
	// The commit, as nodelocaldns_build_info reports it (when this is a
	// git clone, as the image's build context is; go build does not stamp
	// in a git worktree, whose .git is a file).
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Logf("not a git clone (.git: %v): vcs.revision not checked", err)
	} else if head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		if got, want := settings["vcs.revision"], strings.TrimSpace(string(head)); got != want {
			t.Errorf("vcs.revision %q, want HEAD %q", got, want)
		}
	}

	// The binary with the manifest's args, as the pod would start it.
	objs := loadManifest(t, iptablesMode)
	ctr := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", ctr)
	var kv []string
	for k, v := range env {
		kv = append(kv, k+"="+v)
	}
	check := exec.Command(bin, append(containerArgs(ctr, env), "-resolv-conf="+nodeResolvConf(t), "-check-config")...)
	check.Env = kv
	if b, err := check.CombinedOutput(); err != nil || !bytes.Contains(b, []byte("configuration is valid")) {
		t.Errorf("-check-config with the manifest's args: %v\n%s", err, b)
	}
	probe := exec.Command(bin, append(slices.Clone(ctr.LivenessProbe.Exec.Command[1:]), "-state-dir", t.TempDir())...)
	b, err := probe.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !bytes.Contains(b, []byte("no running nodelocaldns")) {
		t.Errorf("liveness probe without an instance: %v %s, want exit 1", err, b)
	}
}

// TestDockerignore: the build context keeps .git (the commit stamp) and
// the sources, and leaves out what .gitignore leaves out, so the stamp says
// "modified" only when the tree is.
func TestDockerignore(t *testing.T) {
	read := func(name string) []string {
		data, err := os.ReadFile(filepath.Join(repoRoot, name))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				out = append(out, l)
			}
		}
		return out
	}
	ignore := read(".dockerignore")
	norm := func(p string) string { return strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/") }
	has := func(p string) bool {
		return slices.ContainsFunc(ignore, func(i string) bool { return norm(i) == norm(p) })
	}
	for _, g := range read(".gitignore") {
		// gitignore matches a pattern without an inner slash at any depth;
		// .dockerignore only at the root unless it starts with **/.
		want := g
		if !strings.Contains(strings.Trim(g, "/"), "/") && !strings.HasPrefix(g, "/") {
			want = "**/" + g
		}
		if !has(want) {
			t.Errorf(".gitignore's %q has no %q in .dockerignore", g, want)
		}
	}
	for _, keep := range []string{".git", "go.mod", "go.sum", "cmd", "internal", "*", "**"} {
		if has(keep) {
			t.Errorf(".dockerignore excludes %s, which the build needs", keep)
		}
	}
}
