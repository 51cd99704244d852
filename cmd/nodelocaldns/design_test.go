package main

import (
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDesignPackageGraph keeps docs/design.md's package graph true: every
// package of cmd/ and internal/ (test helpers aside) is listed once, on its
// floor (one above the highest it imports), with exactly its imports within
// the module, as `go list` gives them. A directive's package (one
// internal/plugins lists) may go unlisted: plugins' line says
// "(directives)", and such a package must import nothing but the
// directives' floor (directiveFloor), so adding a directive touches its
// package and plugins.go, not this document.
func TestDesignPackageGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../../cmd/...", "../../internal/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/nodelocaldns/nodelocaldns/"
	short := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "internal/") }
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if strings.HasSuffix(f[0], "test") { // configmaptest: a helper of tests
			continue
		}
		var in []string
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) {
				in = append(in, short(imp))
			}
		}
		slices.Sort(in)
		imports[short(f[0])] = in
	}
	floor := map[string]int{}
	var floorOf func(p string) int
	floorOf = func(p string) int {
		if f, ok := floor[p]; ok {
			return f
		}
		f := 0
		for _, imp := range imports[p] {
			f = max(f, floorOf(imp)+1)
		}
		floor[p] = f
		return f
	}

	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "## Packages\n")
	if !ok {
		t.Fatal("docs/design.md has no ## Packages section")
	}
	_, block, _ := strings.Cut(sec, "```\n")
	block, _, _ = strings.Cut(block, "```")
	line := regexp.MustCompile(`^\s*(\d+)?\s+(\S+)\s.*\(([^)]*)\)\s*$`)
	directives := map[string]bool{}
	for _, p := range imports["plugins"] {
		directives[p] = true
	}
	listed := map[string]bool{}
	cur := -1
	for _, l := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("design.md: cannot read %q (floor, package, what it does, (imports))", l)
			continue
		}
		if m[1] != "" {
			cur, _ = strconv.Atoi(m[1])
		}
		p := m[2]
		listed[p] = true
		want, ok := imports[p]
		if !ok {
			t.Errorf("design.md lists %s, which go list does not know", p)
			continue
		}
		var got []string
		for _, imp := range strings.Split(m[3], ",") {
			if imp = strings.TrimSpace(imp); imp != "" {
				got = append(got, imp)
			}
		}
		if p == "plugins" && m[3] == "directives" {
			got = want // derived: the directives' packages, checked below
		}
		if !slices.Equal(got, want) {
			t.Errorf("design.md: %s imports (%s); go list: (%s)", p, strings.Join(got, ", "), strings.Join(want, ", "))
		}
		if f := floorOf(p); f != cur {
			t.Errorf("design.md: %s on floor %d; its imports put it on %d", p, cur, f)
		}
	}
	for p := range imports {
		switch {
		case listed[p]:
		case directives[p]:
			for _, imp := range imports[p] {
				if !directiveFloor[imp] {
					t.Errorf("directive package %s imports %s: a directive imports only %v", p, imp, slices.Sorted(maps.Keys(directiveFloor)))
				}
			}
		default:
			t.Errorf("design.md does not list %s (floor %d, imports %v)", p, floorOf(p), imports[p])
		}
	}
}

// directiveFloor is what a directive's package may import within the
// module: the Corefile's reading (corefile), the handlers' interfaces and
// registries (answer, directive), the wire format, time, the zone table,
// and rewrite's answer rules.
var directiveFloor = map[string]bool{
	"answer": true, "corefile": true, "directive": true, "wire": true, "clock": true, "zone": true, "rwanswer": true,
}
