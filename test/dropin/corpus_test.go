package dropin

import (
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The pod-like namespace a corpus daemon runs in: eth0 (one end of a veth)
// with the pod's addresses, a default route over it to a second namespace
// where the stand-ins answer (kube-dns behind its upstream Service, a
// second kube-dns, the node's resolver, as corpusAnswer), loopback, and a
// nodelocaldns link for -setupinterface (this kernel has no dummy type: a
// veth of that name, as the e2e does). The stand-ins live in a namespace
// of their own so that a daemon's bind 0.0.0.0 does not hold their port.
const (
	podIPv4      = "10.244.0.7"
	podIPv6      = "fd00::7"
	podGateway   = "10.244.0.1"
	podGateway6  = "fd00::1"
	kubeDNSTwo   = "10.96.0.12" // a second kube-dns (kubespray's coredns_dual)
	kubeDNSClust = "10.96.0.10" // the kube-dns ClusterIP, -localip's second address in iptables mode
)

// probeAddrs are the addresses of the namespace a daemon may answer on.
// 127.0.0.2 is on no interface, but in lo's 127.0.0.0/8: a wildcard
// socket answers there.
// 169.254.25.10 is kubespray's link-local address, 169.254.20.25 the
// deliveryhero chart's, 169.254.20.11 the lablabs chart's.
var probeAddrs = []string{oracleLocal, "169.254.25.10", "169.254.20.25", "169.254.20.11", kubeDNSClust, "127.0.0.1", "127.0.0.2", "::1", podIPv4, podIPv6}

// The IPv6-only pod namespace (podNamespace6): an EKS IPv6 cluster's
// Service range fd00:10:96::/108 (kube-dns at ::a, its upstream Service at
// ::b, node-local-dns on ::ffaa as linz/topo-workflows derives it), the VPC
// resolver at AWS's IPv6 address fd00:ec2::bb, the pod on fd00::7/64.
const (
	kubeDNS6Upstream = "fd00:10:96::b"
	kubeDNS6Clust    = "fd00:10:96::a"
	local6           = "fd00:10:96::ffaa"
	nodeDNS6         = "fd00:ec2::bb"
)

// probeAddrs6 are the addresses of the IPv6-only namespace a daemon may
// answer on.
var probeAddrs6 = []string{local6, kubeDNS6Clust, "::1", podIPv6, "127.0.0.1"}

// env6 is the kubelet's environment in an IPv6 cluster.
var env6 = []string{"KUBE_DNS_UPSTREAM_SERVICE_HOST=" + kubeDNS6Upstream, "KUBE_DNS_SERVICE_HOST=" + kubeDNS6Clust, "KUBERNETES_SERVICE_HOST=fd00:10:96::1"}

// podNamespace6 is podNamespace without IPv4 but loopback's: eth0 has
// fd00::7/64 and the default route, the stand-ins answer on IPv6 addresses
// (kube-dns' upstream Service, the VPC resolver; the node's resolv.conf
// names the latter). The nodelocaldns link does no duplicate address
// detection (accept_dad 0), as the dummy link it stands for (NOARP), and
// holds the link-local addresses already (see below).
func podNamespace6(t *testing.T) string {
	t.Helper()
	ns, in := netns(t)
	up, inUp := netns(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("sysctl", "-qw", "net.ipv6.conf.nodelocaldns.accept_dad=0"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
	// The link-local addresses are there already, as after a restart with
	// -skipteardown: the stock adds an IPv6 address without NODAD, so it
	// is tentative until the kernel's DAD work runs (at once here, but
	// asynchronously), and its health listener, started right after,
	// sometimes lost that race under load ("listen tcp
	// [fd00:10:96::ffaa]:8080: bind: cannot assign requested address").
	// Ours adds them with NODAD. Both adopt addresses already there.
	for _, a := range []string{local6, kubeDNS6Clust} {
		mustRun(t, in("ip", "-6", "addr", "add", a+"/128", "dev", "nodelocaldns", "nodad"))
	}
	mustRun(t, in("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "gw0", "netns", up))
	mustRun(t, in("sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0"))
	mustRun(t, in("ip", "-6", "addr", "add", podIPv6+"/64", "dev", "eth0", "nodad"))
	mustRun(t, in("ip", "link", "set", "eth0", "up"))
	mustRun(t, inUp("ip", "-6", "addr", "add", podGateway6+"/64", "dev", "gw0", "nodad"))
	mustRun(t, inUp("ip", "link", "set", "gw0", "up"))
	mustRun(t, in("ip", "-6", "route", "add", "default", "via", podGateway6))
	standIns(t, up, inUp, kubeDNS6Upstream, nodeDNS6)
	return ns
}

// standIns serves corpusHandler on addrs (UDP and TCP port 53) in the
// stand-ins' namespace up.
func standIns(t *testing.T, up string, inUp func(args ...string) *exec.Cmd, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		if strings.Contains(a, ":") {
			mustRun(t, inUp("ip", "-6", "addr", "add", a+"/128", "dev", "lo", "nodad"))
		} else {
			mustRun(t, inUp("ip", "addr", "add", a+"/32", "dev", "lo"))
		}
		addr := net.JoinHostPort(a, "53")
		var pc net.PacketConn
		var l net.Listener
		err := inNetns(up, func() (err error) {
			if pc, err = net.ListenPacket("udp", addr); err != nil {
				return err
			}
			l, err = net.Listen("tcp", addr)
			return err
		})
		if err != nil {
			t.Fatalf("stand-in %s in %s: %v", addr, up, err)
		}
		for _, s := range []*dns.Server{{PacketConn: pc, Handler: corpusHandler}, {Listener: l, Handler: corpusHandler}} {
			go func() { _ = s.ActivateAndServe() }()
			t.Cleanup(func() { _ = s.Shutdown() })
		}
	}
}

// podNamespace makes the daemon's namespace and the stand-ins' one.
func podNamespace(t *testing.T) string {
	t.Helper()
	ns, in := netns(t)
	up, inUp := netns(t)
	mustRun(t, in("ip", "link", "add", "nodelocaldns", "type", "veth", "peer", "name", "nld-peer"))
	mustRun(t, in("ip", "link", "set", "nld-peer", "up"))
	mustRun(t, in("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "gw0", "netns", up))
	mustRun(t, in("ip", "addr", "add", podIPv4+"/24", "dev", "eth0"))
	mustRun(t, in("ip", "-6", "addr", "add", podIPv6+"/64", "dev", "eth0", "nodad"))
	// No duplicate address detection: eth0's IPv6 link-local address is
	// usable at once (a tentative one cannot be bound, by either binary).
	mustRun(t, in("sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0"))
	mustRun(t, in("ip", "link", "set", "eth0", "up"))
	mustRun(t, inUp("ip", "addr", "add", podGateway+"/24", "dev", "gw0"))
	mustRun(t, inUp("ip", "-6", "addr", "add", podGateway6+"/64", "dev", "gw0", "nodad"))
	mustRun(t, inUp("ip", "link", "set", "gw0", "up"))
	mustRun(t, in("ip", "route", "add", "default", "via", podGateway))
	mustRun(t, in("ip", "-6", "route", "add", "default", "via", podGateway6))
	standIns(t, up, inUp, oracleKubeDNS, kubeDNSTwo, oracleNodeDNS)
	return ns
}

// askAt asks the daemon in ns at addr:port over UDP, waiting at most
// timeout, from addr itself: the client address a log line or a whoami
// answer shows names the address asked (the kernel picks it anyway for an
// address of an interface, not for 127.0.0.2).
func askAt(ns, addr string, port int, name string, qtype uint16, timeout time.Duration) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: "udp", Timeout: timeout,
		Dialer: &net.Dialer{Timeout: timeout, LocalAddr: &net.UDPAddr{IP: net.ParseIP(addr)}}}
	var r *dns.Msg
	err := inNetns(ns, func() (err error) {
		r, _, err = c.Exchange(m, net.JoinHostPort(addr, fmt.Sprint(port)))
		return err
	})
	return r, err
}

// outcome is what one binary did with a configuration.
type outcome struct {
	started bool
	exit    string   // why it did not start: the last lines of its log
	addrs   []string // the probe addresses that answer
	replies map[string]reply
	logs    string
	run     *daemonRun // still running until the test ends
}

// corpusQ is one question of the corpus.
type corpusQ struct {
	name  string
	qtype uint16
}

// corpusQuestions are asked of both binaries on an address both answer on.
var corpusQuestions = []corpusQ{
	{"web.default.svc.cluster.local.", dns.TypeA},
	{"web.default.svc.cluster.local.", dns.TypeAAAA},
	{"nx.default.svc.cluster.local.", dns.TypeA},
	{"headless40.default.svc.cluster.local.", dns.TypeA},
	{"10.0.96.10.in-addr.arpa.", dns.TypePTR},
	{"www.example.org.", dns.TypeA},
	{"chain.example.org.", dns.TypeA},
	{"nx.example.org.", dns.TypeA},
	{routeProbe, dns.TypeTXT},
}

// run starts bin on c in a fresh namespace and reads what it does: whether
// it starts (answers on some probe address within 20 s, or exits), which
// probe addresses answer, and its replies to corpusQuestions (asked twice:
// the second time from its cache) on the first answering address.
func (c corpusCase) run(t *testing.T, bin string) outcome {
	t.Helper()
	ns, addrs, env := "", probeAddrs, []string(nil)
	if c.ipv6 {
		ns, addrs, env = podNamespace6(t), probeAddrs6, env6
	} else {
		ns = podNamespace(t)
	}
	etc := maps.Clone(c.etc)
	if etc == nil {
		etc = map[string]string{}
	}
	if c.ipv6 {
		etc["resolv.conf"] = "nameserver " + nodeDNS6 + "\n"
	}
	conf := "/etc/Corefile"
	if c.base != "" {
		etc["coredns/Corefile.base"] = c.base
	} else {
		etc["coredns/Corefile"] = c.conf
		conf = "/etc/coredns/Corefile"
	}
	args := slices.Clone(c.args)
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "CONF", conf)
	}
	d := startInEnv(t, ns, bin, etc, args, env)
	port := max(c.port, 53)
	probe := func(a string) bool {
		// A name of the node's resolver, whatever kube-dns does, and none
		// of corpusQuestions (their TTLs are compared). 700 ms: a cached
		// answer comes in microseconds, a miss through
		// the stand-ins in milliseconds; an address nobody serves is
		// dropped silently (the stand-ins' namespace does not route).
		_, err := askAt(ns, a, port, "probe.example.org.", dns.TypeA, 700*time.Millisecond)
		return err == nil
	}
	deadline := time.Now().Add(20 * time.Second)
	o := outcome{replies: map[string]reply{}, run: d}
	for !o.started {
		select {
		case <-d.done:
			o.exit = lastLines(d.logs.String(), 3)
			o.logs = d.logs.String()
			return o
		default:
		}
		for _, a := range addrs {
			if probe(a) {
				o.started = true
				break
			}
		}
		if time.Now().After(deadline) {
			o.exit = "answers on none of " + strings.Join(addrs, " ") + " within 20 s: " + lastLines(d.logs.String(), 3)
			o.logs = d.logs.String()
			return o
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // every listener up
	for _, a := range addrs {
		if probe(a) {
			o.addrs = append(o.addrs, a)
		}
	}
	for round := range 2 {
		for _, a := range o.addrs {
			for _, q := range append(slices.Clone(corpusQuestions), c.extra...) {
				key := fmt.Sprintf("round %d %s %s at %s", round, q.name, dns.TypeToString[q.qtype], a)
				r, err := askAt(ns, a, port, q.name, q.qtype, 3*time.Second)
				if err != nil {
					o.replies[key] = reply{rcode: "error: " + err.Error()}
					continue
				}
				o.replies[key] = readReply(r)
			}
		}
	}
	o.logs = d.logs.String()
	return o
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// corpusCase is one configuration a distribution or chart ships, written
// by us from its public source (cited), with the stand-ins' addresses: the
// kube-dns upstream Service at 10.96.0.11 (KUBE_DNS_UPSTREAM_SERVICE_HOST),
// the kube-dns ClusterIP 10.96.0.10, the node's resolver 10.150.0.53 in
// /etc/resolv.conf, the link-local address 169.254.20.10.
type corpusCase struct {
	name   string
	source string
	// base is a Corefile.base that node-cache renders (-conf /etc/Corefile,
	// args say CONF); conf a Corefile run as written (-conf CONF), when
	// base is "".
	base, conf string
	args       []string
	port       int // the DNS port probed (53 when 0)
	// extra are questions asked besides corpusQuestions.
	extra []corpusQ
	// Today's status, asserted: stockRefuses is in the stock's log when it
	// does not start; oursRefuses in ours, with needs the feature that
	// would make it start (the lead flips the case when it lands).
	stockRefuses, oursRefuses, needs string
	// addrDiff explains a known difference in listen addresses (asserted
	// as ours ⊆ the stock's); "" means the same addresses.
	addrDiff string
	// clusterRcode is today's known difference in answers: ours gives this
	// rcode (or "error: ..." prefix: no answer) to every question of the
	// cluster zones, where the stock answers (needs says what fixes it).
	clusterRcode string
	// stockMayTimeOut: the stock may not answer a cluster question within
	// the client's 3 s (why: this text); ours must answer every one, the
	// same as the stock where it answered. TTLs are not compared: the
	// stock's timeouts shift its clock.
	stockMayTimeOut string
	// etc are more files under /etc (paths relative to it): a ConfigMap
	// the distribution mounts beside the Corefile.
	etc map[string]string
	// ipv6 runs the case in the IPv6-only pod namespace (podNamespace6).
	ipv6 bool
}

// The distribution corpus: each configuration started with its own
// arguments by the stock node-cache and by nodelocaldns, each in a
// pod-like namespace with the same stand-ins: the same acceptance, the
// same listen addresses (of probeAddrs), the same answers to
// corpusQuestions (rcode and records; TTLs within a second), or today's
// known difference, asserted precisely.
func TestDistributionCorpus(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two daemons per configuration")
	}
	stock := stockBinary(t)
	ours := buildNodelocaldns(t)
	var table []string
	for _, c := range append(corpusCases(t), moreCorpusCases(t)...) {
		t.Run(c.name, func(t *testing.T) {
			so, oo := c.run(t, stock), c.run(t, ours)
			row := fmt.Sprintf("%-34s stock %-7s ours %-7s", c.name, verdict(so), verdict(oo))
			defer func() { table = append(table, row) }()
			switch {
			case c.stockRefuses != "":
				if so.started || !strings.Contains(so.logs, c.stockRefuses) {
					t.Errorf("stock: want a refusal with %q; started=%v: %s", c.stockRefuses, so.started, so.exit)
				}
			case !so.started:
				t.Fatalf("stock does not start: %s", so.exit)
			}
			if c.oursRefuses != "" {
				if oo.started || !strings.Contains(oo.logs, c.oursRefuses) {
					t.Errorf("ours: want today's refusal with %q (needs %s); started=%v: %s", c.oursRefuses, c.needs, oo.started, oo.exit)
				}
				if c.needs != "" {
					row += " needs: " + c.needs
				}
				return
			}
			if c.stockRefuses != "" {
				if oo.started {
					t.Errorf("ours starts a configuration the stock refuses")
				}
				return
			}
			if !oo.started {
				t.Fatalf("ours does not start: %s", oo.exit)
			}
			sameAddrs := slices.Equal(so.addrs, oo.addrs)
			if !sameAddrs && (c.addrDiff == "" || !subset(oo.addrs, so.addrs)) {
				t.Errorf("listen addresses: stock %v, ours %v", so.addrs, oo.addrs)
			}
			same, known, unasked := 0, 0, 0
			for k, s := range so.replies {
				o, ok := oo.replies[k]
				if !ok {
					unasked++ // an address ours does not answer on (addrDiff)
					continue
				}
				cluster := strings.Contains(k, ".cluster.local. ") || strings.Contains(k, ".in-addr.arpa. ")
				switch {
				case c.clusterRcode != "" && cluster:
					// Today's difference: ours gives clusterRcode every
					// time; the stock answers at least once (its policy
					// picks the dead server at random, and then its retry
					// may outlast the client's 3 s).
					if o.rcode != c.clusterRcode {
						t.Errorf("%s: ours %s, want today's %s", k, o.rcode, c.clusterRcode)
					}
					if s.rcode == "NOERROR" || s.rcode == "NXDOMAIN" {
						known++
					}
				case c.stockMayTimeOut != "" && cluster && s.rcode != "NOERROR" && s.rcode != "NXDOMAIN":
					if o.rcode != "NOERROR" && o.rcode != "NXDOMAIN" {
						t.Errorf("%s: ours %s %v, want an answer (the stock: %s)", k, o.rcode, o.rrs, s.rcode)
					}
					known++
				case s.rcode != o.rcode || s.tc != o.tc || strings.Join(s.rrs, "\n") != strings.Join(o.rrs, "\n"):
					t.Errorf("%s: stock %s %v, ours %s %v", k, s.rcode, s.rrs, o.rcode, o.rrs)
				case c.clusterRcode != "" || c.stockMayTimeOut != "":
					// The stock's timeouts on the cluster names shift its
					// clock: TTLs are not compared.
					same++
				case s.n > 0 && (int64(s.ttlSample)-int64(o.ttlSample) > 1 || int64(o.ttlSample)-int64(s.ttlSample) > 1):
					t.Errorf("%s: first TTL stock %d, ours %d", k, s.ttlSample, o.ttlSample)
				default:
					same++
				}
			}
			if c.clusterRcode != "" {
				if known == 0 {
					t.Errorf("the stock answered no cluster question: today's difference (it fails over, ours %s) not shown", c.clusterRcode)
				}
				row += fmt.Sprintf(" known difference: ours %s to every cluster question, the stock answered %d (needs %s);", c.clusterRcode, known, c.needs)
			}
			if c.stockMayTimeOut != "" && known > 0 {
				row += fmt.Sprintf(" the stock did not answer %d cluster questions within 3 s (%s), ours answered them;", known, c.stockMayTimeOut)
			}
			if c.clusterRcode == "" && c.stockMayTimeOut == "" && c.logs() {
				// The last answers' lines are written after them.
				time.Sleep(300 * time.Millisecond)
				common := map[string]bool{}
				for _, a := range oo.addrs {
					common[a] = slices.Contains(so.addrs, a)
				}
				sl, ol := corpusLogLines(so.run.logs.String(), common), corpusLogLines(oo.run.logs.String(), common)
				if !slices.Equal(sl, ol) {
					t.Errorf("query log lines differ:\nstock:\n%s\nours:\n%s", strings.Join(sl, "\n"), strings.Join(ol, "\n"))
				}
				if len(sl) == 0 {
					t.Errorf("the stock logged no query line")
				}
				row += fmt.Sprintf(" log lines %d/%d same;", len(ol), len(sl))
			}
			row += fmt.Sprintf(" answers %d/%d same, addresses %v", same, len(so.replies)-unasked, map[bool]string{true: "same " + strings.Join(oo.addrs, ","), false: "stock " + strings.Join(so.addrs, ",") + " ours " + strings.Join(oo.addrs, ",") + " (" + c.addrDiff + ")"}[sameAddrs])
		})
	}
	t.Logf("configuration → stock, ours, answers, addresses:\n%s", strings.Join(table, "\n"))
	if p := os.Getenv("NLD_CORPUS_TABLE"); p != "" {
		_ = os.WriteFile(filepath.Clean(p), []byte(strings.Join(table, "\n")+"\n"), 0o644)
	}
}

func verdict(o outcome) string {
	if o.started {
		return "starts"
	}
	return "refuses"
}

// logDirective is a log line of a Corefile or an imported file.
var logDirective = regexp.MustCompile(`(?m)^\s*log(\s|$)`)

// logs reports whether the case's configuration logs queries.
func (c corpusCase) logs() bool {
	if logDirective.MatchString(c.base + c.conf) {
		return true
	}
	for _, f := range c.etc {
		if logDirective.MatchString(f) {
			return true
		}
	}
	return false
}

var (
	// The JSON format's client port and query ID (linz/topo-workflows).
	logJSONPort = regexp.MustCompile(`"remotePort":\d+`)
	logJSONID   = regexp.MustCompile(`"queryId":"\d+"`)
	// A line's client address: the common format's first field, the JSON
	// format's remoteIp.
	logRemote     = regexp.MustCompile(`^\[INFO\] (\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]+\]):PORT `)
	logJSONRemote = regexp.MustCompile(`"remoteIp":"(\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]+\])"`)
)

// corpusLogLines are the query log lines of a corpus daemon's output,
// normalized as TestLogParityWithStockNodeCache does (client port, ID and
// duration masked, AA and RA apart) and sorted, without the probes and the
// loop plugin's HINFO, and only those asked from an address in common (the
// corpus asks each address from itself: a line of 127.0.0.2, which only a
// wildcard socket answers, is left out when the other binary does not
// answer there).
func corpusLogLines(out string, common map[string]bool) []string {
	var lines []string
	for _, l := range queryLines(out) {
		if strings.Contains(l, "probe.example.org.") || strings.Contains(l, "HINFO") {
			continue
		}
		l = logID.ReplaceAllString(l, " - ID \"")
		l = logJSONPort.ReplaceAllString(l, `"remotePort":PORT`)
		l = logJSONID.ReplaceAllString(l, `"queryId":"ID"`)
		m := logRemote.FindStringSubmatch(l)
		if m == nil {
			m = logJSONRemote.FindStringSubmatch(l)
		}
		if m == nil || !common[strings.Trim(m[1], "[]")] {
			continue
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return lines
}
