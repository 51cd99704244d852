package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The alert rules (deploy/chart/files/*.rules.yaml, issue 39): valid for
// Prometheus, unit-tested with promtool (test/alerts: every alert seen
// firing and seen silent), on series the daemon has (docs/metrics.md), each
// with a runbook section in docs/runbook.md.

var ruleFiles = map[string]string{
	"nodelocaldns.rules.yaml":  "nodelocaldns.test.yaml",
	"coredns-names.rules.yaml": "coredns-names.test.yaml",
}

const runbookBase = "https://github.com/nodelocaldns/nodelocaldns/blob/main/docs/runbook.md#"

type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert       string
			Expr        string
			For         string
			Labels      map[string]string
			Annotations map[string]string
		}
	}
}

type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestAlertRulesPromtool: promtool check rules, and promtool test rules
// on the unit tests, which must see every alert both firing and silent.
func TestAlertRulesPromtool(t *testing.T) {
	promtool := need(t, "promtool")
	for rules, tests := range ruleFiles {
		rp := filepath.Join(chartPath, "files", rules)
		tp := filepath.Join(repoRoot, "test", "alerts", tests)
		if out, err := exec.Command(promtool, "check", "rules", rp).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", rules, err, out)
		}
		if out, err := exec.Command(promtool, "test", "rules", tp).CombinedOutput(); err != nil {
			t.Errorf("promtool test rules %s: %v\n%s", tests, err, out)
		}
		var rf ruleFile
		var rt ruleTests
		readYAML(t, rp, &rf)
		readYAML(t, tp, &rt)
		if len(rt.RuleFiles) != 1 || filepath.Base(rt.RuleFiles[0]) != rules {
			t.Errorf("%s tests %v, not %s", tests, rt.RuleFiles, rules)
		}
		firing, silent := map[string]bool{}, map[string]bool{}
		for _, tc := range rt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if !firing[r.Alert] || !silent[r.Alert] {
					t.Errorf("%s: %s is not seen firing (%v) and silent (%v) in %s", rules, r.Alert, firing[r.Alert], silent[r.Alert], tests)
				}
			}
		}
	}
}

// TestAlertRulesReadOurSeries: every alert names a severity, says what is
// wrong, links to its section of docs/runbook.md (which exists), and reads
// only series docs/metrics.md lists (ours, the CoreDNS names, process_*)
// or Prometheus's own up.
func TestAlertRulesReadOurSeries(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile(filepath.Join(repoRoot, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`\b(nodelocaldns_[a-z_]+|coredns_[a-z_]+|process_[a-z_]+|go_[a-z_]+)`)
	documented := map[string]bool{"up": true}
	for _, n := range name.FindAllString(string(doc), -1) {
		documented[n] = true
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (NodeLocalDNS[A-Za-z]+)$`).FindAllStringSubmatch(string(runbook), -1) {
		sections[strings.ToLower(m[1])] = true
	}
	for rules := range ruleFiles {
		var rf ruleFile
		readYAML(t, filepath.Join(chartPath, "files", rules), &rf)
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				switch r.Labels["severity"] {
				case "critical", "warning", "info":
				default:
					t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
				}
				if r.Annotations["summary"] == "" && r.Annotations["message"] == "" {
					t.Errorf("%s: no summary or message", r.Alert)
				}
				anchor := strings.ToLower(r.Alert)
				if r.Annotations["runbook_url"] != runbookBase+anchor {
					t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, r.Annotations["runbook_url"], runbookBase, anchor)
				}
				if !sections[anchor] {
					t.Errorf("%s: docs/runbook.md has no section \"## %s\"", r.Alert, r.Alert)
				}
				for _, n := range name.FindAllString(r.Expr, -1) {
					base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
					if !documented[base] {
						t.Errorf("%s reads %s, which docs/metrics.md does not list", r.Alert, n)
					}
				}
			}
		}
	}
}
