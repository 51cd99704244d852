package e2e

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// The migration (docs/migration.md): run.sh deploys the stock node-local-dns
// from the Kubernetes reference manifest (test/e2e/manifests/nodelocaldns.yaml,
// the documentation's iptables-mode sed, the image built from the oracle
// binary) and runs TestMigrationFromStock alone before it deploys ours.
var (
	stockManifest = os.Getenv("NLD_E2E_STOCK_MANIFEST")
	stockImage    = os.Getenv("NLD_E2E_STOCK_IMAGE")
	ourImage      = os.Getenv("NLD_E2E_IMAGE")
	stockMissing  = os.Getenv("NLD_E2E_STOCK_MISSING")
)

// kubeDNSClient asks the kube-dns ClusterIP, as pods do when node-local-dns
// runs in iptables mode as the reference manifest sets it up (the kubelet's
// clusterDNS left at kube-dns); clientPod asks the link-local address (the
// kubelet's clusterDNS here, as kubespray sets it).
const kubeDNSClient = "client-kubedns"

// nodeDNSState is what a node-local DNS cache leaves on the node: the
// addresses of the nodelocaldns link (not its fe80::) and, per iptables backend, the rules
// that name its addresses or carry our comment (kube-proxy's KUBE-* chains
// left out), sorted.
type nodeDNSState struct {
	addrs []string
	rules map[string][]string
}

func (s nodeDNSState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "addresses %v", s.addrs)
	for _, k := range slices.Sorted(maps.Keys(s.rules)) {
		fmt.Fprintf(&b, "\n%s:", k)
		for _, r := range s.rules[k] {
			fmt.Fprintf(&b, "\n  %s", r)
		}
	}
	return b.String()
}

func nodeState(t *testing.T) nodeDNSState {
	t.Helper()
	s := nodeDNSState{rules: map[string][]string{}}
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", "nodelocaldns").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "does not exist") {
		t.Fatalf("ip addr show dev nodelocaldns: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			// The link's own fe80:: address is the kernel's, new with
			// every link (the stock deletes it on exit): left out.
			if (f[i] == "inet" || f[i] == "inet6") && !strings.HasPrefix(f[i+1], "fe80:") {
				s.addrs = append(s.addrs, f[i+1])
			}
		}
	}
	slices.Sort(s.addrs)
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		out, err := exec.Command(save).CombinedOutput()
		if err != nil {
			continue // backend not usable here
		}
		var rules []string
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "-A KUBE-") {
				continue
			}
			if strings.Contains(line, localDNS) || strings.Contains(line, kubeDNSIP) || strings.Contains(line, "nodelocaldns") {
				rules = append(rules, line)
			}
		}
		slices.Sort(rules)
		s.rules[save] = rules
	}
	return s
}

// check reports what is wrong with s for a cache serving both addresses:
// both on the link, and for each a NOTRACK rule for DNS over UDP and TCP.
func (s nodeDNSState) check() []string {
	var bad []string
	for _, a := range []string{localDNS, kubeDNSIP} {
		if !slices.Contains(s.addrs, a+"/32") {
			bad = append(bad, fmt.Sprintf("address %s/32 not on the nodelocaldns link", a))
		}
		for _, proto := range []string{"udp", "tcp"} {
			found := false
			for _, rules := range s.rules {
				for _, r := range rules {
					if strings.Contains(r, "-d "+a+"/32") && strings.Contains(r, "-p "+proto) &&
						strings.Contains(r, "--dport 53") && strings.Contains(r, "-j NOTRACK") {
						found = true
					}
				}
			}
			if !found {
				bad = append(bad, fmt.Sprintf("no NOTRACK rule for %s to %s:53", proto, a))
			}
		}
	}
	return bad
}

// cacheProcs returns the node's DNS cache processes (this network
// namespace, exec probes left out) by command name.
func cacheProcs(t *testing.T) map[string][]string {
	t.Helper()
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	procs := map[string][]string{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(d + "/comm")
		name := strings.TrimSpace(string(comm))
		if err != nil || (name != "nodelocaldns" && name != "node-cache") {
			continue
		}
		if cmdline, _ := os.ReadFile(d + "/cmdline"); strings.Contains(string(cmdline), "-probe") {
			continue
		}
		if ns, err := os.Readlink(d + "/ns/net"); err != nil || ns != self {
			continue
		}
		procs[name] = append(procs[name], filepath.Base(d))
	}
	return procs
}

func stockPods(t *testing.T) map[string]string {
	t.Helper()
	out := mustKubectl(t, "-n", "kube-system", "get", "pod", "-l", "k8s-app=node-local-dns", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.spec.containers[0].image} {.status.phase}{"\n"}{end}`)
	pods := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			pods[f[0]] = f[1] + " " + f[2]
		}
	}
	return pods
}

// timedLoopScript is loopScript with each lookup timed: a lookup that took
// 1 s or more (glibc waits 5 s before its retry) is printed as SLOW, and the
// end line adds their number and the longest. SLOW and FAIL lines carry the
// time the lookup started.
const timedLoopScript = addrFunc + `rm -f /tmp/stop; ok=0; fail=0; slow=0; max=0; echo started
look() {
  s=$(date +%s%N); st=$(date +%T.%N)
  if [ "$1" = dig ]; then r=$(dig +short +timeout=1 +tries=1 $2); else r=$(getent ahostsv4 $2); fi
  d=$(( ($(date +%s%N) - s) / 1000000 ))
  [ $d -gt $max ] && max=$d
  [ $d -ge 1000 ] && { slow=$((slow+1)); echo "SLOW $1 $2 ${d}ms $st"; }
  if addr "$(echo "$r" | tail -n1 | cut -d' ' -f1)"; then ok=$((ok+1)); else fail=$((fail+1)); echo "FAIL $1 $2 $st"; fi
}
while [ ! -e /tmp/stop ]; do
  look getent hello.default.svc.cluster.local
  look getent ` + externalName + `
  look dig hello.default.svc.cluster.local
done
echo "ok=$ok fail=$fail slow=$slow max=$max"`

// migration is one change of the DaemonSet, under lookups from both pods.
type migration struct {
	name         string
	took         time.Duration
	sent, failed map[string]int
	// gapLost: dig lookups to the link-local address lost while no cache
	// ran on the node.
	gapLost int
	// stockStartLost: dig lookups to the link-local address lost as the
	// stock started after ours: node-cache writes its NOTRACK rules before
	// its CoreDNS listens, and a query NOTRACKed then skips our fallback's
	// DNAT and finds no socket (seen once in CI: 1 of 846).
	stockStartLost int
	// oldLog: the old pod's log, from 5 lines before the change to its
	// end (its shutdown).
	oldLog string
}

// failLine is one FAIL line of timedLoopScript.
type failLine struct {
	tool string
	at   time.Time
}

// failLines reads the FAIL lines of out ("FAIL TOOL NAME HH:MM:SS.N", when
// the lookup started, the pod's clock: the node's, UTC), dated on the day of ref (or the next or
// previous one, whichever is nearest).
func failLines(out string, ref time.Time) []failLine {
	var fs []failLine
	ref = ref.UTC()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "FAIL" {
			continue
		}
		c, err := time.Parse("15:04:05.999999999", f[3])
		if err != nil {
			fs = append(fs, failLine{tool: f[1]}) // never in the gap
			continue
		}
		at := time.Date(ref.Year(), ref.Month(), ref.Day(), c.Hour(), c.Minute(), c.Second(), c.Nanosecond(), time.UTC)
		if d := at.Sub(ref); d > 12*time.Hour {
			at = at.Add(-24 * time.Hour)
		} else if d < -12*time.Hour {
			at = at.Add(24 * time.Hour)
		}
		fs = append(fs, failLine{tool: f[1], at: at})
	}
	return fs
}

// proxyMode is kube-proxy's mode in the e2e cluster (run.sh's
// NLD_E2E_PROXY_MODE).
var proxyMode = os.Getenv("NLD_E2E_PROXY_MODE")

// change applies manifest (the DaemonSet with image; "" restarts the
// DaemonSet's pods instead, as kubectl rollout restart does), waits until
// the one pod is a new one running image and the cache answers on both
// addresses, keeps the lookups running 3 s more and returns their counts.
// covered says whether our fallback covers the link-local address in the
// gap the reference manifest's rolling update leaves (the old pod deleted
// before the new one starts): then no lookup may fail at all.
func change(t *testing.T, name, manifest, image, comm string, covered bool) migration {
	t.Helper()
	m := migration{name: name, sent: map[string]int{}, failed: map[string]int{}}
	before := stockPods(t)
	var loops []*resolver
	for _, pod := range []string{clientPod, kubeDNSClient} {
		loops = append(loops, startResolverIn(t, pod, timedLoopScript))
	}
	poll(t, 30*time.Second, func() error {
		for _, r := range loops {
			if !strings.Contains(r.out.String(), "started") {
				return fmt.Errorf("lookup loop in %s not started: %s", r.pod, r.out.String())
			}
		}
		return nil
	})
	// The old pod's log to its end (its shutdown), shown when a lookup
	// failed.
	var oldLog testhost.SyncBuffer
	for p := range before {
		cmd := exec.Command(kubectlBin, "-n", "kube-system", "logs", "-f", "--timestamps", "--tail=5", p)
		cmd.Stdout, cmd.Stderr = &oldLog, &oldLog
		if err := cmd.Start(); err == nil {
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		}
	}
	// Lookups before the change: both clients are answered.
	time.Sleep(time.Second)
	start := time.Now()
	if manifest == "" {
		mustKubectl(t, "-n", "kube-system", "rollout", "restart", "daemonset/node-local-dns")
	} else if out, err := kubectlIn(manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("%s: kubectl apply: %v: %s", name, err, out)
	}
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/node-local-dns", "--timeout=180s")
	want := serviceIP(t, "default", "hello")
	var newPod string
	poll(t, 120*time.Second, func() error {
		pods := stockPods(t)
		if len(pods) != 1 {
			return fmt.Errorf("pods %v, want one", pods)
		}
		for p, st := range pods {
			if _, old := before[p]; old || st != image+" Running" {
				return fmt.Errorf("pod %s: %s, want %s Running", p, st, image)
			}
			newPod = p
		}
		if procs := cacheProcs(t); len(procs) != 1 || len(procs[comm]) != 1 {
			return fmt.Errorf("cache processes %v, want one %s", procs, comm)
		}
		for _, server := range []string{localDNS, kubeDNSIP} {
			if got, err := dig(server, "hello.default.svc.cluster.local", time.Second); err != nil || got != want {
				return fmt.Errorf("@%s: %q, %v", server, got, err)
			}
		}
		return nil
	})
	m.took = time.Since(start)
	// newStarted: the new container's start (whole seconds: the window
	// below starts a second early); unknown, no loss is allowed for it.
	var newStarted time.Time
	if at, err := time.Parse(time.RFC3339, mustKubectl(t, "-n", "kube-system", "get", "pod", newPod, "-o",
		"jsonpath={.status.containerStatuses[0].state.running.startedAt}")); err == nil {
		newStarted = at
	} else {
		t.Logf("%s: the new pod's start time: %v", name, err)
	}
	time.Sleep(3 * time.Second)
	for _, r := range loops {
		ok, fail := r.stop(t)
		m.sent[r.pod], m.failed[r.pod] = ok+fail, fail
	}
	for _, r := range loops {
		out := r.out.String()
		var slow, longest int
		if i := strings.LastIndex(out, " slow="); i >= 0 {
			fmt.Sscanf(out[i:], " slow=%d max=%d", &slow, &longest)
		}
		t.Logf("migration: %s: %s: %d lookups sent, %d failed (getent %d, dig %d), %d took 1 s or more, the longest %d ms; the change took %v",
			name, resolverLabel(r.pod), m.sent[r.pod], m.failed[r.pod],
			strings.Count(out, "FAIL getent"), strings.Count(out, "FAIL dig"), slow, longest, m.took.Round(100*time.Millisecond))
	}
	// What may fail where our fallback does not cover the gap: a dig (one
	// 1 s try, no retry) to the link-local address while no cache runs on
	// the node. The reference manifest's update strategy deletes the old
	// pod before the new one starts; the stock removes its address and
	// rules when it exits, so after the stock that query is lost whichever
	// image comes next. After ours, the fallback's DNAT sends it to
	// kube-dns (docs/design.md, "No black hole"), where its targets are
	// known without the API (which the reference manifest grants no
	// access to): kube-proxy's iptables rules, not its nftables mode.
	// glibc's retry hides a loss (a getent never fails); a ClusterIP query
	// goes to kube-dns through kube-proxy in the gap (never fails).
	failed := false
	end := start.Add(m.took)
	for _, r := range loops {
		if m.sent[r.pod] == 0 {
			t.Errorf("%s: %s: no lookup sent", name, resolverLabel(r.pod))
			failed = true
		}
		for _, f := range failLines(r.out.String(), start) {
			inGap := !covered && r.pod == clientPod && f.tool == "dig" && !f.at.Before(start.Add(-time.Second)) && !f.at.After(end)
			if inGap {
				m.gapLost++
				continue
			}
			if covered && comm == "node-cache" && !newStarted.IsZero() && r.pod == clientPod && f.tool == "dig" &&
				!f.at.Before(newStarted.Add(-time.Second)) && !f.at.After(end) {
				m.stockStartLost++
				continue
			}
			t.Errorf("%s: %s: %s failed at %s, outside the gap with no cache (%s to %s)", name, resolverLabel(r.pod), f.tool,
				f.at.Format("15:04:05.000"), start.UTC().Format("15:04:05.000"), end.UTC().Format("15:04:05.000"))
			failed = true
		}
	}
	if m.gapLost > 0 {
		t.Logf("migration: %s: %d one-try dig lookups to %s lost in the %v with no cache on the node (the old pod deleted before the new one starts)",
			name, m.gapLost, localDNS, m.took.Round(100*time.Millisecond))
	}
	if m.stockStartLost > 0 {
		t.Logf("migration: %s: %d one-try dig lookups to %s lost as the stock started (its container started %s; its rules come before its listener)",
			name, m.stockStartLost, localDNS, newStarted.UTC().Format("15:04:05"))
	}
	if failed {
		t.Logf("%s: the old pod's log (%s):\n%s", name, start.UTC().Format("15:04:05.000 the change"), oldLog.String())
	}
	m.oldLog = start.UTC().Format("15:04:05.000 the change:\n") + oldLog.String()
	return m
}

func resolverLabel(pod string) string {
	if pod == kubeDNSClient || pod == clusterIPClient {
		return pod + " (nameserver " + kubeDNSIP + ")"
	}
	return pod + " (nameserver " + localDNS + ")"
}

// TestMigrationFromStock: the stock node-local-dns as the reference manifest
// deploys it; then only image: changes to ours; then ours is restarted (the
// reference manifest's maxUnavailable rollout, ours to ours); then back to
// the stock. Lookups run throughout from two pods, one asking the
// link-local address, one the kube-dns ClusterIP: none may fail, but for a
// one-try dig to the link-local address in the gap after the stock (it
// leaves nothing behind; see change). After each change both addresses are
// on the link with their NOTRACK rules; after the rollback the node is as
// the stock left it at the start but for our fallback's gated rules, and no
// process of ours runs.
func TestMigrationFromStock(t *testing.T) {
	if stockMissing != "" || stockManifest == "" {
		msg := "the stock node-local-dns is not deployed: " + stockMissing
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	manifest, err := os.ReadFile(stockManifest)
	if err != nil {
		t.Fatal(err)
	}
	stock := string(manifest)
	ours := strings.Replace(stock, "image: "+stockImage+"\n", "image: "+ourImage+"\n", 1)
	// Only image: changes.
	a, b := strings.Split(stock, "\n"), strings.Split(ours, "\n")
	var diff []string
	for i := range a {
		if a[i] != b[i] {
			diff = append(diff, a[i]+" -> "+b[i])
		}
	}
	if len(a) != len(b) || len(diff) != 1 {
		t.Fatalf("the manifest for ours differs from the stock's in %d lines, want the image line only: %v", len(diff), diff)
	}
	t.Cleanup(func() {
		// Whatever happened: the reference manifest's objects go, so that
		// run.sh deploys ours on a node without the stock.
		if out, err := kubectlIn(stock, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", "-"); err != nil {
			t.Errorf("kubectl delete the stock: %v: %s", err, out)
		}
		poll(t, 90*time.Second, func() error {
			if p := stockPods(t); len(p) != 0 {
				return fmt.Errorf("node-local-dns pods left: %v", p)
			}
			if procs := cacheProcs(t); len(procs) != 0 {
				return fmt.Errorf("cache processes left: %v", procs)
			}
			return nil
		})
		if out, err := kubectl("delete", "pod", kubeDNSClient, "--wait=false"); err != nil {
			t.Logf("delete pod %s: %v: %s", kubeDNSClient, err, out)
		}
		// While no cache's rules were in place (each change deletes the old
		// pod before the new one starts; the stock serves before its rules
		// are in), the clients' queries were tracked: those conntrack
		// entries (UDP, 30 s) would show in the next tests' check that the
		// pods' DNS leaves none. They go with the migration.
		for _, dst := range []string{localDNS, kubeDNSIP} {
			out, _ := exec.Command("conntrack", "-D", "-d", dst).CombinedOutput()
			t.Logf("conntrack -D -d %s: %s", dst, strings.TrimSpace(string(out)))
		}
	})

	pod := `apiVersion: v1
kind: Pod
metadata: {name: ` + kubeDNSClient + `, namespace: default}
spec:
  dnsPolicy: None
  dnsConfig:
    nameservers: [` + kubeDNSIP + `]
    searches: [default.svc.cluster.local, svc.cluster.local, cluster.local]
    options: [{name: ndots, value: "5"}]
  terminationGracePeriodSeconds: 0
  containers:
    - name: client
      image: localhost/client:e2e
      imagePullPolicy: Never
      command: [sleep, infinity]
`
	if out, err := kubectlIn(pod, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/"+kubeDNSClient, "--timeout=120s")

	// The start: the stock, as deployed.
	var base nodeDNSState
	poll(t, stockSyncInterval+15*time.Second, func() error { // its rules: see the rollback below
		if procs := cacheProcs(t); len(procs) != 1 || len(procs["node-cache"]) != 1 {
			return fmt.Errorf("cache processes %v, want one node-cache", procs)
		}
		base = nodeState(t)
		if bad := base.check(); len(bad) > 0 {
			return fmt.Errorf("the stock's node state: %v\n%v", bad, base)
		}
		return nil
	})
	t.Logf("the stock's node state:\n%v", base)

	// The stock leaves nothing behind: its gap is not ours to cover.
	change(t, "stock -> ours", ours, ourImage, "nodelocaldns", false)
	// Right after the change (the daemon answers on both addresses): both
	// addresses, as the stock had them, with their NOTRACK rules.
	var st nodeDNSState
	poll(t, 30*time.Second, func() error {
		st = nodeState(t)
		if bad := st.check(); len(bad) > 0 {
			return fmt.Errorf("after the change to ours: %v\n%v", bad, st)
		}
		if !slices.Equal(st.addrs, base.addrs) {
			return fmt.Errorf("addresses after the change to ours: %v, the stock had %v", st.addrs, base.addrs)
		}
		return nil
	})
	t.Logf("ours, after the change: addresses %v, rules %d (nft) %d (legacy)", st.addrs, len(st.rules["iptables-nft-save"]), len(st.rules["iptables-legacy-save"]))

	// Ours to ours and ours to the stock: our exit leaves the fallback
	// (this manifest gives the pod no API access, so it cannot tell a
	// rollout from an uninstall), which covers the gap.
	covered := proxyMode != "nftables"
	change(t, "ours -> ours", "", ourImage, "nodelocaldns", covered)
	back := change(t, "ours -> stock", stock, stockImage, "node-cache", covered)
	// After the rollback the node is as the stock had it at the start (the
	// same addresses, the same rules of the stock's in each backend), plus
	// our fallback's rules, which our exit left (it could not tell this
	// from a rollout of ours) and the stock never removes: each NOTRACK of
	// ours holds only while our heartbeat is fresh, so behind the stock's
	// own rules they do nothing (docs/migration.md). The stock adds its
	// rules after it starts serving, and an iptables call that fails there
	// (it logs it and goes on) is retried only by its periodic check, every
	// -syncinterval (60 s, the reference manifest leaves the default): the
	// state may take that long to be the stock's. Nothing of ours changes
	// after our pod is gone, so the wait is the stock's, and the test waits
	// past it before it calls the state wrong.
	took, err := pollFor(stockSyncInterval+15*time.Second, func() error {
		st = nodeState(t)
		if !slices.Equal(st.addrs, base.addrs) {
			return fmt.Errorf("addresses after the rollback: %v, the stock had %v", st.addrs, base.addrs)
		}
		for backend, rules := range st.rules {
			var stocks []string
			for _, r := range rules {
				if !strings.Contains(r, "nodelocaldns") {
					stocks = append(stocks, r)
				} else if strings.Contains(r, "-j NOTRACK") && strings.Contains(r, "--dport 53") && !strings.Contains(r, "-m recent --rcheck") {
					return fmt.Errorf("%s: a rule of ours left after the rollback NOTRACKs whether we serve or not: %s", backend, r)
				}
			}
			if !slices.Equal(stocks, base.rules[backend]) {
				return fmt.Errorf("%s after the rollback, rules the stock did not have at the start: %q; rules it had, now missing: %q",
					backend, minus(stocks, base.rules[backend]), minus(base.rules[backend], stocks))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after %v: %v\nthe stock's log:\n%s\nours, to its exit, %s", took.Round(time.Second), err, stockLog(t), back.oldLog)
	}
	if took > 5*time.Second {
		t.Logf("the stock, after the rollback: as at the start after %v, its log:\n%s\nours, to its exit, %s", took.Round(100*time.Millisecond), stockLog(t), back.oldLog)
		return
	}
	t.Logf("the stock, after the rollback: as at the start (after %v)", took.Round(100*time.Millisecond))
}

// stockSyncInterval is node-cache's -syncinterval default: how often it
// checks that its rules are in place and adds the missing ones.
const stockSyncInterval = 60 * time.Second

// stockLog returns the logs of the node-local-dns pods, for a failure's
// message.
func stockLog(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for p := range stockPods(t) {
		out, err := kubectl("-n", "kube-system", "logs", "--timestamps", p)
		fmt.Fprintf(&b, "%s (%v):\n%s\n", p, err, out)
	}
	return b.String()
}

// minus returns the lines of a that are not in b.
func minus(a, b []string) []string {
	var d []string
	for _, l := range a {
		if !slices.Contains(b, l) {
			d = append(d, l)
		}
	}
	return d
}
