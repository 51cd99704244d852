// Command report turns the JUnit reports of make conformance's runs into
// the results section of docs/conformance.md and decides the run's outcome.
//
//	report -doc docs/conformance.md -focus REGEXP NAME=DIR...
//
// Each DIR holds one run of the Kubernetes e2e suite: junit_01.xml (its
// --report-dir) and run.txt (what run.sh says about the run: the cache
// deployed, the ginkgo summary, the time), copied into the document as it
// is. Only the specs whose name matches -focus are reported: the suite's
// JUnit report lists every spec it has, run or not.
//
// The document keeps what people wrote: only the text between the markers
// "<!-- results -->" and "<!-- /results -->" is replaced (a document
// without them is an error, not overwritten). Written there: one table,
// a row per spec and a column per run; then each failure's message, the
// evidence, under its run and spec.
//
// The outcome, the exit status: 1 when a [Conformance] spec failed with a
// run whose name does not start with "stock", or a spec that passed with a
// "stock" run failed with one of ours; 0 otherwise. A spec that fails with
// every run is reported, not fatal: docs/conformance.md explains it.
package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Markers around the generated part of the document.
const (
	beginMark = "<!-- results -->"
	endMark   = "<!-- /results -->"
)

// maxMessage bounds one failure's message in the document: the suite's
// messages can carry whole pod dumps; the first lines say what failed, and
// the rest is in the run's log.
const maxMessage = 1500

// A Spec is one test case of a run.
type Spec struct {
	Name    string
	Status  string // passed, failed, skipped, pending (or the report's own word)
	Message string // the failure's or skip's message
	Seconds float64
}

// A Run is one run of the suite against one deployment.
type Run struct {
	Name  string
	Specs map[string]Spec
	About string // run.txt
}

type junitSuites struct {
	Suites []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Body    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Body    string `xml:",chardata"`
	} `xml:"error"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
}

// ParseJUnit reads a ginkgo JUnit report and keeps the specs whose name
// matches focus.
func ParseJUnit(r io.Reader, focus *regexp.Regexp) (map[string]Spec, error) {
	var s junitSuites
	if err := xml.NewDecoder(r).Decode(&s); err != nil {
		return nil, fmt.Errorf("junit: %w", err)
	}
	specs := map[string]Spec{}
	for _, suite := range s.Suites {
		for _, c := range suite.Cases {
			if !focus.MatchString(c.Name) {
				continue
			}
			// ginkgo names a spec by its leaf node: "[It] [sig-network] ...".
			name := strings.TrimPrefix(c.Name, "[It] ")
			sp := Spec{Name: name, Status: c.Status, Seconds: c.Time}
			switch {
			case c.Failure != nil:
				sp.Message = firstNonEmpty(c.Failure.Body, c.Failure.Message)
				if sp.Status == "" {
					sp.Status = "failed"
				}
			case c.Error != nil:
				sp.Message = firstNonEmpty(c.Error.Body, c.Error.Message)
				if sp.Status == "" {
					sp.Status = "failed"
				}
			case c.Skipped != nil:
				sp.Message = c.Skipped.Message
				if sp.Status == "" {
					sp.Status = "skipped"
				}
			}
			if sp.Status == "" {
				sp.Status = "passed"
			}
			if _, dup := specs[name]; dup {
				return nil, fmt.Errorf("junit: spec %q twice", name)
			}
			specs[name] = sp
		}
	}
	return specs, nil
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if strings.TrimSpace(x) != "" {
			return strings.TrimSpace(x)
		}
	}
	return ""
}

func isStock(run string) bool { return strings.HasPrefix(run, "stock") }

func isConformance(spec string) bool { return strings.Contains(spec, "[Conformance]") }

// Verdict lists why the runs fail: a [Conformance] spec failed with one of
// ours, or a spec passed with the stock and failed with ours. Empty: pass.
func Verdict(runs []Run) []string {
	var why []string
	for _, r := range runs {
		if isStock(r.Name) {
			continue
		}
		for _, name := range sortedNames(r.Specs) {
			if r.Specs[name].Status != "failed" {
				continue
			}
			if isConformance(name) {
				why = append(why, fmt.Sprintf("%s: [Conformance] spec failed: %s", r.Name, name))
				continue
			}
			for _, s := range runs {
				if isStock(s.Name) && s.Specs[name].Status == "passed" {
					why = append(why, fmt.Sprintf("%s: failed, passed with %s: %s", r.Name, s.Name, name))
				}
			}
		}
	}
	return why
}

func sortedNames(m map[string]Spec) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Results writes the generated part of the document.
func Results(runs []Run) string {
	var b strings.Builder
	all := map[string]bool{}
	for _, r := range runs {
		for n := range r.Specs {
			all[n] = true
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)

	b.WriteString("Written by `make conformance` (test/conformance/report) from the runs' JUnit reports.\n\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "**%s**\n\n```\n%s\n```\n\n", r.Name, strings.TrimSpace(r.About))
	}
	b.WriteString("| spec |")
	for _, r := range runs {
		fmt.Fprintf(&b, " %s |", r.Name)
	}
	b.WriteString("\n|---|")
	for range runs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, n := range names {
		fmt.Fprintf(&b, "| %s |", strings.ReplaceAll(n, "|", `\|`))
		for _, r := range runs {
			s, ok := r.Specs[n]
			switch {
			case !ok:
				b.WriteString(" not run |")
			case s.Status == "passed":
				fmt.Fprintf(&b, " pass (%.0f s) |", s.Seconds)
			case s.Status == "failed":
				fmt.Fprintf(&b, " **FAIL** (%.0f s) |", s.Seconds)
			default:
				fmt.Fprintf(&b, " %s |", s.Status)
			}
		}
		b.WriteString("\n")
	}
	if why := Verdict(runs); len(why) > 0 {
		b.WriteString("\n**Outcome: fail**\n\n")
		for _, w := range why {
			fmt.Fprintf(&b, "- %s\n", w)
		}
	} else {
		b.WriteString("\n**Outcome: pass** (every [Conformance] spec passed with ours; nothing that passed with the stock failed with ours)\n")
	}
	for _, r := range runs {
		for _, n := range sortedNames(r.Specs) {
			s := r.Specs[n]
			if s.Status != "failed" && !(s.Status == "skipped" && s.Message != "") {
				continue
			}
			fmt.Fprintf(&b, "\n#### %s, %s: %s\n\n```\n%s\n```\n", r.Name, s.Status, n, clip(s.Message))
		}
	}
	return b.String()
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxMessage {
		s = s[:maxMessage] + fmt.Sprintf("\n... (%d bytes more in the run's log)", len(s)-maxMessage)
	}
	// A fence inside the message would end the code block.
	return strings.ReplaceAll(s, "```", "'''")
}

// Splice replaces the text between the markers of doc with results.
func Splice(doc []byte, results string) ([]byte, error) {
	i := bytes.Index(doc, []byte(beginMark))
	j := bytes.Index(doc, []byte(endMark))
	if i < 0 || j < 0 || j < i {
		return nil, errors.New("no " + beginMark + " ... " + endMark + " in the document")
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(beginMark)])
	out.WriteString("\n")
	out.WriteString(results)
	out.WriteString("\n")
	out.Write(doc[j:])
	return out.Bytes(), nil
}

func readRun(arg string, focus *regexp.Regexp) (Run, error) {
	name, dir, ok := strings.Cut(arg, "=")
	if !ok || name == "" || dir == "" {
		return Run{}, fmt.Errorf("run %q: want NAME=DIR", arg)
	}
	f, err := os.Open(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		return Run{}, err
	}
	defer f.Close()
	specs, err := ParseJUnit(f, focus)
	if err != nil {
		return Run{}, fmt.Errorf("%s: %w", name, err)
	}
	about, err := os.ReadFile(filepath.Join(dir, "run.txt"))
	if err != nil {
		return Run{}, err
	}
	return Run{Name: name, Specs: specs, About: string(about)}, nil
}

func main() {
	doc := flag.String("doc", "docs/conformance.md", "the document whose results section is rewritten")
	focusFlag := flag.String("focus", "", "the runs' --ginkgo.focus: the specs to report")
	flag.Parse()
	focus, err := regexp.Compile(*focusFlag)
	if err != nil || *focusFlag == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: report -doc FILE -focus REGEXP NAME=DIR...", err)
		os.Exit(2)
	}
	var runs []Run
	for _, a := range flag.Args() {
		r, err := readRun(a, focus)
		if err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(2)
		}
		runs = append(runs, r)
	}
	if *doc == "-" {
		fmt.Print(Results(runs))
	} else if err := rewrite(*doc, Results(runs)); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	why := Verdict(runs)
	for _, w := range why {
		fmt.Fprintln(os.Stderr, "report:", w)
	}
	if len(why) > 0 {
		os.Exit(1)
	}
}

// rewrite puts results into the document's results section.
func rewrite(doc, results string) error {
	old, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	out, err := Splice(old, results)
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	return os.WriteFile(doc, out, 0o644)
}
