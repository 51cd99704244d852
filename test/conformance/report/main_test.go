package main

import (
	"regexp"
	"strings"
	"testing"
)

// A ginkgo v2 JUnit report as e2e.test writes it (--report-dir), cut down:
// a spec that passed, one that failed, one skipped at run time, one the
// focus left out, and the suite's own nodes.
const junit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="0" errors="0" failures="1" time="100">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" disabled="0" skipped="2" errors="0" failures="1" time="100">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.5"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for the cluster [Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.25"></testcase>
    <testcase name="[sig-network] DNS configMap nameserver Change stubDomain should be able to change stubDomain configuration [Slow] [Serial]" classname="Kubernetes e2e suite" status="failed" time="130">
      <failure message="dig result did not match: []string{} after 2m0s" type="failed">[FAILED] dig result did not match: []string{} after 2m0s
In [It] at: dns_common.go:108</failure>
    </testcase>
    <testcase name="[sig-network] DNS should provide DNS for the cluster [Provider:GCE]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped - Only supported for providers [gce gke] (not local)"></skipped>
    </testcase>
    <testcase name="[sig-storage] CSI Volumes something" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

var focus = regexp.MustCompile(`\[sig-network\] DNS|\[sig-network\] Services .*ExternalName`)

func TestParseJUnitKeepsTheFocusedSpecs(t *testing.T) {
	specs, err := ParseJUnit(strings.NewReader(junit), focus)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 3 {
		t.Fatalf("got %d specs, want the 3 the focus matches: %v", len(specs), specs)
	}
	pass := specs["[sig-network] DNS should provide DNS for the cluster [Conformance]"]
	if pass.Status != "passed" || pass.Seconds != 12.25 {
		t.Errorf("passed spec: %+v", pass)
	}
	fail := specs["[sig-network] DNS configMap nameserver Change stubDomain should be able to change stubDomain configuration [Slow] [Serial]"]
	if fail.Status != "failed" || !strings.Contains(fail.Message, "dig result did not match") || !strings.Contains(fail.Message, "dns_common.go:108") {
		t.Errorf("failed spec: %+v", fail)
	}
	skip := specs["[sig-network] DNS should provide DNS for the cluster [Provider:GCE]"]
	if skip.Status != "skipped" || !strings.Contains(skip.Message, "Only supported for providers") {
		t.Errorf("skipped spec: %+v", skip)
	}
}

func TestParseJUnitRejectsGarbage(t *testing.T) {
	if _, err := ParseJUnit(strings.NewReader("<testsuites><testsuite>"), focus); err == nil {
		t.Fatal("a truncated report parsed")
	}
	dup := `<testsuites><testsuite><testcase name="[sig-network] DNS a" status="passed"/><testcase name="[sig-network] DNS a" status="failed"/></testsuite></testsuites>`
	if _, err := ParseJUnit(strings.NewReader(dup), focus); err == nil {
		t.Fatal("a spec reported twice was accepted")
	}
}

func run(name string, status map[string]string) Run {
	r := Run{Name: name, Specs: map[string]Spec{}, About: "about " + name}
	for n, s := range status {
		r.Specs[n] = Spec{Name: n, Status: s, Message: "because " + n}
	}
	return r
}

const (
	conf  = "[sig-network] DNS should provide DNS for services [Conformance]"
	other = "[sig-network] DNS should support configurable pod resolv.conf"
	both  = "[sig-network] DNS configMap nameserver should forward PTR records lookup to upstream nameserver [Slow] [Serial]"
)

func TestVerdict(t *testing.T) {
	stock := run("stock", map[string]string{conf: "passed", other: "passed", both: "failed"})
	for _, tc := range []struct {
		name string
		runs []Run
		want []string // substrings, one per reason
	}{
		{"all as the stock", []Run{run("ours", map[string]string{conf: "passed", other: "passed", both: "failed"}), stock}, nil},
		{"a conformance spec fails with ours", []Run{run("ours", map[string]string{conf: "failed", other: "passed", both: "failed"}), stock},
			[]string{"ours: [Conformance] spec failed: " + conf}},
		{"a conformance spec fails with autopath only, no stock run", []Run{run("ours", map[string]string{conf: "passed"}), run("autopath", map[string]string{conf: "failed"})},
			[]string{"autopath: [Conformance] spec failed"}},
		{"ours fails what the stock passes", []Run{run("ours", map[string]string{conf: "passed", other: "failed", both: "failed"}), stock},
			[]string{"ours: failed, passed with stock: " + other}},
		{"the stock failing alone is no failure", []Run{run("ours", map[string]string{conf: "passed", other: "passed", both: "passed"}),
			run("stock", map[string]string{conf: "failed", other: "failed", both: "failed"})}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Verdict(tc.runs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %d reasons %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("reason %d: %q, want %q in it", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestResultsTableAndEvidence(t *testing.T) {
	runs := []Run{
		run("ours", map[string]string{conf: "passed", both: "failed"}),
		run("stock", map[string]string{conf: "passed", both: "failed", other: "skipped"}),
	}
	out := Results(runs)
	for _, want := range []string{
		"| spec | ours | stock |",
		"| " + conf + " | pass (0 s) | pass (0 s) |",
		"| " + both + " | **FAIL** (0 s) | **FAIL** (0 s) |",
		"| " + other + " | not run | skipped |",
		"**Outcome: pass**",
		"#### ours, failed: " + both + "\n\n```\nbecause " + both + "\n```",
		"**stock**\n\n```\nabout stock\n```",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("results lack %q:\n%s", want, out)
		}
	}
	runs[0].Specs[conf] = Spec{Name: conf, Status: "failed", Message: "x"}
	if out := Results(runs); !strings.Contains(out, "**Outcome: fail**") {
		t.Errorf("a failed conformance spec, and the outcome is not fail:\n%s", out)
	}
}

func TestClipBoundsAndDefusesFences(t *testing.T) {
	long := strings.Repeat("a", maxMessage+500)
	got := clip(long)
	if !strings.HasPrefix(got, strings.Repeat("a", maxMessage)) || !strings.Contains(got, "500 bytes more") {
		t.Errorf("clip of %d bytes: %q...", len(long), got[:40])
	}
	if strings.Contains(clip("x ``` y"), "```") {
		t.Error("a fence in a message survives")
	}
}

func TestSpliceKeepsWhatPeopleWrote(t *testing.T) {
	doc := "# Title\n\nprose before\n\n" + beginMark + "\nold results\n" + endMark + "\n\nprose after\n"
	out, err := Splice([]byte(doc), "new results")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Title\n\nprose before\n\n" + beginMark + "\nnew results\n" + endMark + "\n\nprose after\n"
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	for _, bad := range []string{"no markers", endMark + beginMark, beginMark + " only"} {
		if _, err := Splice([]byte(bad), "x"); err == nil {
			t.Errorf("%q: spliced", bad)
		}
	}
}
