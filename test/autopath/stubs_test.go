// Package autopath_test runs real stub resolvers (glibc's and musl's
// getaddrinfo, Go's resolver) in a network namespace that stands for a pod, against a DNS
// server that answers with internal/autopath or without it, and checks that
// every lookup ends the same way with fewer queries. TestStubResolversAgreeWithAutopath
// puts internal/autopath in front of a small server in the test;
// TestStubResolversAgainstTheDaemon (daemon_test.go) runs the same table
// against the nodelocaldns binary with a real kube-apiserver.
package autopath_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodelocaldns/nodelocaldns/internal/autopath"
	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
	"github.com/nodelocaldns/nodelocaldns/internal/podwatch"
)

// zoneData: the cluster and the outside world the pod sees.
var zoneData = []string{
	"db.shop.svc.cluster.local. 30 IN A 10.96.0.10",
	"db.billing.svc.cluster.local. 30 IN A 10.96.0.11",
	"host.sub.billing.svc.cluster.local. 30 IN A 10.244.2.5",
	"api.example.com. 300 IN A 192.0.2.1",
	"api.example.com. 300 IN AAAA 2001:db8::1",
	"aonly.example.com. 300 IN A 192.0.2.2",
	"v6only.example.com. 300 IN AAAA 2001:db8::3",
	"a.b.c.d.e.f. 300 IN A 192.0.2.9",
	"intranet.corp.example. 300 IN A 10.1.1.1",
}

type zone map[string][]dns.RR

func newZone() zone {
	z := zone{}
	for _, s := range zoneData {
		rr, err := dns.NewRR(s)
		if err != nil {
			panic(err)
		}
		z[rr.Header().Name] = append(z[rr.Header().Name], rr)
	}
	return z
}

func (z zone) lookup(name string, qtype uint16) autopath.Result {
	soa, _ := dns.NewRR("example. 30 IN SOA ns.example. hostmaster.example. 1 7200 1800 86400 30")
	rrs, ok := z[strings.ToLower(name)]
	if !ok {
		return autopath.Result{Rcode: dns.RcodeNameError, Ns: []dns.RR{soa}, TTL: 30}
	}
	r := autopath.Result{Rcode: dns.RcodeSuccess, TTL: ^uint32(0)}
	for _, rr := range rrs {
		if rr.Header().Rrtype == qtype {
			r.Answer = append(r.Answer, dns.Copy(rr)) // the caller's own (autopath.Resolve)
			r.TTL = min(r.TTL, rr.Header().Ttl)
		}
	}
	if len(r.Answer) == 0 {
		r.Ns, r.TTL = []dns.RR{soa}, 30
	}
	return r
}

// staticPods is the pod view for the one pod of this test.
type staticPods map[netip.Addr]*podwatch.Pod

func (s staticPods) Lookup(ip netip.Addr) (*podwatch.Pod, podwatch.State) {
	return s[ip], kubewatch.Synced
}

func need(t *testing.T, what string, ok bool) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", what)
	}
	t.Skip(what)
}

func lookPath(name string) bool { _, err := exec.LookPath(name); return err == nil }

type server struct {
	ap      *autopath.Autopath
	z       zone
	on      atomic.Bool
	queries atomic.Int64
}

func (s *server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	s.queries.Add(1)
	q := r.Question[0]
	var m *dns.Msg
	if s.on.Load() {
		src := netip.MustParseAddrPort(w.RemoteAddr().String()).Addr()
		am, err := s.ap.Answer(context.Background(), src, q.Name, q.Qtype)
		if err != nil {
			return
		}
		m = am
	}
	if m == nil {
		res := s.z.lookup(q.Name, q.Qtype)
		m = &dns.Msg{Answer: res.Answer, Ns: res.Ns}
		m.Rcode = res.Rcode
	}
	m.SetRcode(r, m.Rcode)
	m.RecursionAvailable = true
	_ = w.WriteMsg(m)
}

// pod is a network namespace with a veth to the test's namespace, and the
// resolv.conf the kubelet writes for a ClusterFirst pod of namespace shop.
type pod struct {
	ns         string
	ip, hostIP netip.Addr
}

func setupPod(t *testing.T) (*pod, *podwatch.Pod) {
	t.Helper()
	reapStale(t)
	hostIP, podIP := freeSlash30(t)
	p := &pod{ns: fmt.Sprintf("nldap%d", os.Getpid()), hostIP: hostIP, ip: podIP}
	host, peer := fmt.Sprintf("nldaph%d", os.Getpid()), fmt.Sprintf("nldapp%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	run("ip", "netns", "add", p.ns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", host).Run()
		_ = exec.Command("ip", "netns", "del", p.ns).Run()
		_ = os.RemoveAll("/etc/netns/" + p.ns)
	})
	run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
	run("ip", "link", "set", peer, "netns", p.ns)
	run("ip", "addr", "add", p.hostIP.String()+"/30", "dev", host)
	run("ip", "link", "set", host, "up")
	run("ip", "netns", "exec", p.ns, "ip", "addr", "add", p.ip.String()+"/30", "dev", peer)
	run("ip", "netns", "exec", p.ns, "ip", "link", "set", peer, "up")
	run("ip", "netns", "exec", p.ns, "ip", "link", "set", "lo", "up")

	k8sPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec:       corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirst},
	}
	search, options := podwatch.PodResolvConf(k8sPod, podwatch.NodeResolvConf{Search: []string{"corp.example"}}, "cluster.local")
	rc := fmt.Sprintf("nameserver %s\nsearch %s\noptions %s\n", p.hostIP, strings.Join(search, " "), strings.Join(options, " "))
	// ip netns exec bind-mounts /etc/netns/NS/resolv.conf over /etc/resolv.conf.
	if err := os.MkdirAll("/etc/netns/"+p.ns, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/etc/netns/"+p.ns+"/resolv.conf", []byte(rc), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, &podwatch.Pod{Namespace: "shop", Name: "web", Search: search, Ndots: 5}
}

// reapStale deletes the pod namespaces (nldapPID) and host links (nldaphPID)
// that runs of this package killed before their cleanup left behind, those
// whose process is gone. A host link left up keeps its address and its
// route, and a later run given the same subnet would send the daemon's
// answers into the dead namespace.
func reapStale(t *testing.T) {
	t.Helper()
	gone := func(pid string) bool {
		n, err := strconv.Atoi(pid)
		return err == nil && n != os.Getpid() && errors.Is(syscall.Kill(n, 0), syscall.ESRCH)
	}
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if pid, ok := strings.CutPrefix(e.Name(), "nldap"); ok && gone(pid) {
				if out, err := exec.Command("ip", "netns", "del", e.Name()).CombinedOutput(); err != nil {
					t.Logf("stale namespace %s: %v: %s", e.Name(), err, out)
				}
				_ = os.RemoveAll("/etc/netns/" + e.Name())
			}
		}
	}
	links, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if pid, ok := strings.CutPrefix(l.Name, "nldaph"); ok && gone(pid) {
			if out, err := exec.Command("ip", "link", "del", l.Name).CombinedOutput(); err != nil {
				t.Logf("stale link %s: %v: %s", l.Name, err, out)
			}
		}
	}
}

// freeSlash30 picks a /30 in 198.18.0.0/15 (RFC 2544, benchmarking) that
// no address of this host overlaps, and returns its two hosts.
func freeSlash30(t *testing.T) (host, peer netip.Addr) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var used []netip.Prefix
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			used = append(used, p.Masked())
		}
	}
	p, ok := pickSlash30(used, rand.IntN)
	if !ok {
		t.Fatalf("no free /30 in 198.18.0.0/15 (host addresses %v)", used)
	}
	return p.Addr().Next(), p.Addr().Next().Next()
}

// pickSlash30 draws /30s of 198.18.0.0/15 with intn until one overlaps none
// of used (100 draws at most).
func pickSlash30(used []netip.Prefix, intn func(int) int) (netip.Prefix, bool) {
	for range 100 {
		n := intn(1 << 15) // 2^17 addresses, 4 each
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18 + byte(n>>14), byte(n >> 6), byte(n << 2)}), 30)
		if !slices.ContainsFunc(used, p.Overlaps) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// The pod's subnet is a /30 of the benchmarking range that overlaps no
// address of the host: a link an earlier run left with the same subnet
// would take the pod's route.
func TestPickSlash30(t *testing.T) {
	half := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16"), netip.MustParsePrefix("10.0.0.0/8")}
	seen := map[netip.Prefix]bool{}
	for range 1000 {
		p, ok := pickSlash30(half, rand.IntN)
		if !ok || p.Bits() != 30 || p != p.Masked() || !netip.MustParsePrefix("198.19.0.0/16").Contains(p.Addr()) {
			t.Fatalf("picked %v, %v with 198.18.0.0/16 taken", p, ok)
		}
		seen[p] = true
	}
	if len(seen) < 900 {
		t.Errorf("1000 draws gave %d distinct /30s", len(seen))
	}
	// A /30 already on the host is never drawn again: every draw hits it.
	taken := netip.MustParsePrefix("198.18.3.0/30")
	if p, ok := pickSlash30([]netip.Prefix{taken}, func(int) int { return 3 << 6 }); ok {
		t.Errorf("picked %v, which overlaps %v", p, taken)
	}
	if p, ok := pickSlash30([]netip.Prefix{netip.MustParsePrefix("198.16.0.0/14")}, rand.IntN); ok {
		t.Errorf("picked %v with the whole range taken", p)
	}
}

// buildClients builds the stub resolvers: glibc's and musl's getaddrinfo
// and Go's resolver, by name.
func buildClients(t *testing.T) map[string]string {
	t.Helper()
	need(t, "needs root for network namespaces", os.Geteuid() == 0)
	need(t, "needs ip (iproute2), gcc and musl-gcc (musl-tools)", lookPath("ip") && lookPath("gcc") && lookPath("musl-gcc"))
	dir := t.TempDir()
	clients := map[string]string{"glibc": filepath.Join(dir, "gai-glibc"), "musl": filepath.Join(dir, "gai-musl")}
	for cc, args := range map[string][]string{"gcc": {"-O1", "-o", clients["glibc"]}, "musl-gcc": {"-static", "-O1", "-o", clients["musl"]}} {
		if out, err := exec.Command(cc, append(args, "testdata/gai.c")...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cc, err, out)
		}
	}
	// Go's resolver: a standalone program (the .txt keeps it out of this
	// package), built without cgo so it never calls glibc.
	src := filepath.Join(dir, "golookup.go")
	data, err := os.ReadFile("testdata/golookup.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	clients["go"] = filepath.Join(dir, "golookup")
	build := exec.Command("go", "build", "-o", clients["go"], src)
	build.Dir, build.Env = dir, append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build golookup: %v\n%s", err, out)
	}
	return clients
}

// The table: short service names, svc.ns, a headless pod name, external
// names with A and AAAA, A only, AAAA only, none, as many dots as ndots, a
// trailing dot, a name found through the node's search domain.
var names = []string{"db", "db.billing", "host.sub.billing.svc", "api.example.com", "api.example.com.",
	"aonly.example.com", "v6only.example.com", "nx.example.com", "a.b.c.d.e.f", "intranet"}

func TestStubResolversAgreeWithAutopath(t *testing.T) {
	clients := buildClients(t)
	p, podView := setupPod(t)
	var err error
	z := newZone()
	srv := &server{z: z}
	srv.ap, err = autopath.New(autopath.Config{
		Pods: staticPods{p.ip: podView}, ClusterDomain: "cluster.local",
		Resolve: func(_ context.Context, name string, qtype uint16) (autopath.Result, error) {
			return z.lookup(name, qtype), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ds := &dns.Server{Addr: netip.AddrPortFrom(p.hostIP, 53).String(), Net: "udp", Handler: srv}
	var started sync.WaitGroup
	started.Add(1)
	ds.NotifyStartedFunc = started.Done
	go func() { _ = ds.ListenAndServe() }()
	started.Wait()
	t.Cleanup(func() { _ = ds.Shutdown() })

	lookup := func(client, name, family string) (string, int64) {
		before := srv.queries.Load()
		out, err := exec.Command("ip", "netns", "exec", p.ns, clients[client], name, family).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s %s: %v\n%s", client, name, family, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if client == "go" {
			// Go orders by RFC 6724 with the answers' arrival as the tie
			// breaker: A and AAAA race, the order is not part of the result.
			slices.Sort(lines)
		}
		return strings.Join(lines, "\n"), srv.queries.Load() - before
	}
	var totalOff, totalOn int64
	for _, client := range []string{"glibc", "musl", "go"} {
		for _, name := range names {
			for _, family := range []string{"unspec", "inet", "inet6"} {
				srv.on.Store(false)
				off, nOff := lookup(client, name, family)
				srv.on.Store(true)
				on, nOn := lookup(client, name, family)
				totalOff, totalOn = totalOff+nOff, totalOn+nOn
				what := client + " " + name + " " + family
				switch {
				case off == on:
				case strings.HasPrefix(off, "error") && strings.HasPrefix(on, "error"):
					// docs/autopath.md: glibc's own walk ends a name that
					// exists without this family in EAI_AGAIN, the CNAME in
					// EAI_NONAME. Both: no address.
					t.Logf("%s: %q without autopath, %q with", what, off, on)
				default:
					t.Errorf("%s: %q without autopath, %q with", what, off, on)
				}
				if nOn > nOff {
					t.Errorf("%s: %d queries with autopath, %d without", what, nOn, nOff)
				}
				if name == "api.example.com" && family == "unspec" && (nOff != 10 || nOn != 2) {
					t.Errorf("%s: %d queries without autopath, %d with; want 10 and 2", what, nOff, nOn)
				}
			}
		}
	}
	t.Logf("queries for %d lookups: %d without autopath, %d with", 3*len(names)*3, totalOff, totalOn)
	if !slices.Contains(names, "api.example.com") || totalOn >= totalOff {
		t.Errorf("autopath saved nothing: %d vs %d queries", totalOn, totalOff)
	}
}
