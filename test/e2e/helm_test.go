package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The Helm chart on the cluster (issue 39), after TestDeleteDaemonSetCleansUp
// and in this order: the static manifest is applied again and Helm 3 takes
// it over with docs/deploy.md's commands (nothing restarts); Helm 4 upgrades
// the release to the chart's defaults with the Prometheus operator's objects
// and the dashboard, a rollout under lookups that loses none, the CRDs
// installed so the API server validates them; Helm 4 uninstalls it and the
// node is clean; docs/deploy.md's install block installs it again.

var (
	helm3 = os.Getenv("NLD_E2E_HELM3")
	helm4 = os.Getenv("NLD_E2E_HELM4")
)

// sectionNumber is a heading's section number ("## 11. "), which the
// headings deployDocBlock looks for leave out: sections get renumbered.
var sectionNumber = regexp.MustCompile(`^(#+ )[0-9]+\. `)

// deployDocBlock is the first sh block after heading in docs/deploy.md.
func deployDocBlock(t *testing.T, heading string) string {
	t.Helper()
	f, err := os.Open("docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var body []string
	state := 0 // 0 before the heading, 1 after it, 2 in the block
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case state == 0 && sectionNumber.ReplaceAllString(line, "$1") == heading:
			state = 1
		case state == 1 && line == "```sh":
			state = 2
		case state == 2 && line == "```":
			return strings.Join(body, "\n") + "\n"
		case state == 2:
			body = append(body, line)
		}
	}
	t.Fatalf("docs/deploy.md: no sh block after %q", heading)
	return ""
}

// runDocBlock runs a block of docs/deploy.md with bash, helm and kubectl
// on its PATH and the variables its sections define.
func runDocBlock(t *testing.T, helm, block string) string {
	t.Helper()
	bin := t.TempDir()
	for name, target := range map[string]string{"helm": helm, "kubectl": kubectlBin} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", block)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "image="+os.Getenv("NLD_E2E_IMAGE"), "kubedns="+kubeDNSIP)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, block, out)
	}
	return string(out)
}

func needHelm(t *testing.T) {
	t.Helper()
	if helm3 == "" || helm4 == "" {
		t.Fatal("NLD_E2E_HELM3 and NLD_E2E_HELM4 unset: run.sh sets them (test/helm/install.sh)")
	}
}

// TestHelmTakesOverTheManifest: the manifest as make e2e applied it, then
// docs/deploy.md's "From deploy/daemonset.yaml to the chart" with Helm 3:
// the release owns the running objects and the pod is the same one.
func TestHelmTakesOverTheManifest(t *testing.T) {
	needHelm(t)
	mustKubectl(t, "apply", "-f", os.Getenv("NLD_E2E_MANIFEST"))
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/nodelocaldns", "--timeout=180s")
	before := nldPods(t)
	gen := mustKubectl(t, "-n", "kube-system", "get", "daemonset/nodelocaldns", "-o", "jsonpath={.metadata.generation}")
	out := runDocBlock(t, helm3, deployDocBlock(t, "### From `deploy/daemonset.yaml` to the chart"))
	t.Logf("%s", out)
	status, err := exec.Command(helm3, "status", "nodelocaldns", "-n", "kube-system", "-o", "json").CombinedOutput()
	if err != nil || !strings.Contains(string(status), `"status":"deployed"`) {
		t.Fatalf("helm status: %v\n%s", err, status)
	}
	time.Sleep(5 * time.Second) // a rollout, had one started, would show by now
	if now := nldPods(t); strings.Join(now, " ") != strings.Join(before, " ") {
		t.Errorf("taking the manifest over restarted the cache: pods %v, before %v", now, before)
	}
	if g := mustKubectl(t, "-n", "kube-system", "get", "daemonset/nodelocaldns", "-o", "jsonpath={.metadata.generation}"); g != gen {
		t.Errorf("the DaemonSet's spec changed (generation %s, was %s): the chart's render is not the manifest's", g, gen)
	}
}

// TestHelmUpgradeLosesNoLookup: Helm 4 upgrades the Helm 3 release to the
// chart's defaults (the kube-dns ClusterIP from the pod's environment) with
// the ServiceMonitor, PodMonitor, PrometheusRule and dashboard on: the
// rollout runs under lookups through the link-local address (glibc, dig)
// and the ClusterIP (dig, UDP and TCP), and none fails; the API server took
// the Prometheus operator's objects against their CRDs.
func TestHelmUpgradeLosesNoLookup(t *testing.T) {
	needHelm(t)
	mustKubectl(t, "create", "-f", "test/deploy/testdata/crds/")
	mustKubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/servicemonitors.monitoring.coreos.com",
		"crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
	before := nldPods(t)
	local := startResolver(t)
	// Both loops end on the pod's /tmp/stop, which the first removes as
	// it starts (an earlier test's stop leaves it): the second starts only
	// after, or it would see the old file and end at once (0 lookups).
	poll(t, 30*time.Second, func() error {
		if !strings.Contains(local.out.String(), "started") {
			return fmt.Errorf("lookup loop not started: %s", local.out.String())
		}
		return nil
	})
	cluster := startResolverIn(t, clientPod, strings.Replace(lrpLoop(kubeDNSIP), "rm -f /tmp/stop; ", "", 1))
	poll(t, 30*time.Second, func() error {
		if !strings.Contains(local.out.String(), "started") || !strings.Contains(cluster.out.String(), "started") {
			return fmt.Errorf("lookup loops not started: %s %s", local.out.String(), cluster.out.String())
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	start := time.Now()
	out, err := exec.Command(helm4, "upgrade", "nodelocaldns", "deploy/chart", "-n", "kube-system", "--reuse-values",
		"--set", "kubeDNS.clusterIP=", "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
		"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.coreDNSNames=true", "--set", "dashboard.enabled=true").CombinedOutput()
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/nodelocaldns", "--timeout=180s")
	poll(t, 90*time.Second, func() error {
		now := nldPods(t)
		if len(now) != 1 || now[0] == before[0] {
			return fmt.Errorf("pods %v (old %v)", now, before)
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	ok1, fail1 := local.stop(t)
	ok2, fail2 := cluster.stop(t)
	t.Logf("helm upgrade rolled out in %v; lookups to %s (getent, dig): %d ok, %d failed; to %s (dig UDP and TCP, one 1 s try): %d ok, %d failed",
		time.Since(start).Round(time.Millisecond), localDNS, ok1, fail1, kubeDNSIP, ok2, fail2)
	if fail1+fail2 != 0 || ok1 == 0 || ok2 == 0 {
		t.Fatalf("%d lookups failed during helm upgrade", fail1+fail2)
	}
	args := mustKubectl(t, "-n", "kube-system", "get", "daemonset/nodelocaldns", "-o", "jsonpath={.spec.template.spec.containers[0].args[0]}")
	if args != "-localip="+localDNS+",$(KUBE_DNS_SERVICE_HOST)" {
		t.Errorf("after the upgrade -localip is %q", args)
	}
	mustKubectl(t, "-n", "kube-system", "get", "servicemonitor/nodelocaldns", "podmonitor/nodelocaldns", "prometheusrule/nodelocaldns", "configmap/nodelocaldns-dashboard")
	if n := mustKubectl(t, "-n", "kube-system", "get", "prometheusrule/nodelocaldns", "-o", "jsonpath={range .spec.groups[*]}{.name} {end}"); n != "nodelocaldns nodelocaldns-coredns-names" {
		t.Errorf("PrometheusRule groups %q", n)
	}
}

// TestHelmUninstallCleansUp: helm uninstall removes every object of the
// release, and the pod its rules and addresses.
func TestHelmUninstallCleansUp(t *testing.T) {
	needHelm(t)
	if out, err := exec.Command(helm4, "uninstall", "nodelocaldns", "-n", "kube-system").CombinedOutput(); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	checkNodeClean(t)
	for _, o := range []string{"daemonset/nodelocaldns", "serviceaccount/nodelocaldns", "role/nodelocaldns", "service/kube-dns-upstream",
		"service/nodelocaldns", "servicemonitor/nodelocaldns", "prometheusrule/nodelocaldns", "configmap/nodelocaldns-dashboard"} {
		if out, err := kubectl("-n", "kube-system", "get", o); err == nil {
			t.Errorf("%s left after helm uninstall: %s", o, out)
		}
	}
	if out, err := kubectl("get", "clusterrole/nodelocaldns"); err == nil {
		t.Errorf("clusterrole/nodelocaldns left: %s", out)
	}
}

// TestHelmInstall: docs/deploy.md's install block (Helm 4, the chart's
// defaults) on a cluster without the cache; the client pod resolves through
// it again.
func TestHelmInstall(t *testing.T) {
	needHelm(t)
	runDocBlock(t, helm4, deployDocBlock(t, "## Install with Helm"))
	want := serviceIP(t, "default", "hello")
	poll(t, 30*time.Second, func() error {
		got, err := getent("hello")
		if err != nil || got != want {
			return fmt.Errorf("hello: %q %v, want %s", got, err, want)
		}
		got, err = dig(kubeDNSIP, "hello.default.svc.cluster.local", 2*time.Second)
		if err != nil || got != want {
			return fmt.Errorf("@%s: %q %v, want %s", kubeDNSIP, got, err, want)
		}
		return nil
	})
	if n := len(nldPods(t)); n != 1 {
		t.Fatalf("%d cache pods", n)
	}
}
