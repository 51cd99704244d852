package config

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// helpFlag is one flag as -h prints it.
type helpFlag struct {
	typ string // the type word after the name ("" for a bool)
	def string // the value of "(default ...)", quotes removed; "" when none is printed
}

// helpFlags parses what -h prints.
func helpFlags(t *testing.T) map[string]helpFlag {
	t.Helper()
	var out bytes.Buffer
	_, err := Parse([]string{"-h"}, func(string) string { return "" }, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h): %v", err)
	}
	head := regexp.MustCompile(`^  -(\S+)(?: (\S+))?$`)
	def := regexp.MustCompile(`\(default ([^()]*)\)$`)
	flags := map[string]helpFlag{}
	var cur string
	for _, line := range strings.Split(out.String(), "\n") {
		if m := head.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = helpFlag{typ: m[2]}
			continue
		}
		if cur == "" {
			continue
		}
		if m := def.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			f := flags[cur]
			f.def = strings.Trim(m[1], `"`)
			flags[cur] = f
		}
	}
	if len(flags) < 40 {
		t.Fatalf("-h printed %d flags:\n%s", len(flags), out.String())
	}
	return flags
}

// readmeRow is a row of the README's flag tables: its flags and, when the
// default column is nothing but literals, those.
type readmeRow struct {
	flags []string
	defs  []string // nil: the default is prose (or empty)
}

func readmeFlagRows(t *testing.T) []readmeRow {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Flags\n")
	if !ok {
		t.Fatal("README.md has no ## Flags section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	code := regexp.MustCompile("^`([^`]*)`$")
	var rows []readmeRow
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`-") {
			continue
		}
		var r readmeRow
		for _, f := range strings.Split(cells[1], "/") {
			f = strings.Trim(strings.TrimSpace(f), "`")
			r.flags = append(r.flags, strings.TrimPrefix(f, "-"))
		}
		if d := strings.TrimSpace(cells[2]); d != "" {
			for _, v := range strings.Split(d, " / ") {
				m := code.FindStringSubmatch(strings.TrimSpace(v))
				if m == nil || strings.HasPrefix(m[1], "-") && len(m[1]) > 1 && m[1][1] >= 'a' {
					r.defs = nil // prose, or another flag named as the default
					break
				}
				r.defs = append(r.defs, m[1])
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// sameDefault compares a README literal with what -h printed, durations
// by value (60s is 1m0s).
func sameDefault(readme, help string) bool {
	if readme == help {
		return true
	}
	a, errA := time.ParseDuration(readme)
	b, errB := time.ParseDuration(help)
	return errA == nil && errB == nil && a == b
}

// TestREADMEFlagTable: the README's flag tables list every flag -h prints,
// no other, each once, and a default written as literals is -h's.
func TestREADMEFlagTable(t *testing.T) {
	help := helpFlags(t)
	seen := map[string]bool{}
	for _, r := range readmeFlagRows(t) {
		for i, name := range r.flags {
			h, ok := help[name]
			switch {
			case !ok:
				t.Errorf("README lists -%s, which -h does not print", name)
				continue
			case seen[name]:
				t.Errorf("README lists -%s twice", name)
			}
			seen[name] = true
			if r.defs == nil {
				continue
			}
			want := r.defs[0]
			if len(r.defs) == len(r.flags) {
				want = r.defs[i]
			} else if len(r.defs) != 1 {
				t.Errorf("README's -%s row has %d flags and %d defaults", name, len(r.flags), len(r.defs))
				continue
			}
			if h.def == "" {
				// -h prints no default for a zero value, nor for a
				// flag.Value whose default reads as its zero.
				if h.typ != "value" && !slices.Contains([]string{"false", "0", "0s", `""`}, want) {
					t.Errorf("README: -%s defaults to %q; -h prints no default (a zero value)", name, want)
				}
				continue
			}
			if !sameDefault(want, h.def) {
				t.Errorf("README: -%s defaults to %q; -h: %q", name, want, h.def)
			}
		}
	}
	for name := range help {
		if !seen[name] {
			t.Errorf("-h prints -%s, which README's flag tables do not list", name)
		}
	}
}
