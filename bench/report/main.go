// Command report turns the raw output of bench/run.sh (results.tsv, rss.tsv,
// status.tsv and facts.env in one directory) into the bench's table: it
// prints it and writes RESULTS.md with nodelocaldns' ratio to each peer and
// the verdict on each target of issue 8.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Peers in table order; "ceiling" is the canned-answer responder (bench/upstream
// on the server core), the most this client can measure.
var servers = []string{"nodelocaldns", "coredns", "unbound", "dnsmasq", "ceiling"}

var serverTitle = map[string]string{
	"nodelocaldns": "nodelocaldns",
	"coredns":      "CoreDNS",
	"unbound":      "Unbound",
	"dnsmasq":      "dnsmasq",
	"ceiling":      "ceiling",
}

var workloads = []string{"hit1", "hit20", "nx1", "names10k", "unique", "tcphit"}

var workloadTitle = map[string]string{
	"hit1":     "hit, one name",
	"hit20":    "hit, 20 names",
	"nx1":      "NXDOMAIN, one name",
	"names10k": "10k distinct names, repeated",
	"unique":   "unique names, all misses (forwarded)",
	"tcphit":   "hit, one name, TCP",
}

// Row is one server × workload measurement (a line of results.tsv).
type Row struct {
	QPS       float64
	Sent      float64
	Completed float64
	Lost      float64
	Upstream  float64 // queries the test upstream answered during the QPS run
	Rate      float64 // offered rate of the fixed-rate run
	CPULost   float64
	CPUus     float64 // server CPU µs per query at Rate
	LatAvg    float64 // ms, at Rate
	LatP50    float64
	LatP99    float64
	Noise     float64 // % of the server's core used by other processes during the QPS run
}

// RSS is one server's memory (a line of rss.tsv), in kB.
type RSS struct {
	Start, K10, K100, Peak float64
}

// Data is everything one run produced.
type Data struct {
	Rows   map[string]map[string]Row
	RSS    map[string]RSS
	Status map[string]string
	Facts  map[string]string
}

func main() {
	out := flag.String("out", "bench/out", "directory holding results.tsv, rss.tsv, status.tsv, facts.env")
	md := flag.String("md", "bench/RESULTS.md", "markdown file to write")
	png := flag.String("png", "results.png", "chart path to link from the markdown (relative to it)")
	profile := flag.String("profile", "", "pprof -top output to quote (default: cpu.top.txt beside -md, when present)")
	flag.Parse()

	d, err := load(*out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
	if *profile == "" {
		*profile = filepath.Join(filepath.Dir(*md), "cpu.top.txt")
	}
	var table strings.Builder
	writeTables(&table, d)
	fmt.Print(table.String())

	var doc strings.Builder
	writeDoc(&doc, d, table.String(), *png, *profile)
	if err := os.WriteFile(*md, []byte(doc.String()), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
}

func load(dir string) (*Data, error) {
	d := &Data{
		Rows:   map[string]map[string]Row{},
		RSS:    map[string]RSS{},
		Status: map[string]string{},
		Facts:  map[string]string{},
	}
	if err := eachLine(filepath.Join(dir, "results.tsv"), func(f []string) {
		if len(f) < 14 {
			return
		}
		n := func(i int) float64 { return num(f[i]) }
		if d.Rows[f[0]] == nil {
			d.Rows[f[0]] = map[string]Row{}
		}
		d.Rows[f[0]][f[1]] = Row{
			QPS: n(2), Sent: n(3), Completed: n(4), Lost: n(5), Upstream: n(6),
			Rate: n(7), CPULost: n(8), CPUus: n(9), LatAvg: n(10), LatP50: n(11), LatP99: n(12), Noise: n(13),
		}
	}); err != nil {
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

// writeTables writes the QPS overview, the full table, the ratios and RSS.
func writeTables(w io.Writer, d *Data) {
	ss := d.measured()

	fmt.Fprintf(w, "### Queries per second (unlimited rate)\n\n| workload |")
	for _, s := range ss {
		fmt.Fprintf(w, " %s |", serverTitle[s])
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---:|", len(ss)))
	for _, wl := range workloads {
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
	fmt.Fprintf(w, "QPS, lost, forwarded and other work: unlimited rate. CPU and latency: the fixed offered rate in the `rate` column.\n\n")
	fmt.Fprintf(w, "| workload | server | QPS | lost | forwarded | other work %% | rate | CPU µs/query | avg ms | p50 ms | p99 ms | lost at rate |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, wl := range workloads {
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
	for _, wl := range workloads {
		if wl == "unique" {
			continue
		}
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

	fmt.Fprintf(w, "\n### Memory (RSS, MiB)\n\n| server | at start | 10k names | 100k names | peak over all workloads |\n|---|---:|---:|---:|---:|\n")
	for _, s := range ss {
		if s == "ceiling" {
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
		if s != "nodelocaldns" && s != "ceiling" {
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
	c, cok := d.row("ceiling", wl)
	// A ceiling measured while other work took the core says nothing.
	return ok && cok && c.Noise <= maxNoise && r.QPS >= clientBand*c.QPS
}

// maxNoise is the share of the server core (%) that other work may take
// before a run is measured again (bench/run.sh) or a ceiling is not trusted.
const maxNoise = 10

func pct(r float64) string {
	return fmt.Sprintf("%+.0f%%", (r-1)*100)
}

func (d *Data) verdicts() []Verdict {
	var vs []Verdict
	add := func(target string, met int, detail string) { vs = append(vs, Verdict{target, met, detail}) }
	nld := d.ok("nodelocaldns")

	for _, wl := range []string{"hit1", "hit20", "nx1"} {
		t := "cache hits (" + workloadTitle[wl] + "): QPS ≥ Unbound's"
		n, nok := d.row("nodelocaldns", wl)
		u, uok := d.row("unbound", wl)
		if !nld || !nok || !uok {
			add(t, -1, "not measured")
		} else {
			r := ratio(n.QPS, u.QPS)
			switch {
			case r >= 1:
				add(t, 1, fmt.Sprintf("%s vs %s (%s)", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(r)))
			case r >= clientBand && d.clientBound("nodelocaldns", wl) && d.clientBound("unbound", wl):
				add(t, 1, fmt.Sprintf("%s vs %s (%s): both at the client's ceiling, CPU/query decides", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(r)))
			default:
				add(t, 0, fmt.Sprintf("%s vs %s: short by %s (%.0f qps)", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(r), u.QPS-n.QPS))
			}
		}
		t = "cache hits (" + workloadTitle[wl] + "): CPU/query ≤ Unbound's"
		if !nld || !nok || !uok || n.CPUus < 0 || u.CPUus < 0 {
			add(t, -1, "not measured")
		} else if r := ratio(n.CPUus, u.CPUus); r <= 1 {
			add(t, 1, fmt.Sprintf("%.2f vs %.2f µs (%s)", n.CPUus, u.CPUus, pct(r)))
		} else {
			add(t, 0, fmt.Sprintf("%.2f vs %.2f µs: over by %s", n.CPUus, u.CPUus, pct(r)))
		}
	}
	for _, wl := range []string{"hit1", "hit20", "nx1", "names10k", "tcphit"} {
		t := "≥ 3× CoreDNS (" + workloadTitle[wl] + ")"
		n, nok := d.row("nodelocaldns", wl)
		c, cok := d.row("coredns", wl)
		if !nld || !nok || !cok {
			add(t, -1, "not measured")
			continue
		}
		r := ratio(n.QPS, c.QPS)
		cpu := ratio(c.CPUus, n.CPUus) // how many times cheaper per query
		switch {
		case r >= 3:
			add(t, 1, fmt.Sprintf("%.2f× QPS", r))
		case d.clientBound("nodelocaldns", wl) && cpu >= 3:
			add(t, 1, fmt.Sprintf("%.2f× QPS at the client's ceiling; %.2f× less CPU per query", r, cpu))
		case d.clientBound("nodelocaldns", wl):
			add(t, 0, fmt.Sprintf("%.2f× QPS (client-bound) and %.2f× less CPU per query: short of 3× by %.0f%%", r, cpu, (1-cpu/3)*100))
		default:
			add(t, 0, fmt.Sprintf("%.2f× QPS: short of 3× by %.0f%% (%.2f× less CPU per query)", r, (1-r/3)*100, cpu))
		}
	}
	{
		t := "unique-name misses: QPS ≥ Unbound's"
		n, nok := d.row("nodelocaldns", "unique")
		u, uok := d.row("unbound", "unique")
		switch {
		case !nld || !nok || !uok:
			add(t, -1, "not measured")
		case n.QPS >= u.QPS:
			add(t, 1, fmt.Sprintf("%s vs %s (%s)", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(ratio(n.QPS, u.QPS))))
		default:
			add(t, 0, fmt.Sprintf("%s vs %s: short by %s", fmtQPS(n.QPS), fmtQPS(u.QPS), pct(ratio(n.QPS, u.QPS))))
		}
	}
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

func writeDoc(w io.Writer, d *Data, tables, png, profile string) {
	f := d.Facts
	fmt.Fprintf(w, "# Bench results: nodelocaldns, CoreDNS, Unbound, dnsmasq\n\n")
	fmt.Fprintf(w, "Generated by `bench/run.sh` (`make bench`) on %s. Re-running overwrites this file.\n\n", f["date"])
	st := f["nodelocaldns_status"]
	if s, ok := d.Status["nodelocaldns"]; ok && st == "ok" {
		st = s
	}
	fmt.Fprintf(w, "nodelocaldns: %s.\n\n", statusLine(st))

	fmt.Fprintf(w, "## Targets (issue 8)\n\n| target | verdict | detail |\n|---|---|---|\n")
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
		if top, err := os.ReadFile(profile); err == nil {
			when := ""
			if fi, err := os.Stat(profile); err == nil {
				when = fi.ModTime().UTC().Format("2006-01-02 15:04 UTC") + ", "
			}
			fmt.Fprintf(w, "Where the CPU goes (`make profile`, %s%s; the profile may predate this run's build):\n\n```\n%s```\n\n",
				when, filepath.Base(profile), topLines(string(top), 20))
		} else {
			fmt.Fprintf(w, "Run `make profile` to see where the CPU goes (writes bench/cpu.pprof and bench/cpu.top.txt, quoted here on the next run).\n\n")
		}
	}

	fmt.Fprintf(w, "## Results\n\n![QPS per workload and server](%s)\n\n%s\n", png, tables)

	fmt.Fprintf(w, `## How it was measured

- Each server is a node-local cache in front of the same test upstream (`+"`bench/upstream`"+`):
  127.0.0.3:53 plays kube-dns (cluster.local, in-addr.arpa, ip6.arpa; reached over TCP by every server
  but dnsmasq, which cannot), 127.0.0.2:53 the node's resolvers (everything else, over UDP, named in
  a resolv.conf). The upstream answers any name: A/AAAA with TTL 30 s in cluster.local and 300 s
  elsewhere, NXDOMAIN (SOA minimum 30 s / 60 s) for names starting with `+"`nx`"+`.
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
  its syscalls can pass it.
- CPU per query at a fixed rate counts every wake-up: at 20k qps a server sleeps between packets,
  so an event loop in C (Unbound, dnsmasq) pays less per query than a Go runtime (see the `+"`ceiling`"+` row,
  a bare Go UDP loop); at saturation the same servers batch and pay less.
- Servers on core 0 (`+"`taskset -c 0`"+`; Go servers get GOMAXPROCS=1 from the affinity), dnsperf and the
  upstream on core 1. All servers run at once (idle ones cost nothing) and each workload is measured
  on each server in turn, so a burst of other work hits one workload of all servers, not one server.
  dnsperf `+"`-c %s -q %s`"+`, unlimited rate for %s s per workload (hits warmed first).
- **CPU µs/query**: utime+stime (+ reaped children) from /proc/PID/stat across a %s s run at a fixed
  offered rate (%s qps for hits, %s qps for misses) divided by the answered queries; 10 ms tick resolution.
  **avg/p50/p99 ms**: the per-query latencies dnsperf prints with `+"`-v`"+` in that same fixed-rate run
  (at unlimited rate latency is only queueing: about -q ÷ QPS).
- **forwarded**: queries the test upstream answered during the unlimited-rate run (cache misses,
  plus CoreDNS's health/loop probes).
- **other work %%**: CPU time of other processes during the unlimited-rate run, in %% of a core:
  on the server core everything but the server, on the client core everything but dnsperf and
  the upstream, plus the time the hypervisor gave to other machines (steal); the larger of the
  two (this machine is shared). A run above 10%% is measured once
  more (unique names with a second set of names) and the quieter run kept.
- **RSS**: VmRSS of a fresh process after 10k and then 100k distinct names (half cluster.local, half
  external, at unlimited rate); peak is VmHWM at the end of all workloads (after the unique-name run).
- Workloads: one name `+"`kubernetes.default.svc.cluster.local`"+`; 20 names (10 cluster.local, 10 external);
  NXDOMAIN `+"`nxdomain.default.svc.cluster.local`"+` (the denial TTL, 5 s in cluster.local, lets one
  miss through every 5 s); 10k names (5k cluster.local, 5k external); unique names in cluster.local,
  never repeated; TCP: one name over 32 TCP connections (`+"`-m tcp`"+`).
- Other work on the machine skews the numbers: load average %s before, %s after.

## Machine and versions

| | |
|---|---|
| date | %s |
| CPU | %s, %s cores, %s |
| OS | %s, %s |
| Go | %s |
| dnsperf | %s |
| CoreDNS | %s (`+"`go install github.com/coredns/coredns@v%s`"+`) |
| Unbound | %s |
| dnsmasq | %s |
| nodelocaldns | %s |
| run time | %s s |

Command: `+"`%s`"+`
`,
		f["clients"], f["outstanding"], f["duration"], f["cpu_duration"], f["cpu_rate"], f["miss_cpu_rate"],
		f["load_before"], f["load_after"],
		f["date"], f["cpu"], f["cores"], f["memory"], f["os"], f["kernel"], f["go"], f["dnsperf"],
		f["coredns"], f["coredns"], f["unbound"], f["dnsmasq"], f["nodelocaldns"], f["elapsed"], f["command"])
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
