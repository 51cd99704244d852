package fallback

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// deadFor is how long the daemon stays dead (or stopped). The issue's
// check is 60 s; CI keeps 10 s (the same assertions: the fallback's rules
// do not age, only the gate does, within -fallback-after = 2 s), and
// NLD_FALLBACK_DEAD=60s runs the full length.
func deadFor(t *testing.T) time.Duration {
	if v := os.Getenv("NLD_FALLBACK_DEAD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("NLD_FALLBACK_DEAD: %v", err)
		}
		return d
	}
	return 10 * time.Second
}

// otherBuild: NLD_FALLBACK_BINARY names an earlier build, run for the
// "before" figures (it fails the fallback's assertions, as it should).
func otherBuild() bool { return os.Getenv("NLD_FALLBACK_BINARY") != "" }

// fallbackAfter is the daemon's -fallback-after (its default).
const fallbackAfter = 2 * time.Second

// setup is a node with kube-dns, the kube-proxy stand-in, the daemon
// serving, and a pod and a host-network client asking both addresses.
type setup struct {
	n         *node
	k         *kubeDNS
	d         *daemon
	pod, host *client
	c         cluster
}

// kubeProxy says which stand-in translates the Services.
type kubeProxy string

const (
	iptablesMode kubeProxy = "iptables"
	nftablesMode kubeProxy = "nftables"
)

func newSetup(t *testing.T, backend string, mode kubeProxy, f addrs, api bool) *setup {
	t.Helper()
	tools := []string{}
	if mode == nftablesMode {
		tools = append(tools, "nft")
	}
	inNode(t, tools...)
	flushAll(t)
	t.Cleanup(func() { flushAll(t) })
	s := &setup{n: newNode(t), c: cluster{backend: backend, f: f}}
	s.k = startKubeDNS(t, s.n)
	if mode == nftablesMode {
		kubeProxyNFTables(t, f)
	} else {
		kubeProxyIPTables(t, backend, f)
	}
	if api {
		s.c.api, s.c.token, s.c.podName = startAPI(t, f)
	}
	s.d = newDaemon(t, s.c)
	s.d.start()
	// The start opened the gate; the cache answers from the first query.
	s.pod = startClient(t, "pod", s.n.pod, f.local, f.clusterIP)
	s.host = startClient(t, "host network", "", f.local, f.clusterIP)
	return s
}

// flushAll empties every table of both backends and nftables: the node's
// namespace is the package's, one test after another.
func flushAll(t *testing.T) {
	t.Helper()
	for _, b := range []string{"legacy", "nft"} {
		for _, fam := range []string{"iptables", "ip6tables"} {
			for _, table := range []string{"raw", "filter", "nat"} {
				_ = execQuiet(fam+"-"+b, "-t", table, "-F")
				_ = execQuiet(fam+"-"+b, "-t", table, "-X")
			}
		}
	}
	_ = execQuiet("nft", "flush", "ruleset")
	_ = execQuiet("ip", "link", "del", "nodelocaldns")
	_ = execQuiet("ip", "link", "del", "vp")
	_ = execQuiet("ip", "link", "del", "vk")
}

// startAPI starts a real API server with kube-dns' Services and
// kube-dns-upstream's EndpointSlice (what the controllers would write), the
// manifest's RBAC and its DaemonSet, and returns the token the kubelet would
// mount for the DaemonSet's pod and that pod's name.
func startAPI(t *testing.T, f addrs) (*apiserver.Server, string, string) {
	t.Helper()
	s := apiserver.Start(t)
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount", "Role", "RoleBinding")
	family := "IPv4"
	if f.clusterIP.Is6() {
		family = "IPv6"
	}
	for _, svc := range []struct {
		name string
		ip   netip.Addr
	}{{"kube-dns", f.clusterIP}, {"kube-dns-upstream", f.upstream}} {
		s.MustDo(http.MethodPost, "/api/v1/namespaces/kube-system/services", map[string]any{
			"apiVersion": "v1", "kind": "Service", "metadata": map[string]any{"name": svc.name},
			"spec": map[string]any{"clusterIP": svc.ip.String(), "ipFamilies": []string{family}, "selector": map[string]string{"k8s-app": "kube-dns"},
				"ports": []map[string]any{{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}}},
		}, nil)
	}
	s.MustDo(http.MethodPost, "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
		"metadata":  map[string]any{"name": "kube-dns-upstream-x", "labels": map[string]string{"kubernetes.io/service-name": "kube-dns-upstream"}},
		"ports":     []map[string]any{{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}},
		"endpoints": []map[string]any{{"addresses": []string{f.kubeDNS.String()}, "conditions": map[string]bool{"ready": true}}},
	}, nil)
	podSpec := map[string]any{"serviceAccountName": "nodelocaldns", "containers": []map[string]any{{"name": "nodelocaldns", "image": "nodelocaldns"}}}
	s.MustDo(http.MethodPost, "/apis/apps/v1/namespaces/kube-system/daemonsets", map[string]any{
		"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "nodelocaldns"},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]string{"k8s-app": "nodelocaldns"}},
			"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{"k8s-app": "nodelocaldns"}}, "spec": podSpec}},
	}, nil)
	pod := "nodelocaldns-x7k2q" // a name the DaemonSet controller would give its pod (no controller runs)
	return s, s.ServiceAccountToken("kube-system", "nodelocaldns"), pod
}

// waitTargets waits until the daemon has written kube-dns' pod as the
// link-local address's fallback (from the API, or kube-proxy's rules).
func (s *setup) waitTargets(t *testing.T) {
	t.Helper()
	if otherBuild() {
		// An earlier build (the "before" figures): it has no fallback;
		// let it settle as the rest of the test would.
		time.Sleep(2 * time.Second)
		return
	}
	series := fmt.Sprintf(`nodelocaldns_fallback_targets{address=%q}`, s.c.f.local)
	deadline := time.Now().Add(20 * time.Second)
	for s.d.metric(series) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no fallback target for %s within 20 s", s.c.f.local)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := s.d.metric(fmt.Sprintf(`nodelocaldns_fallback_targets{address=%q}`, s.c.f.clusterIP)); got != 0 {
		t.Errorf("the ClusterIP's fallback has %v DNAT targets, want 0 (kube-proxy's rules)", got)
	}
}

// report logs a window's tallies for both clients and returns them.
func (s *setup) report(t *testing.T, what string, from, to time.Time) (pod, host tally) {
	t.Helper()
	pod, host = count(s.pod.window(from, to)), count(s.host.window(from, to))
	t.Logf("%s (%v): pod %v; host network %v", what, to.Sub(from).Round(100*time.Millisecond), pod, host)
	for _, e := range append(pod.errs, host.errs...) {
		t.Logf("  %s", e)
	}
	return pod, host
}

// TestKilledNotRestarted: the daemon serving, SIGKILLed and kept dead, then
// started again. While it is dead a pod's one-try lookups of both addresses
// are answered by kube-dns (>= 99.9%, none over 1 s); a host-network
// client's within -fallback-after of the kill; from 1 s after the restart
// the cache answers again, and the next instance reports what took the
// fallback. Both iptables backends, kube-proxy in iptables mode (the
// targets read from its rules: no API server) and in nftables mode (the
// targets from the API's EndpointSlices), IPv6.
func TestKilledNotRestarted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend string
		mode    kubeProxy
		f       addrs
		api     bool
	}{
		{"legacy/iptables-mode/ipv4", "legacy", iptablesMode, v4, false},
		{"nft/nftables-mode/ipv4/api", "nft", nftablesMode, v4, true},
		{"nft/iptables-mode/ipv6", "nft", iptablesMode, v6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, tc.backend, tc.mode, tc.f, tc.api)
			s.waitTargets(t)
			time.Sleep(2 * time.Second)
			killed := time.Now()
			_ = s.d.signal(syscall.SIGKILL)
			dead := time.Now() // reaped: its sockets are closed
			time.Sleep(deadFor(t))
			s.d.start()
			restarted := s.d.started
			time.Sleep(3 * time.Second)
			s.pod.finish()
			s.host.finish()

			s.report(t, "serving", killed.Add(-2*time.Second), killed)
			// What the kernel had queued in the dying sockets is lost with
			// them (a query sent while the process was being killed).
			s.report(t, "in flight at the kill", killed.Add(-time.Second), dead)
			pod, host := s.report(t, "killed, not restarted", dead, restarted)
			s.report(t, "restarted", restarted, time.Now())
			if pod.answered() < 99.9 || pod.slow > 0 {
				t.Errorf("pod while dead: %v, want >= 99.9%% answered, none over 1 s", pod)
			}
			if host.failed > 0 && host.last.Sub(killed) > fallbackAfter+200*time.Millisecond {
				t.Errorf("host network while dead: a lookup failed %v after the kill, past -fallback-after (%v)", host.last.Sub(killed), fallbackAfter)
			}
			if late := count(s.host.window(killed.Add(fallbackAfter+200*time.Millisecond), restarted)); late.failed > 0 || late.slow > 0 {
				t.Errorf("host network from -fallback-after after the kill: %v", late)
			}
			if after := count(append(s.pod.window(restarted, time.Now()), s.host.window(restarted, time.Now())...)); after.failed > 0 {
				t.Errorf("after the restart: %v", after)
			}
			backToCache(t, s, restarted)
			flows := s.d.metric(fmt.Sprintf(`nodelocaldns_fallback_flows_total{address=%q,client="pods"}`, tc.f.local))
			t.Logf("the restarted daemon counts %v flows of pods through the fallback of %s (%d lookups sent to it while dead)", flows, tc.f.local, pod.sent/2)
			if flows < float64(pod.sent/4) {
				t.Errorf("the restarted daemon counts %v flows of pods through the fallback of %s, want about %d", flows, tc.f.local, pod.sent/2)
			}
			if !strings.Contains(s.d.log.String(), "while no instance served, kube-dns answered") {
				t.Errorf("no start line reporting the fallback")
			}
		})
	}
}

// backToCache checks that kube-dns stopped seeing the clients' own queries
// within 1 s of the restart: from then on the cache answered them.
func backToCache(t *testing.T, s *setup, restarted time.Time) {
	t.Helper()
	for _, src := range []netip.Addr{s.c.f.pod, s.c.f.gateway} {
		direct := s.k.direct(src, restarted)
		if len(direct) == 0 {
			continue
		}
		last := direct[len(direct)-1]
		t.Logf("kube-dns asked directly by %s %v after the restart (the last time)", src, last.Sub(restarted).Round(time.Millisecond))
		if last.Sub(restarted) > time.Second {
			t.Errorf("kube-dns still asked directly by %s %v after the restart: not back to the cache within 1 s", src, last.Sub(restarted))
		}
	}
}

// TestStoppedFallsBackWithinTheBound: a SIGSTOPped daemon keeps its sockets
// (the socket match still holds) but stops its heartbeat: within
// -fallback-after the gate closes and the pod's and the host's lookups go to
// kube-dns; after SIGCONT the cache answers again within 1 s. What was sent
// to the stopped process before the gate closed is lost (one-try lookups
// time out): at most -fallback-after of them.
func TestStoppedFallsBackWithinTheBound(t *testing.T) {
	s := newSetup(t, "nft", iptablesMode, v4, false)
	s.waitTargets(t)
	time.Sleep(2 * time.Second)
	stopped := time.Now()
	_ = s.d.signal(syscall.SIGSTOP)
	time.Sleep(deadFor(t))
	_ = s.d.signal(syscall.SIGCONT)
	resumed := time.Now()
	time.Sleep(3 * time.Second)
	s.pod.finish()
	s.host.finish()

	s.report(t, "serving", stopped.Add(-2*time.Second), stopped)
	bound := fallbackAfter + 200*time.Millisecond
	s.report(t, "stopped, within -fallback-after", stopped, stopped.Add(bound))
	pod, host := s.report(t, "stopped, past -fallback-after", stopped.Add(bound), resumed)
	s.report(t, "resumed", resumed, time.Now())
	if pod.failed+host.failed > 0 {
		t.Errorf("lookups failed past -fallback-after (%v) after the stop: pod %v, host %v", fallbackAfter, pod, host)
	}
	for _, src := range []netip.Addr{v4.pod, v4.gateway} {
		direct := s.k.direct(src, stopped)
		if len(direct) == 0 {
			t.Fatalf("kube-dns never asked directly by %s while the daemon was stopped", src)
		}
		took := direct[0].Sub(stopped)
		t.Logf("the first lookup of %s answered by kube-dns %v after SIGSTOP (-fallback-after %v)", src, took.Round(time.Millisecond), fallbackAfter)
		// The gate closes at most -fallback-after after the stop; the next
		// query is at most 100 ms later, and a loaded machine delays it.
		if took > fallbackAfter+500*time.Millisecond {
			t.Errorf("%s fell back %v after SIGSTOP, past -fallback-after (%v) and 0.5 s", src, took, fallbackAfter)
		}
	}
	if after := count(append(s.pod.window(resumed, time.Now()), s.host.window(resumed, time.Now())...)); after.failed > 0 {
		t.Errorf("after SIGCONT: %v", after)
	}
	backToCache(t, s, resumed)
}

// TestRolloutWithoutTwinLosesNothing: the reference manifest's rolling
// update (maxUnavailable) deletes the old pod before the new one starts.
// The old daemon closes its gate, answers what it was given and exits
// leaving link and rules (the API says its DaemonSet stays); in the gap
// kube-dns answers; the new daemon adopts the rules. No lookup of the pod
// or the host fails. Then -cleanup removes what a killed daemon left, and
// an uninstall (the DaemonSet deleted) removes everything on exit.
func TestRolloutWithoutTwinLosesNothing(t *testing.T) {
	s := newSetup(t, "nft", nftablesMode, v4, true)
	s.waitTargets(t)
	before := rulesOf(t, "nft")
	time.Sleep(2 * time.Second)
	exiting := time.Now()
	if err := s.d.signal(syscall.SIGTERM); err != nil {
		t.Fatalf("exit: %v", err)
	}
	gone := time.Now()
	if !strings.Contains(s.d.log.String(), "leaving link, addresses and rules") {
		t.Errorf("the exit did not say it leaves the fallback")
	}
	if left := rulesOf(t, "nft"); strings.Join(left, "\n") != strings.Join(before, "\n") {
		t.Errorf("rules after a rollout's exit differ:\n%s\nwant\n%s", strings.Join(left, "\n"), strings.Join(before, "\n"))
	}
	time.Sleep(3 * time.Second) // the new pod's image pull and start
	s.d.start()
	restarted := s.d.started
	time.Sleep(3 * time.Second)
	s.pod.finish()
	s.host.finish()
	s.report(t, "the old pod's exit (lame duck, gate closed, drain)", exiting, gone)
	s.report(t, "no pod", gone, restarted)
	s.report(t, "the new pod", restarted, time.Now())
	if all := count(append(s.pod.window(exiting.Add(-2*time.Second), time.Now()), s.host.window(exiting.Add(-2*time.Second), time.Now())...)); all.failed > 0 || all.slow > 0 {
		t.Errorf("the rollout lost lookups: %v", all)
	}
	if direct := s.k.direct(v4.pod, gone); len(direct) == 0 {
		t.Errorf("kube-dns never asked directly in the gap: the test proves nothing")
	}
	backToCache(t, s, restarted)

	// Killed, then -cleanup with the same flags removes it all.
	_ = s.d.signal(syscall.SIGKILL)
	cleanup := append(append([]string{}, s.d.argv...), "-cleanup")
	out, err := execIn(s.d.env, cleanup...)
	if err != nil {
		t.Fatalf("-cleanup: %v\n%s", err, out)
	}
	if left := rulesOf(t, "nft"); len(left) > 0 {
		t.Errorf("rules left after -cleanup:\n%s", strings.Join(left, "\n"))
	}
	if a := addrsOnLink(t); len(a) > 0 {
		t.Errorf("addresses left after -cleanup: %v", a)
	}

	// The uninstall as kubectl delete -f deploy/daemonset.yaml does it: the
	// objects in the file's order (the ServiceAccount and its Role first,
	// the DaemonSet last), then the pod's exit: it can no longer read its
	// DaemonSet, having read it at start, and removes all.
	s.d.start()
	time.Sleep(time.Second) // its start's question answered
	for _, p := range []string{"/api/v1/namespaces/kube-system/serviceaccounts/nodelocaldns",
		"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles/nodelocaldns",
		"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/nodelocaldns",
		"/apis/apps/v1/namespaces/kube-system/daemonsets/nodelocaldns"} {
		s.c.api.MustDo(http.MethodDelete, p, nil, nil)
	}
	if err := s.d.signal(syscall.SIGTERM); err != nil {
		t.Fatalf("exit: %v", err)
	}
	if !strings.Contains(s.d.log.String(), "API rights this pod had at start are gone") {
		t.Errorf("the exit did not see the uninstall")
	}
	for _, l := range strings.Split(s.d.log.String(), "\n") {
		if strings.Contains(l, "removing link, addresses and rules") {
			t.Logf("the exit: %s", l)
		}
	}
	if left := rulesOf(t, "nft"); len(left) > 0 {
		t.Errorf("rules left after the uninstall:\n%s", strings.Join(left, "\n"))
	}
	if a := addrsOnLink(t); len(a) > 0 {
		t.Errorf("addresses left after the uninstall: %v", a)
	}
}
