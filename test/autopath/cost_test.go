package autopath_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// patternServer is an upstream that answers by patterns (so every run of a
// name class gets names of its own, never cached) after a delay, and
// records the names it is asked.
type patternServer struct {
	delay time.Duration
	rules []rule
	mu    sync.Mutex
	seen  []string // "NAME TYPE"
}

type rule struct {
	re    *regexp.Regexp
	types map[uint16]string // type -> rdata; a type not listed is NODATA
}

func (p *patternServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	p.mu.Lock()
	p.seen = append(p.seen, strings.ToLower(q.Name)+" "+dns.TypeToString[q.Qtype])
	p.mu.Unlock()
	time.Sleep(p.delay)
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	soa, _ := dns.NewRR("example. 30 IN SOA ns.example. hostmaster.example. 1 7200 1800 86400 30")
	m.Rcode = dns.RcodeNameError
	for _, ru := range p.rules {
		if !ru.re.MatchString(strings.ToLower(q.Name)) {
			continue
		}
		m.Rcode = dns.RcodeSuccess
		if rd, ok := ru.types[q.Qtype]; ok {
			rr, _ := dns.NewRR(q.Name + " 30 IN " + dns.TypeToString[q.Qtype] + " " + rd)
			m.Answer = append(m.Answer, rr)
		}
		break
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{soa}
	}
	_ = w.WriteMsg(m)
}

// since returns the names asked after mark, and the new mark.
func (p *patternServer) since(mark int) ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seen[mark:]), len(p.seen)
}

// The classes of names the issue counts, each as the name the client looks
// up (N: a number of the run's own). The pod is in namespace shop; the
// node's search domain is corp.example.
var costClasses = []struct{ class, name string }{
	{"first candidate exists (a Service of the pod's namespace)", "svcN"},
	{"a later candidate exists (kube-dns: svc.ns)", "dbN.billing"},
	{"a later candidate exists (node: the node's search domain)", "intranetN"},
	{"only the name as asked exists (external)", "apiN.example.com"},
	{"nothing exists", "nxN.example.com"},
	{"NODATA in the middle", "midN.example"},
}

func costZones() (kube, node []rule) {
	a := func(re string, types map[uint16]string) rule { return rule{regexp.MustCompile(re), types} }
	kube = []rule{
		a(`^svc\d+\.shop\.svc\.cluster\.local\.$`, map[uint16]string{dns.TypeA: "10.96.0.10"}),
		a(`^db\d+\.billing\.svc\.cluster\.local\.$`, map[uint16]string{dns.TypeA: "10.96.0.11"}),
		a(`^mid\d+\.example\.cluster\.local\.$`, map[uint16]string{dns.TypeTXT: `"x"`}),
	}
	node = []rule{
		a(`^intranet\d+\.corp\.example\.$`, map[uint16]string{dns.TypeA: "10.1.1.1"}),
		a(`^api\d+\.example\.com\.$`, map[uint16]string{dns.TypeA: "192.0.2.1", dns.TypeAAAA: "2001:db8::1"}),
		a(`^mid\d+\.example\.$`, map[uint16]string{dns.TypeA: "192.0.2.7"}),
	}
	return kube, node
}

type costCell struct {
	client, kube, node   int // queries
	dur                  time.Duration
	out                  string
	kubeNames, nodeNames []string // normalised (run number as N)
}

var runNumber = regexp.MustCompile(`^([a-z]+)\d+`)

func normalise(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, runNumber.ReplaceAllString(n, "${1}N"))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// For every class of name, with glibc, musl and Go (AF_UNSPEC, the
// getaddrinfo default; and AF_INET) in a pod known to a real kube-apiserver,
// against the nodelocaldns binary without and with -autopath, kube-dns and
// the node's resolver as separate servers (1 ms and 5 ms away): upstream
// queries with autopath are never more than without, for each upstream, on
// the first and on the repeated lookup; the node's resolver is never asked
// a name it is not asked without autopath; every lookup ends the same way.
// It logs the table docs/autopath.md shows (NLD_COST_TABLE=FILE writes it;
// NLD_COST_BINARY=PATH measures another build).
func TestAutopathCostTable(t *testing.T) {
	clients := buildClients(t)
	need(t, "needs unshare (util-linux)", lookPath("unshare"))
	p, _ := setupPod(t)
	api := apiWithPod(t, "web", p.ip.String())

	dir := t.TempDir()
	bin := os.Getenv("NLD_COST_BINARY") // another build (an earlier commit's), for before-and-after figures
	if bin == "" {
		bin = filepath.Join(dir, "nodelocaldns")
		if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
	}
	kubeRules, nodeRules := costZones()
	kubeIP, nodeIP := testhost.Loopback(), testhost.Loopback()
	kube := &patternServer{delay: time.Millisecond, rules: kubeRules}
	node := &patternServer{delay: 5 * time.Millisecond, rules: nodeRules}
	startUpstreamHandler(t, kubeIP+":53", kube)
	startUpstreamHandler(t, nodeIP+":53", node)
	nodeResolv := filepath.Join(dir, "node.resolv.conf")
	if err := os.WriteFile(nodeResolv, []byte("nameserver "+nodeIP+"\nsearch corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"-localip", p.hostIP.String(), "-kube-dns", kubeIP, "-resolv-conf", nodeResolv, "-kubednscm", ""}
	creds := credentials(t, api, dir)

	const reps = 5
	families := []string{"unspec", "inet"}
	cnames := []string{"glibc", "musl", "go"}
	// cells[mode][client family class first|repeat] over reps runs.
	type key struct{ client, family, class, when string }
	cells := map[bool]map[key][]costCell{false: {}, true: {}}
	run := 0
	measure := func(on bool, d *daemon) {
		km, nm := len(kube.seen), len(node.seen)
		_, km = kube.since(km)
		_, nm = node.since(nm)
		for _, client := range cnames {
			for _, family := range families {
				for _, c := range costClasses {
					for range reps {
						run++
						name := strings.Replace(c.name, "N", fmt.Sprint(run), 1)
						for _, when := range []string{"first", "repeated"} {
							before := d.requests()
							start := time.Now()
							out := lookup(t, p, clients, client, name, family)
							dur := time.Since(start)
							var kn, nn []string
							kn, km = kube.since(km)
							nn, nm = node.since(nm)
							k := key{client, family, c.class, when}
							cells[on][k] = append(cells[on][k], costCell{
								client: int(d.requests() - before), kube: len(kn), node: len(nn), dur: dur,
								out: runNumber.ReplaceAllString(out, ""), kubeNames: normalise(kn), nodeNames: normalise(nn),
							})
						}
					}
				}
			}
		}
	}
	off := startDaemon(t, bin, nil, common...)
	measure(false, off)
	off.stop()
	on := startDaemon(t, bin, creds, append(common, "-autopath", "-node-name", "node1")...)
	on.waitFor(`^nodelocaldns_autopath_pod_watch_synced 1`, "synced")
	on.waitFor(`^nodelocaldns_autopath_pods 1`, "knowing the pod")
	measure(true, on)

	median := func(cs []costCell, f func(costCell) float64) float64 {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = f(c)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	var table []string
	table = append(table,
		"| class | client | family | lookup | client queries | kube-dns | node resolver | latency ms (median of 5) |",
		"|---|---|---|---|---|---|---|---|")
	for _, c := range costClasses {
		for _, client := range cnames {
			for _, family := range families {
				for _, when := range []string{"first", "repeated"} {
					k := key{client, family, c.class, when}
					wo, w := cells[false][k], cells[true][k]
					for i := range w {
						what := fmt.Sprintf("%s, %s %s, %s lookup", c.class, client, family, when)
						if w[i].kube > wo[i].kube || w[i].node > wo[i].node {
							t.Errorf("%s: upstream queries kube-dns %d, node %d with autopath; %d, %d without",
								what, w[i].kube, w[i].node, wo[i].kube, wo[i].node)
						}
						for _, n := range w[i].nodeNames {
							if !slices.Contains(wo[i].nodeNames, n) {
								t.Errorf("%s: the node's resolver was asked %s with autopath, never without (%q)", what, n, wo[i].nodeNames)
							}
						}
						for _, n := range w[i].kubeNames {
							if !slices.Contains(wo[i].kubeNames, n) {
								t.Errorf("%s: kube-dns was asked %s with autopath, never without (%q)", what, n, wo[i].kubeNames)
							}
						}
						if w[i].client > wo[i].client {
							t.Errorf("%s: %d client queries with autopath, %d without", what, w[i].client, wo[i].client)
						}
						if w[i].out != wo[i].out && !(strings.HasPrefix(w[i].out, "error") && strings.HasPrefix(wo[i].out, "error")) {
							t.Errorf("%s: %q with autopath, %q without", what, w[i].out, wo[i].out)
						}
					}
					cell := func(cs []costCell, f func(costCell) float64, format string) string {
						return fmt.Sprintf(format, median(cs, f))
					}
					q := func(c costCell) float64 { return float64(c.client) }
					kq := func(c costCell) float64 { return float64(c.kube) }
					nq := func(c costCell) float64 { return float64(c.node) }
					ms := func(c costCell) float64 { return float64(c.dur.Microseconds()) / 1000 }
					table = append(table, fmt.Sprintf("| %s | %s | %s | %s | %s → %s | %s → %s | %s → %s | %s → %s |",
						c.class, client, family, when,
						cell(wo, q, "%.0f"), cell(w, q, "%.0f"), cell(wo, kq, "%.0f"), cell(w, kq, "%.0f"),
						cell(wo, nq, "%.0f"), cell(w, nq, "%.0f"), cell(wo, ms, "%.1f"), cell(w, ms, "%.1f")))
				}
			}
		}
	}
	t.Log("without → with -autopath:\n" + strings.Join(table, "\n"))
	if f := os.Getenv("NLD_COST_TABLE"); f != "" {
		if err := os.WriteFile(f, []byte(strings.Join(table, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range strings.Split(on.scrape(), "\n") {
		if strings.HasPrefix(l, "nodelocaldns_autopath_") && !strings.HasSuffix(l, " 0") {
			t.Log(l)
		}
	}
}
