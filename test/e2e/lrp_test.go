package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// lrpObjects renders deploy/lrp/nodelocaldns-lrp.yaml for this cluster
// beside the host-network DaemonSet the other tests use: every object
// renamed nodelocaldns-lrp (names, labels, the ServiceAccount, the
// ConfigMap), kube-dns-upstream left out (the host-network manifest made
// it, identical), the image this run built.
func lrpObjects(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("deploy/lrp/nodelocaldns-lrp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, d := range strings.Split(string(raw), "\n---\n") {
		if strings.Contains(d, "\nkind: Service\n") {
			continue
		}
		docs = append(docs, d)
	}
	s := strings.Join(docs, "\n---\n")
	s = regexp.MustCompile(`(?m)(name|k8s-app|serviceAccountName): nodelocaldns$`).ReplaceAllString(s, "$1: nodelocaldns-lrp")
	s = strings.NewReplacer("__PILLAR__DNS__DOMAIN__", "cluster.local", "__NODELOCALDNS__IMAGE__", os.Getenv("NLD_E2E_IMAGE")).Replace(s)
	// __PILLAR__CLUSTER__DNS__ and __PILLAR__UPSTREAM__SERVERS__ stay: the
	// daemon fills them at start.
	for _, tok := range []string{"__PILLAR__DNS__DOMAIN__", "__NODELOCALDNS__IMAGE__", "__PILLAR__LOCAL__DNS__", "__PILLAR__DNS__SERVER__"} {
		if strings.Contains(s, tok) {
			t.Fatalf("%s is left in the rendered LRP manifest:\n%s", tok, s)
		}
	}
	return s
}

// The LRP stand-in: Cilium redirects the kube-dns Service to the cache
// pod of the client's node; here kube-proxy's own DNAT does it, for a
// Service that selects the cache pods, node-local endpoints only
// (internalTrafficPolicy: Local, as the redirect's backends are the
// node's pods).
const lrpService = `apiVersion: v1
kind: Service
metadata: {name: nodelocaldns-lrp, namespace: kube-system}
spec:
  selector: {k8s-app: nodelocaldns-lrp}
  internalTrafficPolicy: Local
  ports:
    - {name: dns, port: 53, protocol: UDP, targetPort: dns}
    - {name: dns-tcp, port: 53, protocol: TCP, targetPort: dns-tcp}
`

// lrpLoop asks the redirected address from the client pod with dig, one
// 1 s try each, over UDP and over TCP, a cluster name and an external
// one, until stopped; a lost packet is a failure (no retry hides it).
func lrpLoop(server string) string {
	return addrFunc + `rm -f /tmp/stop; ok=0; fail=0; echo started
while [ ! -e /tmp/stop ]; do
  for n in hello.default.svc.cluster.local ` + externalName + `; do
    for p in +notcp +tcp; do
      if addr "$(dig +short +timeout=1 +tries=1 $p @` + server + ` $n | tail -n1)"; then ok=$((ok+1)); else fail=$((fail+1)); echo "FAIL dig $p $n $(date +%T.%N)"; fi
    done
  done
done
echo "ok=$ok fail=$fail"`
}

func lrpPods(t *testing.T) []string {
	t.Helper()
	return strings.Fields(mustKubectl(t, "-n", "kube-system", "get", "pod", "-l", "k8s-app=nodelocaldns-lrp", "-o", "jsonpath={.items[*].metadata.name}"))
}

// The Local Redirect Policy mode (deploy/lrp, docs/deploy.md): the cache
// in the pod network with the stock's arguments for this mode and bind
// 0.0.0.0 answers on its pod IP, and on the redirected Service address;
// kubectl rollout restart under dig lookups (UDP and TCP) loses none: the
// new pod, with a new IP, becomes an endpoint beside the old one, which
// answers through its lame duck while it leaves.
func TestLRPModeRolloutLosesNoLookup(t *testing.T) {
	if out, err := kubectlIn(lrpObjects(t)+"\n---\n"+lrpService, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = kubectl("-n", "kube-system", "delete", "daemonset/nodelocaldns-lrp", "service/nodelocaldns-lrp",
			"configmap/nodelocaldns-lrp", "serviceaccount/nodelocaldns-lrp", "--wait=true", "--timeout=120s")
	})
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/nodelocaldns-lrp", "--timeout=180s")
	pods := lrpPods(t)
	if len(pods) != 1 {
		t.Fatalf("LRP pods: %v", pods)
	}
	podIP := mustKubectl(t, "-n", "kube-system", "get", "pod", pods[0], "-o", "jsonpath={.status.podIP}")
	svcIP := serviceIP(t, "kube-system", "nodelocaldns-lrp")
	// Pod IP serving: the cache answers on the pod's own address (bind
	// 0.0.0.0), cluster and external names, UDP and TCP.
	for _, server := range []string{podIP, svcIP} {
		for _, q := range [][2]string{{"hello.default.svc.cluster.local", serviceIP(t, "default", "hello")}, {externalName, externalIP}} {
			for _, p := range []string{"+notcp", "+tcp"} {
				poll(t, 30*time.Second, func() error {
					out, err := inClient("dig", "+short", "+timeout=2", "+tries=1", p, "@"+server, q[0])
					if err != nil || strings.TrimSpace(out) != q[1] {
						return fmt.Errorf("dig %s @%s %s: %q %v, want %s", p, server, q[0], out, err, q[1])
					}
					return nil
				})
			}
		}
	}
	// The exec probe finds the instance in the pod's own state directory.
	probe := mustKubectl(t, "-n", "kube-system", "exec", pods[0], "--", "/nodelocaldns", "-probe", "ready", "-state-dir", "/run/nodelocaldns")
	t.Logf("LRP pod %s at %s, Service %s; -probe ready: %s", pods[0], podIP, svcIP, probe)

	r := startResolverIn(t, clientPod, lrpLoop(svcIP))
	poll(t, 30*time.Second, func() error {
		if !strings.Contains(r.out.String(), "started") {
			return fmt.Errorf("lookup loop not started: %s", r.out.String())
		}
		return nil
	})
	time.Sleep(2 * time.Second) // lookups before the rollout too
	start := time.Now()
	mustKubectl(t, "-n", "kube-system", "rollout", "restart", "daemonset/nodelocaldns-lrp")
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/nodelocaldns-lrp", "--timeout=180s")
	poll(t, 90*time.Second, func() error {
		if now := lrpPods(t); len(now) != 1 || now[0] == pods[0] {
			return fmt.Errorf("LRP pods %v (old %s)", now, pods[0])
		}
		return nil
	})
	time.Sleep(2 * time.Second) // and after it
	ok, fail := r.stop(t)
	newIP := mustKubectl(t, "-n", "kube-system", "get", "pod", lrpPods(t)[0], "-o", "jsonpath={.status.podIP}")
	t.Logf("rollout in %v, pod IP %s -> %s; lookups (dig, UDP and TCP, 1 s, one try): %d ok, %d failed", time.Since(start).Round(time.Millisecond), podIP, newIP, ok, fail)
	if fail != 0 || ok == 0 {
		t.Fatalf("%d lookups failed (%d ok) during the LRP-mode rollout", fail, ok)
	}
}
