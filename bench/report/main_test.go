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

func TestVerdicts(t *testing.T) {
	status := []string{"nodelocaldns\tstatus\tok", "coredns\tstatus\tok", "unbound\tstatus\tok", "ceiling\tstatus\tok"}
	results := []string{
		row("nodelocaldns", "hit1", "200000", "6"),
		row("unbound", "hit1", "210000", "7"),
		row("coredns", "hit1", "60000", "25"),
		row("ceiling", "hit1", "205000", "10"),
		row("nodelocaldns", "hit20", "150000", "9"),
		row("unbound", "hit20", "160000", "8"),
		row("coredns", "hit20", "60000", "25"),
		row("ceiling", "hit20", "220000", "10"),
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
		// 5% below Unbound, but both within 5% of the ceiling: client-bound.
		{"cache hits (hit, one name): QPS ≥ Unbound's", 1},
		{"cache hits (hit, one name): CPU/query ≤ Unbound's", 1},
		{"cache hits (hit, 20 names): QPS ≥ Unbound's", 0},
		{"cache hits (hit, 20 names): CPU/query ≤ Unbound's", 0},
		{"cache hits (NXDOMAIN, one name): QPS ≥ Unbound's", -1},
		// 3.33× QPS.
		{"≥ 3× CoreDNS (hit, one name)", 1},
		// 2.5× QPS, not client-bound.
		{"≥ 3× CoreDNS (hit, 20 names)", 0},
		{"RSS with 100k names ≤ Unbound's", 0},
		{"no query lost in any workload", 1},
	}
	for _, tt := range tests {
		if v := verdictOf(t, vs, tt.target); v.Met != tt.met {
			t.Errorf("%s: met %d (%s), want %d", tt.target, v.Met, v.Detail, tt.met)
		}
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
