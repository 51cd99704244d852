package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// row builds a results.tsv line: server, workload, qps, sent, completed, lost,
// forwarded, rate, lost at rate, CPU µs/query, avg, p50, p99, other work.
func row(server, wl, qps, cpu string) string {
	return strings.Join([]string{server, wl, qps, "1000", "1000", "0", "1", "20000", "0", cpu, "0.1", "0.05", "0.5", "0"}, "\t")
}

func writeRun(t *testing.T, results, status []string, rss string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"results.tsv": strings.Join(results, "\n") + "\n",
		"status.tsv":  strings.Join(status, "\n") + "\n",
		"rss.tsv":     rss,
		"facts.env":   "date=today\nnodelocaldns_status=ok\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func verdictOf(t *testing.T, vs []Verdict, target string) Verdict {
	t.Helper()
	for _, v := range vs {
		if v.Target == target {
			return v
		}
	}
	t.Fatalf("no verdict %q", target)
	return Verdict{}
}

// missRow is a results.tsv line for a miss workload at 10000 qps with the
// given QPS, CPU µs/query, p50 and p99 ms.
func missRow(server, wl, qps, cpu, p50, p99 string) string {
	return strings.Join([]string{server, wl, qps, "1000", "1000", "0", "1000", "10000", "0", cpu, "0.3", p50, p99, "0"}, "\t")
}

func TestVerdicts(t *testing.T) {
	status := []string{"nodelocaldns\tstatus\tok", "coredns\tstatus\tok", "unbound\tstatus\tok", "ceiling\tstatus\tok", "limit\tstatus\tok"}
	results := []string{
		// TCP misses: cheaper, faster at p50, slower at p99, more QPS.
		missRow("nodelocaldns", "unique", "71000", "39.5", "0.150", "0.600"),
		missRow("unbound", "unique", "69000", "40.4", "0.156", "0.470"),
		// UDP misses: dearer, slower at p50, equal p99, less QPS.
		missRow("nodelocaldns", "uniqext", "60000", "45", "0.200", "0.500"),
		missRow("unbound", "uniqext", "65000", "40", "0.150", "0.500"),
		// TCP hits: 2.9× CoreDNS, not client-bound (no ceiling row for TCP from limit).
		row("nodelocaldns", "tcphit", "145000", "7"),
		row("coredns", "tcphit", "50000", "30"),
		row("ceiling", "tcphit", "200000", "7"),
		// Hits: all issue 8 targets met.
		row("nodelocaldns", "hit1", "200000", "6"),
		row("unbound", "hit1", "199000", "7"),
		row("coredns", "hit1", "60000", "25"),
		row("limit", "hit1", "201000", "4"),
	}
	rss := "nodelocaldns\t10000\t20000\t30000\t31000\nunbound\t15000\t25000\t28000\t29000\n"
	d, err := load(writeRun(t, results, status, rss))
	if err != nil {
		t.Fatal(err)
	}
	vs := d.verdicts()
	tests := []struct {
		target string
		met    int
	}{
		{"misses, cluster names, all misses (TCP to kube-dns): CPU/query ≤ Unbound's", 1},
		{"misses, cluster names, all misses (TCP to kube-dns): p50 at 10000 qps ≤ Unbound's", 1},
		{"misses, cluster names, all misses (TCP to kube-dns): p99 at 10000 qps ≤ Unbound's", 0},
		{"misses, cluster names, all misses (TCP to kube-dns): QPS ≥ Unbound's", 1},
		{"misses, external names, all misses (UDP to the node's resolvers): CPU/query ≤ Unbound's", 0},
		{"misses, external names, all misses (UDP to the node's resolvers): p50 at 10000 qps ≤ Unbound's", 0},
		// Equal is met.
		{"misses, external names, all misses (UDP to the node's resolvers): p99 at 10000 qps ≤ Unbound's", 1},
		{"misses, external names, all misses (UDP to the node's resolvers): QPS ≥ Unbound's", 0},
		{"TCP hits (hit, one name, TCP) ≥ 3× CoreDNS", 0},
		// tcphit is short of 3× CoreDNS, so hits regressed from issue 8.
		{"no regression on hit workloads", 0},
		{"RSS with 100k names ≤ Unbound's", 0},
		{"no query lost in any workload", 1},
	}
	for _, tt := range tests {
		if v := verdictOf(t, vs, tt.target); v.Met != tt.met {
			t.Errorf("%s: met %d (%s), want %d", tt.target, v.Met, v.Detail, tt.met)
		}
	}
	if v := verdictOf(t, vs, "misses, external names, all misses (UDP to the node's resolvers): CPU/query ≤ Unbound's"); v.Detail != "45.00 vs 40.00 µs: over by +12%" {
		t.Errorf("detail %q", v.Detail)
	}
	var b strings.Builder
	writeTables(&b, d)
	// The limit table: nodelocaldns at 1.50× the limit's CPU on hit1.
	if !strings.Contains(b.String(), "| hit1 | 4.00 | 1.50× |") {
		t.Errorf("no limit ratio in the tables:\n%s", b.String())
	}
}

func TestClientBoundUsesLimit(t *testing.T) {
	status := []string{"nodelocaldns\tstatus\tok", "unbound\tstatus\tok", "limit\tstatus\tok"}
	results := []string{
		// 4% below Unbound, both within 5% of the limit's QPS: met.
		row("nodelocaldns", "hit1", "192000", "6"),
		row("unbound", "hit1", "200000", "7"),
		row("limit", "hit1", "201000", "4"),
	}
	d, err := load(writeRun(t, results, status, ""))
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := d.hitChecks("hit1"); !ok || len(f) != 0 {
		t.Errorf("hit1 checks: %v, %v; want none failed", f, ok)
	}
	d.Rows["limit"]["hit1"] = Row{QPS: 300000, CPUus: 4}
	if f, _ := d.hitChecks("hit1"); len(f) != 1 {
		t.Errorf("hit1 checks with a far limit: %v; want the QPS one failed", f)
	}
}

func TestRegressionAgainstBaseline(t *testing.T) {
	status := []string{"nodelocaldns\tstatus\tok", "unbound\tstatus\tok", "coredns\tstatus\tok"}
	results := []string{
		row("nodelocaldns", "hit1", "200000", "7"),
		row("unbound", "hit1", "190000", "7.5"),
		row("coredns", "hit1", "50000", "30"),
	}
	dir := writeRun(t, results, status, "")
	d, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v := d.noRegression(); v.Met != 1 {
		t.Errorf("no baseline: %d (%s), want met", v.Met, v.Detail)
	}
	// The baseline was 0.8× Unbound's CPU; now 0.93×: a regression, though
	// every issue 8 target is still met.
	base := filepath.Join(t.TempDir(), "base.tsv")
	body := strings.Join([]string{
		row("nodelocaldns", "hit1", "150000", "8"),
		row("unbound", "hit1", "140000", "10"),
		row("coredns", "hit1", "40000", "40"),
	}, "\n") + "\n"
	if err := os.WriteFile(base, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if d.Base, err = loadResults(base); err != nil {
		t.Fatal(err)
	}
	v := d.noRegression()
	if v.Met != 0 || !strings.Contains(v.Detail, "hit1: CPU ÷ Unbound 0.93, baseline 0.80") {
		t.Errorf("with baseline: %d (%s), want a CPU regression against Unbound", v.Met, v.Detail)
	}
	if _, err := loadResults(filepath.Join(t.TempDir(), "missing.tsv")); err == nil {
		t.Error("no error for a missing baseline")
	}
}

func TestNotMeasured(t *testing.T) {
	status := []string{"nodelocaldns\tstatus\tn/a: go build ./cmd/nodelocaldns failed: x", "unbound\tstatus\tok"}
	d, err := load(writeRun(t, []string{row("unbound", "hit1", "200000", "7")}, status, ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range d.verdicts() {
		if v.Met != -1 {
			t.Errorf("%s: met %d, want not measured", v.Target, v.Met)
		}
	}
	var b strings.Builder
	writeTables(&b, d)
	if !strings.Contains(b.String(), "nodelocaldns was not measured: go build ./cmd/nodelocaldns failed: x") {
		t.Errorf("tables do not say why nodelocaldns is missing:\n%s", b.String())
	}
}

func TestTopLines(t *testing.T) {
	in := "File: x\nDuration: 15s, Total samples = 10s\nShowing nodes accounting for 9s\n      flat  flat%   sum%        cum   cum%\n a\n b\n c\n"
	got := topLines(in, 2)
	want := "Duration: 15s, Total samples = 10s\nShowing nodes accounting for 9s\n      flat  flat%   sum%        cum   cum%\n a\n b\n"
	if got != want {
		t.Errorf("topLines:\n%q\nwant\n%q", got, want)
	}
}
