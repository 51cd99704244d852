// Command report turns the raw output of bench/run.sh (results.tsv, reps.tsv,
// rss.tsv, status.tsv and facts.env in one directory) into the bench's table: it
// prints it and writes RESULTS.md with nodelocaldns' ratio to each peer, each
// server's distance from the cost of just moving packets (the limit row), and
// the verdict on each target of issue 13 (issue 8's hit targets are kept as
// the "no regression" check, optionally against a baseline run).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Peers in table order. "ceiling" is the test upstream on the server core (a
// plain Go loop, UDP and TCP): about the most this client can measure.
// "limit" is bench/limit, a C responder with a canned answer, recvmmsg/
// sendmmsg batches over UDP and one read and one send per batch over TCP:
// the lower bound on CPU per query. "node-local-dns" is the real stock
// binary (k8s-dns-node-cache) on the same Corefile as the "coredns" row.
// "previous" is nodelocaldns built from an earlier commit (BENCH_PREVIOUS),
// with the same flags, in the same run: its ratio columns are this build's
// change.
var servers = []string{"nodelocaldns", "previous", "node-local-dns", "coredns", "unbound", "dnsmasq", "ceiling", "limit"}

// references are the rows that are no DNS server.
var references = map[string]bool{"ceiling": true, "limit": true}

var serverTitle = map[string]string{
	"nodelocaldns":   "nodelocaldns",
	"previous":       "previous",
	"node-local-dns": "node-local-dns",
	"coredns":        "CoreDNS",
	"unbound":        "Unbound",
	"dnsmasq":        "dnsmasq",
	"ceiling":        "ceiling",
	"limit":          "limit",
}

var workloads = []string{"hit1", "hit20", "nx1", "names10k", "unique", "uniqext", "tcphit"}

// missWorkloads are those where every query is a miss.
var missWorkloads = []string{"unique", "uniqext"}

// hitWorkloads are those served from the cache once warm.
var hitWorkloads = []string{"hit1", "hit20", "nx1", "names10k", "tcphit"}

var workloadTitle = map[string]string{
	"hit1":     "hit, one name",
	"hit20":    "hit, 20 names",
	"nx1":      "NXDOMAIN, one name",
	"names10k": "10k distinct names, repeated",
	"unique":   "cluster names, all misses (TCP to kube-dns)",
	"uniqext":  "external names, all misses (UDP to the node's resolvers)",
	"tcphit":   "hit, one name, TCP",
}

// Row is one server × workload measurement (a line of results.tsv). The
// fixed-rate figures are the medians over its repetitions (each column its
// own median), CPULost their sum.
type Row struct {
	QPS       float64
	Sent      float64
	Completed float64
	Lost      float64
	Upstream  float64 // queries the test upstream answered during the QPS run
	Rate      float64 // offered rate of the fixed-rate runs
	CPULost   float64
	CPUus     float64 // server CPU µs per query at Rate
	LatAvg    float64 // ms, at Rate
	LatP50    float64
	LatP99    float64
	Noise     float64 // % of the server's core used by other processes during the QPS run
	Reps      int     // fixed-rate runs behind the medians; 1 in files from before there were more
}

// Rep is one fixed-rate run (a line of reps.tsv).
type Rep struct {
	N           int     // 1, 2, ...: its place in time among the workload's reps
	CPUus       float64 // server CPU µs per query
	LatAvg      float64 // ms
	LatP50      float64
	LatP99      float64
	Lost        float64
	Noise       float64 // % of a core other work took during the run: the larger of the two below
	NoiseServer float64 // on the server core, all but the server
	NoiseClient float64 // on the client core, all but dnsperf and the upstream
	Completed   float64 // queries answered
	Forwarded   float64 // queries the test upstream answered meanwhile: Completed on a miss workload
}

// RSS is one server's memory (a line of rss.tsv), in kB.
type RSS struct {
	Start, K10, K100, Peak float64
}

// Data is everything one run produced.
type Data struct {
	Rows map[string]map[string]Row
	// Reps are every fixed-rate run of each server × workload, in rep
	// order; empty for a run from before reps.tsv.
	Reps   map[string]map[string][]Rep
	RSS    map[string]RSS
	Status map[string]string
	Facts  map[string]string
	// Base is an earlier run to compare with (-baseline), or nil.
	Base *Data
}

func main() {
	out := flag.String("out", "bench/out", "directory holding results.tsv, rss.tsv, status.tsv, facts.env")
	md := flag.String("md", "bench/RESULTS.md", "markdown file to write")
	png := flag.String("png", "results.png", "chart path to link from the markdown (relative to it)")
	profileDir := flag.String("profile-dir", "", "directory of `make profile`'s cpu-miss-tcp.top.txt and cpu-miss-udp.top.txt (default: beside -md)")
	baseline := flag.String("baseline", "", "results.tsv of an earlier run (e.g. main before a change) to check hit workloads for regressions")
	flag.Parse()

	d, err := load(*out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
	if *baseline != "" {
		if d.Base, err = loadResults(*baseline); err != nil {
			fmt.Fprintf(os.Stderr, "report: baseline: %v\n", err)
			os.Exit(1)
		}
	}
	if *profileDir == "" {
		*profileDir = filepath.Dir(*md)
	}
	profile := []string{filepath.Join(*profileDir, "cpu-miss-tcp.top.txt"), filepath.Join(*profileDir, "cpu-miss-udp.top.txt")}
	var table strings.Builder
	writeTables(&table, d)
	fmt.Print(table.String())

	var doc strings.Builder
	writeDoc(&doc, d, table.String(), *png, profile)
	if err := os.WriteFile(*md, []byte(doc.String()), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
}

func load(dir string) (*Data, error) {
	d := &Data{
		Rows:   map[string]map[string]Row{},
		Reps:   map[string]map[string][]Rep{},
		RSS:    map[string]RSS{},
		Status: map[string]string{},
		Facts:  map[string]string{},
	}
	if err := readResults(filepath.Join(dir, "results.tsv"), d); err != nil {
		return nil, err
	}
	if err := readReps(filepath.Join(dir, "reps.tsv"), d); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err := eachLine(filepath.Join(dir, "rss.tsv"), func(f []string) {
		if len(f) >= 5 {
			d.RSS[f[0]] = RSS{num(f[1]), num(f[2]), num(f[3]), num(f[4])}
		}
	}); err != nil {
		return nil, err
	}
	if err := eachLine(filepath.Join(dir, "status.tsv"), func(f []string) {
		if len(f) >= 3 {
			d.Status[f[0]] = f[2]
		}
	}); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "facts.env"))
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			d.Facts[k] = v
		}
	}
	return d, nil
}

// loadResults reads a results.tsv alone (a baseline run).
func loadResults(path string) (*Data, error) {
	d := &Data{Rows: map[string]map[string]Row{}}
	if err := readResults(path, d); err != nil {
		return nil, err
	}
	if len(d.Rows) == 0 {
		return nil, fmt.Errorf("%s: no measurements", path)
	}
	return d, nil
}

func readResults(path string, d *Data) error {
	return eachLine(path, func(f []string) {
		if len(f) < 14 {
			return
		}
		n := func(i int) float64 { return num(f[i]) }
		if d.Rows[f[0]] == nil {
			d.Rows[f[0]] = map[string]Row{}
		}
		r := Row{
			QPS: n(2), Sent: n(3), Completed: n(4), Lost: n(5), Upstream: n(6),
			Rate: n(7), CPULost: n(8), CPUus: n(9), LatAvg: n(10), LatP50: n(11), LatP99: n(12), Noise: n(13),
			Reps: 1, // files without the column had one fixed-rate run
		}
		if len(f) > 14 {
			r.Reps = int(n(14))
		}
		d.Rows[f[0]][f[1]] = r
	})
}

// readReps reads reps.tsv: server, workload, rep, CPU µs/query, avg, p50,
// p99, lost, other work % (the larger), on the server core, on the client
// core, answered, forwarded.
func readReps(path string, d *Data) error {
	return eachLine(path, func(f []string) {
		if len(f) < 13 {
			return
		}
		n := func(i int) float64 { return num(f[i]) }
		if d.Reps[f[0]] == nil {
			d.Reps[f[0]] = map[string][]Rep{}
		}
		d.Reps[f[0]][f[1]] = append(d.Reps[f[0]][f[1]], Rep{
			N: int(n(2)), CPUus: n(3), LatAvg: n(4), LatP50: n(5), LatP99: n(6), Lost: n(7),
			Noise: n(8), NoiseServer: n(9), NoiseClient: n(10), Completed: n(11), Forwarded: n(12),
		})
	})
}

func eachLine(path string, fn func([]string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if l := s.Text(); l != "" {
			fn(strings.Split(l, "\t"))
		}
	}
	return s.Err()
}

// num parses a measurement; -1 stands for "not measured".
func num(s string) float64 {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return -1
	}
	return v
}

func (d *Data) row(s, w string) (Row, bool) {
	r, ok := d.Rows[s][w]
	return r, ok && r.QPS >= 0
}

// measured lists the servers that appear in this run, in table order.
func (d *Data) measured() []string {
	var out []string
	for _, s := range servers {
		if _, ok := d.Status[s]; ok {
			out = append(out, s)
		}
	}
	return out
}

// ranWorkloads lists the workloads any server was measured on.
func (d *Data) ranWorkloads() []string {
	var out []string
	for _, wl := range workloads {
		for _, rows := range d.Rows {
			if _, ok := rows[wl]; ok {
				out = append(out, wl)
				break
			}
		}
	}
	return out
}

// cpuReps is how many fixed-rate runs each server had per workload (facts
// from before they were repeated have no cpu_reps: one).
func (d *Data) cpuReps() string {
	if n := d.Facts["cpu_reps"]; n != "" {
		return n
	}
	return "1"
}

func (d *Data) ok(s string) bool { return d.Status[s] == "ok" && len(d.Rows[s]) > 0 }

func fmtQPS(v float64) string {
	switch {
	case v < 0:
		return "n/a"
	case v < 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
}

// why says why a server has no numbers.
func (d *Data) why(s string) string {
	w := strings.TrimPrefix(d.Status[s], "n/a: ")
	if w == "ok" || w == "" {
		w = "no measurement"
	}
	return w
}

func fmtF(v float64, prec int) string {
	if v < 0 {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func fmtMiB(kb float64) string {
	if kb < 0 {
		return "n/a"
	}
	return strconv.FormatFloat(kb/1024, 'f', 1, 64)
}

func fmtRatio(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "×"
}

func ratio(a, b float64) float64 {
	if a < 0 || b <= 0 {
		return -1
	}
	return a / b
}

// writeTables writes the QPS overview, the full table, the distance from
// the limit, the ratios and RSS.
func writeTables(w io.Writer, d *Data) {
	ss := d.measured()
	defer writeLimit(w, d, ss)

	fmt.Fprintf(w, "### Queries per second (unlimited rate)\n\n| workload |")
	for _, s := range ss {
		fmt.Fprintf(w, " %s |", serverTitle[s])
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---:|", len(ss)))
	ran := d.ranWorkloads()
	for _, wl := range ran {
		fmt.Fprintf(w, "| %s |", workloadTitle[wl])
		for _, s := range ss {
			r, ok := d.row(s, wl)
			if !ok {
				fmt.Fprintf(w, " n/a |")
				continue
			}
			fmt.Fprintf(w, " %s |", fmtQPS(r.QPS))
		}
		fmt.Fprintln(w)
	}

	fmt.Fprintf(w, "\n### Every measurement\n\n")
	if n := d.cpuReps(); n != "1" {
		fmt.Fprintf(w, "QPS, lost, forwarded and other work: unlimited rate. CPU and latency: the median of %s runs at the fixed offered rate in the `rate` column "+
			"(each column its own median; every run under \"Every fixed-rate repetition\"); lost at rate: summed over them.\n\n", n)
	} else {
		fmt.Fprintf(w, "QPS, lost, forwarded and other work: unlimited rate. CPU and latency: the fixed offered rate in the `rate` column.\n\n")
	}
	fmt.Fprintf(w, "| workload | server | QPS | lost | forwarded | other work %% | rate | CPU µs/query | avg ms | p50 ms | p99 ms | lost at rate |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, wl := range ran {
		for _, s := range ss {
			r, ok := d.row(s, wl)
			if !ok {
				fmt.Fprintf(w, "| %s | %s | n/a | | | | | | | | | |\n", wl, serverTitle[s])
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				wl, serverTitle[s], fmtQPS(r.QPS), fmtF(r.Lost, 0), fmtF(r.Upstream, 0), fmtF(r.Noise, 0), fmtF(r.Rate, 0),
				fmtF(r.CPUus, 2), fmtF(r.LatAvg, 3), fmtF(r.LatP50, 3), fmtF(r.LatP99, 3), fmtF(r.CPULost, 0))
		}
	}

	for _, s := range ss {
		if !d.ok(s) {
			fmt.Fprintf(w, "\n%s: n/a: %s\n", serverTitle[s], d.why(s))
		}
	}

	var notes []string
	for _, wl := range hitWorkloads {
		for _, s := range ss {
			r, ok := d.row(s, wl)
			if ok && r.Completed > 0 && r.Upstream > 0.01*r.Completed {
				notes = append(notes, fmt.Sprintf("%s forwarded %.0f of %.0f queries (%.1f%%) on %s: its cache did not hold the working set.",
					serverTitle[s], r.Upstream, r.Completed, 100*r.Upstream/r.Completed, wl))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "\nMisses on a hit workload:\n\n")
		for _, n := range notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}

	if len(d.RSS) == 0 {
		fmt.Fprintf(w, "\n### Memory (RSS, MiB)\n\nnot measured in this run\n")
	} else {
		fmt.Fprintf(w, "\n### Memory (RSS, MiB)\n\n| server | at start | 10k names | 100k names | peak over all workloads |\n|---|---:|---:|---:|---:|\n")
	}
	for _, s := range ss {
		if references[s] || len(d.RSS) == 0 {
			continue
		}
		m, ok := d.RSS[s]
		if !ok {
			m = RSS{-1, -1, -1, -1}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", serverTitle[s], fmtMiB(m.Start), fmtMiB(m.K10), fmtMiB(m.K100), fmtMiB(m.Peak))
	}

	fmt.Fprintf(w, "\n### nodelocaldns ÷ peer\n\n")
	if !d.ok("nodelocaldns") {
		fmt.Fprintf(w, "nodelocaldns was not measured: %s\n", d.why("nodelocaldns"))
		return
	}
	fmt.Fprintf(w, "QPS: above 1 is better. CPU/query: below 1 is better.\n\n| workload |")
	var peers []string
	for _, s := range ss {
		if s != "nodelocaldns" && !references[s] {
			peers = append(peers, s)
		}
	}
	for _, p := range peers {
		fmt.Fprintf(w, " QPS ÷ %s | CPU ÷ %s |", serverTitle[p], serverTitle[p])
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---:|", 2*len(peers)))
	for _, wl := range workloads {
		n, ok := d.row("nodelocaldns", wl)
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| %s |", wl)
		for _, p := range peers {
			r, ok := d.row(p, wl)
			if !ok {
				fmt.Fprintf(w, " n/a | n/a |")
				continue
			}
			fmt.Fprintf(w, " %s | %s |", fmtRatio(ratio(n.QPS, r.QPS)), fmtRatio(ratio(n.CPUus, r.CPUus)))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "| RSS, 100k names |")
	for _, p := range peers {
		fmt.Fprintf(w, " %s | |", fmtRatio(ratio(d.RSS["nodelocaldns"].K100, d.RSS[p].K100)))
	}
	fmt.Fprintln(w)
}

// writeLimit writes each server's CPU per query as a multiple of the limit
// responder's on the same workload at the same rate: how far it is from the
// cost of just moving the client's packets.
func writeLimit(w io.Writer, d *Data, ss []string) {
	if !d.ok("limit") {
		return
	}
	var cols []string
	for _, s := range ss {
		if s != "limit" {
			cols = append(cols, s)
		}
	}
	fmt.Fprintf(w, "\n### CPU per query ÷ the limit's\n\n")
	fmt.Fprintf(w, "The `limit` row answers from a canned record with recvmmsg/sendmmsg batches over UDP and one read and one send per ready connection over TCP: what moving the client's packets costs. ")
	fmt.Fprintf(w, "A miss also moves a query and an answer upstream, so 2× the limit is about the floor there.\n\n| workload | limit µs |")
	for _, s := range cols {
		fmt.Fprintf(w, " %s |", serverTitle[s])
	}
	fmt.Fprintf(w, "\n|---|---:|%s\n", strings.Repeat("---:|", len(cols)))
	for _, wl := range workloads {
		l, ok := d.row("limit", wl)
		if !ok || l.CPUus <= 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %s |", wl, fmtF(l.CPUus, 2))
		for _, s := range cols {
			r, ok := d.row(s, wl)
			if !ok {
				fmt.Fprintf(w, " n/a |")
				continue
			}
			fmt.Fprintf(w, " %s |", fmtRatio(ratio(r.CPUus, l.CPUus)))
		}
		fmt.Fprintln(w)
	}
}

// Verdict is one line of the targets list.
type Verdict struct {
	Target string
	Met    int // 1 met, 0 not met, -1 not measured
	Detail string
}

// clientBound: within 5% of the canned-answer responder, the client is the
// limit and QPS differences within that band are noise.
const clientBand = 0.95

func (d *Data) clientBound(s, wl string) bool {
	r, ok := d.row(s, wl)
	if !ok {
		return false
	}
	best := d.refQPS(wl)
	return best > 0 && r.QPS >= clientBand*best
}

// refQPS is the most the client was measured to send on wl: the higher of
// the two references' QPS (one measured while other work took the core
// says nothing), or -1.
func (d *Data) refQPS(wl string) float64 {
	best := -1.0
	for _, ref := range []string{"ceiling", "limit"} {
		if c, cok := d.row(ref, wl); cok && c.Noise <= maxNoise && c.QPS > best {
			best = c.QPS
		}
	}
	return best
}

// maxNoise is the share of the server core (%) that other work may take
// before a run is measured again (bench/run.sh) or a ceiling is not trusted.
const maxNoise = 10

func pct(r float64) string {
	return fmt.Sprintf("%+.0f%%", (r-1)*100)
}

// regressionBand: a ratio to Unbound (or CoreDNS) more than 5% worse than
// the baseline run's is a regression; less is within this machine's noise.
const regressionBand = 0.05

func (d *Data) verdicts() []Verdict {
	var vs []Verdict
	add := func(target string, met int, detail string) { vs = append(vs, Verdict{target, met, detail}) }
	nld := d.ok("nodelocaldns")

	// Issue 13: both miss paths at Unbound's cost, latency and rate.
	for _, wl := range missWorkloads {
		n, nok := d.row("nodelocaldns", wl)
		u, uok := d.row("unbound", wl)
		measured := nld && nok && uok
		name := "misses, " + workloadTitle[wl]
		at := ""
		if measured && n.Rate > 0 {
			at = fmt.Sprintf(" at %.0f qps", n.Rate)
		}
		// Lower is better for CPU and latency. The figures are medians
		// over the fixed-rate runs; each run's follows, in time order.
		lower := func(target, unit string, prec int, nv, uv float64, field func(Rep) float64) {
			reps := ""
			if ns, us := d.spread("nodelocaldns", wl, prec, field), d.spread("unbound", wl, prec, field); ns != "" && us != "" {
				reps = "; reps " + ns + " vs " + us
			}
			switch {
			case !measured || nv < 0 || uv <= 0:
				add(target, -1, "not measured")
			case nv <= uv:
				add(target, 1, fmt.Sprintf("%s vs %s %s (%s)%s", fmtF(nv, prec), fmtF(uv, prec), unit, pct(nv/uv), reps))
			default:
				add(target, 0, fmt.Sprintf("%s vs %s %s: over by %s%s", fmtF(nv, prec), fmtF(uv, prec), unit, pct(nv/uv), reps))
			}
		}
		lower(name+": CPU/query ≤ Unbound's", "µs", 2, n.CPUus, u.CPUus, func(r Rep) float64 { return r.CPUus })
		lower(name+": p50"+at+" ≤ Unbound's", "ms", 3, n.LatP50, u.LatP50, func(r Rep) float64 { return r.LatP50 })
		lower(name+": p99"+at+" ≤ Unbound's", "ms", 3, n.LatP99, u.LatP99, func(r Rep) float64 { return r.LatP99 })
		t := name + ": QPS ≥ Unbound's"
		switch {
		case !measured:
			add(t, -1, "not measured")
		case n.QPS >= u.QPS:
			add(t, 1, fmt.Sprintf("%s vs %s (%s)", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(ratio(n.QPS, u.QPS))))
		default:
			add(t, 0, fmt.Sprintf("%s vs %s: short by %s", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(ratio(n.QPS, u.QPS))))
		}
	}
	vs = append(vs, d.coreDNSVerdict("tcphit", "TCP hits"))
	vs = append(vs, d.noRegression())
	if _, ok := d.Status["previous"]; ok {
		vs = append(vs, d.previousVerdict())
	}
	vs = append(vs, d.stockVerdicts()...)
	{
		t := "RSS with 100k names ≤ Unbound's"
		n, nok := d.RSS["nodelocaldns"]
		u, uok := d.RSS["unbound"]
		switch {
		case !nld || !nok || !uok || n.K100 < 0 || u.K100 <= 0:
			add(t, -1, "not measured")
		case n.K100 <= u.K100:
			add(t, 1, fmt.Sprintf("%s vs %s MiB (%s)", fmtMiB(n.K100), fmtMiB(u.K100), pct(n.K100/u.K100)))
		default:
			add(t, 0, fmt.Sprintf("%s vs %s MiB: over by %s", fmtMiB(n.K100), fmtMiB(u.K100), pct(n.K100/u.K100)))
		}
	}
	{
		t := "no query lost in any workload"
		if !nld || len(d.Rows["nodelocaldns"]) == 0 {
			add(t, -1, "not measured")
		} else {
			var bad []string
			for _, wl := range d.ranWorkloads() {
				r, ok := d.row("nodelocaldns", wl)
				if !ok {
					bad = append(bad, wl+": not measured")
					continue
				}
				if r.Lost != 0 || r.CPULost > 0 {
					bad = append(bad, fmt.Sprintf("%s: %.0f lost at full rate, %.0f at fixed rate", wl, r.Lost, r.CPULost))
				}
			}
			if len(bad) == 0 {
				add(t, 1, "0 lost")
			} else {
				add(t, 0, strings.Join(bad, "; "))
			}
		}
	}
	return vs
}

// stockVerdicts states nodelocaldns against the real stock node-local-dns
// (the "node-local-dns" row) on every workload run and in memory: met when
// its QPS is at least the stock's (or both are client-bound) and its CPU
// per query at most the stock's; the detail gives both, and p99.
func (d *Data) stockVerdicts() []Verdict {
	const stock = "node-local-dns"
	var vs []Verdict
	for _, wl := range d.ranWorkloads() {
		t := workloadTitle[wl] + ": QPS ≥ and CPU/query ≤ the stock node-local-dns's"
		n, nok := d.row("nodelocaldns", wl)
		c, cok := d.row(stock, wl)
		if !d.ok("nodelocaldns") || !d.ok(stock) || !nok || !cok {
			why := "not measured"
			if !d.ok(stock) {
				why += ": " + d.why(stock)
			}
			vs = append(vs, Verdict{t, -1, why})
			continue
		}
		detail := fmt.Sprintf("QPS %s vs %s (%s), CPU %s vs %s µs/query (%s), p99 %s vs %s ms",
			fmtQPS(n.QPS), fmtQPS(c.QPS), fmtRatio(ratio(n.QPS, c.QPS)),
			fmtF(n.CPUus, 2), fmtF(c.CPUus, 2), fmtRatio(ratio(n.CPUus, c.CPUus)),
			fmtF(n.LatP99, 3), fmtF(c.LatP99, 3))
		qpsOK := n.QPS >= c.QPS || (ratio(n.QPS, c.QPS) >= clientBand && d.clientBound("nodelocaldns", wl) && d.clientBound(stock, wl))
		cpuOK := n.CPUus >= 0 && c.CPUus > 0 && n.CPUus <= c.CPUus
		met := 0
		if qpsOK && cpuOK {
			met = 1
		}
		vs = append(vs, Verdict{t, met, detail})
	}
	t := "RSS with 100k names ≤ the stock node-local-dns's"
	n, nok := d.RSS["nodelocaldns"]
	c, cok := d.RSS[stock]
	switch {
	case !d.ok("nodelocaldns") || !d.ok(stock) || !nok || !cok || n.K100 < 0 || c.K100 <= 0:
		vs = append(vs, Verdict{t, -1, "not measured"})
	case n.K100 <= c.K100:
		vs = append(vs, Verdict{t, 1, fmt.Sprintf("%s vs %s MiB (%s)", fmtMiB(n.K100), fmtMiB(c.K100), pct(n.K100/c.K100))})
	default:
		vs = append(vs, Verdict{t, 0, fmt.Sprintf("%s vs %s MiB: over by %s", fmtMiB(n.K100), fmtMiB(c.K100), pct(n.K100/c.K100))})
	}
	return vs
}

// spread is one figure of every fixed-rate run of s on wl, in rep order,
// joined by "/" ("" when there was at most one): how far the runs behind a
// median scatter.
func (d *Data) spread(s, wl string, prec int, field func(Rep) float64) string {
	reps := d.Reps[s][wl]
	if len(reps) < 2 {
		return ""
	}
	vs := make([]string, len(reps))
	for i, r := range reps {
		vs[i] = fmtSig(field(r), prec)
	}
	return strings.Join(vs, "/")
}

// fmtSig formats v with three significant digits, at most prec decimals
// (those the figure was measured with): short enough to list several.
func fmtSig(v float64, prec int) string {
	if v < 0 {
		return "n/a"
	}
	dec := prec
	if v > 0 {
		dec = min(prec, max(0, 2-int(math.Floor(math.Log10(v)))))
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// coreDNSVerdict: nodelocaldns answers wl at 3× CoreDNS's rate, or, when the
// client is the limit, at a third of its CPU per query.
func (d *Data) coreDNSVerdict(wl, what string) Verdict {
	t := what + " (" + workloadTitle[wl] + ") ≥ 3× CoreDNS"
	n, nok := d.row("nodelocaldns", wl)
	c, cok := d.row("coredns", wl)
	if !d.ok("nodelocaldns") || !nok || !cok {
		return Verdict{t, -1, "not measured"}
	}
	r := ratio(n.QPS, c.QPS)
	cpu := ratio(c.CPUus, n.CPUus) // how many times cheaper per query
	switch {
	case r >= 3:
		return Verdict{t, 1, fmt.Sprintf("%.2f× QPS", r)}
	case d.clientBound("nodelocaldns", wl) && cpu >= 3:
		return Verdict{t, 1, fmt.Sprintf("%.2f× QPS at the client's ceiling; %.2f× less CPU per query", r, cpu)}
	case d.clientBound("nodelocaldns", wl):
		return Verdict{t, 0, fmt.Sprintf("%.2f× QPS (client-bound) and %.2f× less CPU per query: short of 3× by %.0f%%", r, cpu, (1-cpu/3)*100) + d.roomFor3x(wl, c)}
	}
	return Verdict{t, 0, fmt.Sprintf("%.2f× QPS: short of 3× by %.0f%% (%.2f× less CPU per query)", r, (1-r/3)*100, cpu) + d.roomFor3x(wl, c)}
}

// roomFor3x says, for a 3× CoreDNS target not met, whether the run's
// references leave room for it: 3× CoreDNS's QPS (c is CoreDNS's row)
// against the most the client was measured to send (the ceiling and limit
// rows), and a third of its CPU per query against the limit responder's,
// what moving the packets costs. When both are out of reach, no server can
// meet the target with this client and kernel. Empty without a reference
// row.
func (d *Data) roomFor3x(wl string, c Row) string {
	var parts []string
	qpsOut, cpuOut := false, false
	if best := d.refQPS(wl); best > 0 && c.QPS > 0 {
		if qpsOut = 3*c.QPS > best; qpsOut {
			parts = append(parts, fmt.Sprintf("3× CoreDNS's QPS is %s, past the most this client was measured to send (%s)", fmtQPS(3*c.QPS), fmtQPS(best)))
		}
	}
	if l, ok := d.row("limit", wl); ok && l.CPUus > 0 && c.CPUus > 0 {
		need := c.CPUus / 3
		if cpuOut = need < l.CPUus; cpuOut {
			parts = append(parts, fmt.Sprintf("a third of CoreDNS's CPU is %.2f µs per query, below the limit responder's %.2f (what moving the packets costs)", need, l.CPUus))
		} else {
			parts = append(parts, fmt.Sprintf("a third of CoreDNS's CPU is %.2f µs per query, above the limit responder's %.2f", need, l.CPUus))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	out := "; " + strings.Join(parts, "; ")
	if qpsOut && cpuOut {
		out += ": no server meets 3× here"
	}
	return out
}

// hitChecks checks issue 8's hit targets on wl and says what failed: QPS ≥
// Unbound's (or both client-bound) and CPU/query ≤ Unbound's on the UDP
// one-name and 20-name hits, ≥ 3× CoreDNS on every hit workload.
func (d *Data) hitChecks(wl string) (fails []string, measured bool) {
	n, nok := d.row("nodelocaldns", wl)
	if !nok {
		return nil, false
	}
	if wl != "tcphit" && wl != "names10k" {
		if u, ok := d.row("unbound", wl); ok {
			r := ratio(n.QPS, u.QPS)
			if r < 1 && !(r >= clientBand && d.clientBound("nodelocaldns", wl) && d.clientBound("unbound", wl)) {
				fails = append(fails, fmt.Sprintf("%s: QPS %s vs Unbound's %s", wl, fmtQPS(n.QPS), fmtQPS(u.QPS)))
			}
			if n.CPUus >= 0 && u.CPUus > 0 && n.CPUus > u.CPUus {
				fails = append(fails, fmt.Sprintf("%s: CPU %.2f vs Unbound's %.2f µs", wl, n.CPUus, u.CPUus))
			}
		}
	}
	if v := d.coreDNSVerdict(wl, "hits"); v.Met == 0 {
		fails = append(fails, wl+": "+v.Detail)
	}
	return fails, true
}

// previousBand is the least noise band of previousVerdict: 5%, as
// regressionBand.
const previousBand = 0.05

// previousVerdict: on every workload both ran, this build's CPU per query
// is within noise of the previous build's (the "previous" row, same run,
// same flags): at most its median plus the larger relative scatter of the
// two rows' fixed-rate runs ((max-min)/median), and at least previousBand.
func (d *Data) previousVerdict() Verdict {
	t := "CPU/query within noise of the previous build on every workload (same run)"
	if rev := d.Facts["previous"]; rev != "" {
		t = "CPU/query within noise of the previous build, " + rev + ", on every workload (same run)"
	}
	if !d.ok("nodelocaldns") || !d.ok("previous") {
		return Verdict{t, -1, "not measured: " + d.why("previous")}
	}
	met := 1
	var parts []string
	for _, wl := range d.ranWorkloads() {
		n, nok := d.row("nodelocaldns", wl)
		p, pok := d.row("previous", wl)
		if !nok || !pok || n.CPUus <= 0 || p.CPUus <= 0 {
			continue
		}
		band := max(previousBand, d.scatter("nodelocaldns", wl), d.scatter("previous", wl))
		r := n.CPUus / p.CPUus
		mark := ""
		if r > 1+band {
			met, mark = 0, " **over**"
		}
		parts = append(parts, fmt.Sprintf("%s %s (noise ±%.0f%%)%s", wl, fmtRatio(r), 100*band, mark))
	}
	if len(parts) == 0 {
		return Verdict{t, -1, "no workload measured on both"}
	}
	return Verdict{t, met, "CPU ÷ previous: " + strings.Join(parts, ", ")}
}

// scatter is the relative range of s's fixed-rate CPU per query on wl:
// (max-min)/median of its runs; 0 with fewer than two.
func (d *Data) scatter(s, wl string) float64 {
	reps := d.Reps[s][wl]
	r, ok := d.row(s, wl)
	if len(reps) < 2 || !ok || r.CPUus <= 0 {
		return 0
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range reps {
		if x.CPUus < 0 {
			continue
		}
		lo, hi = min(lo, x.CPUus), max(hi, x.CPUus)
	}
	if hi < lo {
		return 0
	}
	return (hi - lo) / r.CPUus
}

// noRegression: every hit workload still meets issue 8's targets and, with a
// baseline, its ratios to Unbound and CoreDNS are no more than
// regressionBand worse than the baseline's (ratios, not absolute numbers:
// the two runs need not share a machine or its load).
func (d *Data) noRegression() Verdict {
	t := "no regression on hit workloads"
	if !d.ok("nodelocaldns") {
		return Verdict{t, -1, "not measured"}
	}
	var fails, ran []string
	for _, wl := range hitWorkloads {
		f, ok := d.hitChecks(wl)
		if !ok {
			continue
		}
		ran = append(ran, wl)
		fails = append(fails, f...)
		if d.Base == nil {
			continue
		}
		n, _ := d.row("nodelocaldns", wl)
		bn, bok := d.Base.row("nodelocaldns", wl)
		if !bok {
			continue
		}
		for _, peer := range []string{"unbound", "coredns"} {
			p, pok := d.row(peer, wl)
			bp, bpok := d.Base.row(peer, wl)
			if !pok || !bpok {
				continue
			}
			if now, was := ratio(n.CPUus, p.CPUus), ratio(bn.CPUus, bp.CPUus); now > 0 && was > 0 && now > was*(1+regressionBand) {
				fails = append(fails, fmt.Sprintf("%s: CPU ÷ %s %.2f, baseline %.2f", wl, serverTitle[peer], now, was))
			}
			if now, was := ratio(n.QPS, p.QPS), ratio(bn.QPS, bp.QPS); now > 0 && was > 0 && now < was*(1-regressionBand) &&
				!(d.clientBound("nodelocaldns", wl) && d.clientBound(peer, wl)) {
				fails = append(fails, fmt.Sprintf("%s: QPS ÷ %s %.2f, baseline %.2f", wl, serverTitle[peer], now, was))
			}
		}
	}
	switch {
	case len(ran) == 0:
		return Verdict{t, -1, "not measured"}
	case len(fails) > 0:
		return Verdict{t, 0, strings.Join(fails, "; ")}
	case d.Base == nil:
		return Verdict{t, 1, "issue 8's targets still met on " + strings.Join(ran, ", ") + " (no -baseline run to compare ratios with)"}
	}
	return Verdict{t, 1, "issue 8's targets still met on " + strings.Join(ran, ", ") + "; ratios to Unbound and CoreDNS within 5% of the baseline's or better"}
}

func writeDoc(w io.Writer, d *Data, tables, png string, profiles []string) {
	f := d.Facts
	fmt.Fprintf(w, "# Bench results: nodelocaldns, the stock node-local-dns, CoreDNS, Unbound, dnsmasq\n\n")
	fmt.Fprintf(w, "Generated by `bench/run.sh` (`make bench`) on %s. Re-running overwrites this file.\n\n", f["date"])
	st := f["nodelocaldns_status"]
	if s, ok := d.Status["nodelocaldns"]; ok && st == "ok" {
		st = s
	}
	fmt.Fprintf(w, "nodelocaldns: %s.\n\n", statusLine(st))

	if f["quick"] == "1" {
		fmt.Fprintf(w, "**A smoke run (BENCH_QUICK=1): short runs, few workloads, no memory phase. Not a result.**\n\n")
	}
	fmt.Fprintf(w, "## Targets (issue 13; against the stock node-local-dns, issue 26)\n\n| target | verdict | detail |\n|---|---|---|\n")
	missed := 0
	for _, v := range d.verdicts() {
		verdict := map[int]string{1: "met", 0: "**not met**", -1: "not measured"}[v.Met]
		if v.Met == 0 {
			missed++
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", v.Target, verdict, v.Detail)
	}
	fmt.Fprintf(w, "\nA QPS within %.0f%% of the `ceiling` column is client-bound (dnsperf on one core cannot send faster);\n", (1-clientBand)*100)
	fmt.Fprintf(w, "there CPU time per query at a fixed offered rate is the measure that tells servers apart.\n\n")
	if missed > 0 {
		quoted := 0
		for _, profile := range profiles {
			top, err := os.ReadFile(profile)
			if err != nil {
				continue
			}
			quoted++
			when := ""
			if fi, err := os.Stat(profile); err == nil {
				when = fi.ModTime().UTC().Format("2006-01-02 15:04 UTC") + ", "
			}
			fmt.Fprintf(w, "Where the CPU goes (`make profile`, %s%s; the profile may predate this run's build):\n\n```\n%s```\n\n",
				when, filepath.Base(profile), topLines(string(top), 20))
		}
		if quoted == 0 {
			fmt.Fprintf(w, "Run `make profile` to see where the CPU goes on both miss paths (writes bench/cpu-miss-tcp.pprof, bench/cpu-miss-udp.pprof and their .top.txt, quoted here on the next run).\n\n")
		}
	}

	fmt.Fprintf(w, "## Results\n\n![QPS per workload and server](%s)\n\n%s\n", png, tables)
	writeReps(w, d)

	fmt.Fprintf(w, `## How it was measured

- Each server is a node-local cache in front of the same test upstream (`+"`bench/upstream`"+`):
  127.0.0.3:53 plays kube-dns (cluster.local, in-addr.arpa, ip6.arpa; reached over TCP by every server
  but dnsmasq, which cannot), 127.0.0.2:53 the node's resolvers (everything else, over UDP by every
  server: nodelocaldns and CoreDNS from a resolv.conf, Unbound's `+"`forward-zone: \".\"`"+`, dnsmasq's
  `+"`--server`"+`; each with its own defaults for source ports, which are part of its cost). The upstream answers any name: A/AAAA with TTL 30 s in cluster.local and 300 s
  elsewhere, NXDOMAIN (SOA minimum 30 s / 60 s) for names starting with `+"`nx`"+`.
- **node-local-dns**: the real stock binary (k8s-dns-node-cache with CoreDNS 1.13 inside, unpacked from
  `+"`../shared/oracles/node-cache.xz`"+` and checked against its sha256 at bench time, never in the
  repository) on the same Corefile as the CoreDNS row, with the DaemonSet's flags less what needs a node:
  `+"`-localip 127.0.0.1 -conf ... -setupinterface=false -setupiptables=false -skipteardown`"+`.
- **CoreDNS**: the stock node-local-dns Corefile (cluster/addons/dns/nodelocaldns in kubernetes),
  pillars filled in for loopback. **Unbound**: forwarding cache, iterator module only (no DNSSEC
  validation), one thread, TCP to kube-dns, incoming-num-tcp 64, default cache sizes.
  **dnsmasq**: `+"`--cache-size=10000`"+` (its historical maximum, about the stock 9984; larger is slower once full),
  `+"`--max-tcp-connections=64`"+` (the default 20 leaves 12 of the 32 TCP clients unserved), in the
  foreground with `+"`-k`"+` (it forks per TCP connection as in production). Its TCP children lose the
  pipelined queries still outstanding when a run ends (the `+"`lost`"+` in its TCP row).
  **nodelocaldns**: `+"`-localip 127.0.0.1 -kube-dns 127.0.0.3:53 -resolv-conf ... -setupinterface=false -setupiptables=false`"+`,
  cache defaults (the stock node-local-dns sizes and TTL caps).
  **ceiling**: the canned-answer upstream itself on the server core (a plain Go UDP loop, one
  goroutine, no cache, no batching): roughly what this client can measure; a server that batches
  its syscalls can pass it. **limit**: `+"`bench/limit/limit.c`"+`, a canned answer (ID and question
  copied, QR set, one A record appended): over UDP one thread with blocking recvmmsg/sendmmsg
  batches of 64, over TCP one epoll thread with one read of what has arrived and one send of
  all its answers per ready connection. The cost of just moving the client's packets, the lower
  bound of the CPU column (a miss moves twice the packets: about 2× the limit is its floor).
- CPU per query at a fixed rate counts every wake-up: at 20k qps a server sleeps between packets,
  so an event loop in C (Unbound, dnsmasq) pays less per query than a Go runtime (see the `+"`ceiling`"+` row,
  a bare Go UDP loop); at saturation the same servers batch and pay less.
- Servers on core 0 (`+"`taskset -c 0`"+`; Go servers get GOMAXPROCS=1 from the affinity), dnsperf and the
  upstream on core 1. All servers run at once (idle ones cost nothing) and each workload is measured
  on each server in turn, so a burst of other work hits one workload of all servers, not one server.
  dnsperf `+"`-c %s -q %s`"+`, unlimited rate for %s s per workload (hits warmed first).
- **CPU µs/query**: the server's scheduler time in ns (`+"`bench/cpuns`"+`: the process's CPU clock,
  i.e. /proc/PID/task/*/schedstat's time on CPU summed over its threads including those that exited,
  plus the processes it forked: live ones' clocks, reaped ones' cutime+cstime at tick resolution)
  across a %s s run at a fixed offered rate (%s qps for hits, %s qps for misses), divided by the
  answered queries.
  **avg/p50/p99 ms**: the per-query latencies dnsperf prints with `+"`-v`"+` in that same fixed-rate run
  (at unlimited rate latency is only queueing: about -q ÷ QPS).
- **Repetitions**: fixed-rate runs per server and workload: %s (`+"`BENCH_CPU_REPS`"+`), interleaved
  across servers: for each workload every server's unlimited-rate run, then rep 1 of every server,
  rep 2 of every server, and so on, each rep starting one server further along the list (so the slot
  right after the unlimited-rate runs is not always the same server's). A run that other work took
  more than 10%% of a core from (server's or client's) is run once more after the reps, one extra run
  per disturbed one, the servers interleaved again. The tables and targets use the median of each
  column separately over the quiet runs (all runs when none was quiet; CPU, avg, p50, p99; lost at
  rate is summed over all). Why: on this
  shared 2-core machine the p99 of the same binaries scatters by 2× between runs, for every server
  (Unbound included), and CPU per query by 10-20%%; slow queries come in bursts (2-10 ms of traffic
  every 100-300 ms at 10k qps) that hit whichever server is measured, some runs more than others,
  so one run per server made each comparison a coin flip. Interleaved, a stretch of frequent bursts
  hits one run of each server and the median leaves it out. Every run,
  with the other work on both cores during it, is under "Every fixed-rate repetition"; the
  unique-name workloads take fresh names in every run, so each is all misses.
- **forwarded**: queries the test upstream answered during the unlimited-rate run (cache misses,
  plus CoreDNS's health/loop probes).
- **other work %%**: CPU time of other processes during the unlimited-rate run, in %% of a core:
  on the server core everything but the server, on the client core everything but dnsperf and
  the upstream, plus the time the hypervisor gave to other machines (steal); the larger of the
  two (this machine is shared). An unlimited-rate run above 10%% is measured once
  more (unique names with a second set of names) and the quieter run kept; fixed-rate runs are
  repeated as said above, their other work is listed with them.
- **RSS**: VmRSS of a fresh process after 10k and then 100k distinct names (half cluster.local, half
  external, at unlimited rate); peak is VmHWM at the end of all workloads (after the unique-name run).
- Workloads: one name `+"`kubernetes.default.svc.cluster.local`"+`; 20 names (10 cluster.local, 10 external);
  NXDOMAIN `+"`nxdomain.default.svc.cluster.local`"+` (the denial TTL, 5 s in cluster.local, lets one
  miss through every 5 s); 10k names (5k cluster.local, 5k external); unique names in cluster.local,
  never repeated (`+"`unique`"+`, forwarded to kube-dns over TCP); unique external names
  `+"`uN.site-M.example.com`"+` over 997 sites, never repeated (`+"`uniqext`"+`, forwarded to the node's
  resolvers over UDP); TCP: one name over 32 TCP connections (`+"`-m tcp`"+`).
- Other work on the machine skews the numbers: load average %s before, %s after.

## Machine and versions

| | |
|---|---|
| date | %s |
| CPU | %s, %s cores, %s |
| OS | %s, %s |
| Go | %s |
| dnsperf | %s |
| node-local-dns | %s |
| CoreDNS | %s (`+"`go install github.com/coredns/coredns@v%s`"+`) |
| Unbound | %s |
| dnsmasq | %s |
| nodelocaldns | %s |
| run time | %s s |

Command: `+"`%s`"+`
`,
		f["clients"], f["outstanding"], f["duration"], f["cpu_duration"], f["cpu_rate"], f["miss_cpu_rate"], d.cpuReps(),
		f["load_before"], f["load_after"],
		f["date"], f["cpu"], f["cores"], f["memory"], f["os"], f["kernel"], f["go"], f["dnsperf"],
		orNA(f["node_local_dns"]), f["coredns"], f["coredns"], f["unbound"], f["dnsmasq"], f["nodelocaldns"], f["elapsed"], f["command"])
}

// writeReps writes the section listing every fixed-rate run (reps.tsv),
// with the other work on both cores during each: the spread behind the
// medians, and which runs a burst of other work disturbed.
func writeReps(w io.Writer, d *Data) {
	fmt.Fprintf(w, "## Every fixed-rate repetition\n\n")
	if len(d.Reps) == 0 {
		fmt.Fprintf(w, "none recorded in this run (no reps.tsv)\n\n")
		return
	}
	fmt.Fprintf(w, "Each server's fixed-rate runs, %s per workload, interleaved across servers (rep 1 of every server, then rep 2, ...): "+
		"the results above are the medians of the quiet ones (all when none was quiet); a rep past %[1]s is an extra run for a disturbed one. Forwarded: queries the test upstream answered during the run (on a miss workload, every answered one). Other work: %% of a core taken by other processes during the run, on the server core / "+
		"on the client core; above %d%% in bold.\n\n", d.cpuReps(), maxNoise)
	fmt.Fprintf(w, "| workload | server | rep | rate | CPU µs/query | avg ms | p50 ms | p99 ms | lost | answered | forwarded | other work %% |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, wl := range d.ranWorkloads() {
		for _, s := range servers {
			rate := "n/a"
			if r, ok := d.Rows[s][wl]; ok {
				rate = fmtF(r.Rate, 0)
			}
			for _, r := range d.Reps[s][wl] {
				noise := fmtF(r.NoiseServer, 0) + " / " + fmtF(r.NoiseClient, 0)
				if r.Noise > maxNoise {
					noise = "**" + noise + "**"
				}
				fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", wl, serverTitle[s], r.N, rate,
					fmtF(r.CPUus, 2), fmtF(r.LatAvg, 3), fmtF(r.LatP50, 3), fmtF(r.LatP99, 3), fmtF(r.Lost, 0),
					fmtF(r.Completed, 0), fmtF(r.Forwarded, 0), noise)
			}
		}
	}
	fmt.Fprintln(w)
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

func statusLine(s string) string {
	if s == "ok" {
		return "built from this work tree and measured"
	}
	return s
}

// topLines keeps the table of `go tool pprof -top` output: its header line
// and n entries, plus the line saying how much of the samples it covers.
func topLines(s string, n int) string {
	var b strings.Builder
	in := -1
	for _, l := range strings.SplitAfter(s, "\n") {
		switch {
		case strings.HasPrefix(l, "Workload:") || strings.HasPrefix(l, "Showing nodes") || strings.HasPrefix(l, "Duration:"):
			b.WriteString(l)
		case strings.Contains(l, "flat%") && strings.Contains(l, "cum%"):
			in = 0
			b.WriteString(l)
		case in >= 0 && in < n:
			in++
			b.WriteString(l)
		}
	}
	return b.String()
}
