package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// lrpMode is the chart's lrp mode (deploy/lrp), for checkChartRender.
const lrpMode mode = "lrp"

// checkChartRender decodes a render strictly, runs the manifest's checks on
// it when full (values that keep the manifest's invariants), and
// -check-config with the container's args and the kubelet's environment
// (the Corefile of the chart's ConfigMap in place of the mounted one).
func checkChartRender(t *testing.T, rendered string, m mode, full bool) []any {
	t.Helper()
	objs, err := decodeObjects([]byte(rendered))
	if err != nil {
		t.Fatalf("%v\n%s", err, rendered)
	}
	rc := nodeResolvConf(t)
	if full && m != lrpMode {
		for _, err := range checkDeployment(objs, m, dockerfileEntrypoint(t), rc) {
			t.Error(err)
		}
	}
	c := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", c)
	for k, v := range kubeletEnv {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	args := append(containerArgs(c, env), "-resolv-conf="+rc, "-check-config")
	if cm := configMap(objs, "nodelocaldns"); cm != nil {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "Corefile.base"), []byte(cm.Data["Corefile"]), 0o644); err != nil {
			t.Fatal(err)
		}
		args = slices.DeleteFunc(args, func(a string) bool {
			return strings.HasPrefix(a, "-basecorefile=") || strings.HasPrefix(a, "-conf=")
		})
		args = append(args, "-basecorefile="+filepath.Join(dir, "Corefile.base"), "-conf="+filepath.Join(dir, "Corefile"))
	}
	var stdout, stderr bytes.Buffer
	if code, err := runBinary(args, &stdout, &stderr); err != nil || code != 0 || !strings.Contains(stdout.String(), "configuration is valid") {
		t.Errorf("-check-config %q: exit %d, %v\n%s%s", args, code, err, stdout.String(), stderr.String())
	}
	return objs
}

func configMap(objs []any, name string) *corev1.ConfigMap {
	for _, o := range objs {
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == name {
			return cm
		}
	}
	return nil
}

func monitoring(objs []any, kind string) *monitoringObject {
	for _, o := range objs {
		if m, ok := o.(*monitoringObject); ok && m.Kind == kind {
			return m
		}
	}
	return nil
}

func kinds(objs []any) []string {
	var out []string
	for _, o := range objs {
		out = append(out, strings.TrimPrefix(fmt.Sprintf("%T", o), "*"))
	}
	return out
}

// chartCase is one value (or a few that go together) of the chart, the
// mode it renders, whether the manifest's invariants still hold, and what
// must be true of the render.
type chartCase struct {
	name   string
	values []string
	mode   mode
	full   bool
	check  func(objs []any, ds *appsv1.DaemonSet, c *corev1.Container) error
}

// kubeletEnv is what the kubelet adds to the pods' environment besides the
// chart's own Services (podEnv): the Services of the cluster's kube-dns.
var kubeletEnv = map[string]string{"COREDNS_SERVICE_HOST": testKubeDNS, "COREDNS_SERVICE_PORT": "53"}

func hasArg(c *corev1.Container, a string) error {
	if !slices.Contains(c.Args, a) {
		return fmt.Errorf("args %q lack %s", c.Args, a)
	}
	return nil
}

// chartCases: each value of values.yaml that the popular charts expose,
// set to something other than its default.
var chartCases = []chartCase{
	{"defaults", nil, iptablesMode, true, nil},
	{"image digest", []string{"image.digest=sha256:" + strings.Repeat("ab", 32), "image.pullPolicy=Always", "imagePullSecrets[0].name=regcred"}, iptablesMode, true,
		func(_ []any, ds *appsv1.DaemonSet, c *corev1.Container) error {
			want := "registry.example.com/nodelocaldns:test@sha256:" + strings.Repeat("ab", 32)
			if c.Image != want || c.ImagePullPolicy != corev1.PullAlways || len(ds.Spec.Template.Spec.ImagePullSecrets) != 1 {
				return fmt.Errorf("image %s %s, secrets %v", c.Image, c.ImagePullPolicy, ds.Spec.Template.Spec.ImagePullSecrets)
			}
			return nil
		}},
	{"link-local only", []string{"mode=linkLocal", "localIPs={169.254.20.10,fd00::10}"}, ipvsMode, false,
		func(_ []any, _ *appsv1.DaemonSet, c *corev1.Container) error {
			return hasArg(c, "-localip=169.254.20.10,fd00::10")
		}},
	{"another kube-dns Service", []string{"kubeDNS.service=coredns", "kubeDNS.podSelector.k8s-app=coredns", "upstreamService.name=coredns-upstream"}, iptablesMode, false,
		func(objs []any, _ *appsv1.DaemonSet, c *corev1.Container) error {
			if err := hasArg(c, "-localip=169.254.20.10,$(COREDNS_SERVICE_HOST)"); err != nil {
				return err
			}
			for _, s := range services(objs) {
				if s.Name == "coredns-upstream" && s.Spec.Selector["k8s-app"] == "coredns" {
					return hasArg(c, "-upstreamsvc=coredns-upstream")
				}
			}
			return fmt.Errorf("no coredns-upstream Service selecting k8s-app=coredns")
		}},
	{"cluster domain", []string{"clusterDomain=k8s.example"}, iptablesMode, false,
		func(_ []any, _ *appsv1.DaemonSet, c *corev1.Container) error {
			return hasArg(c, "-cluster-domain=k8s.example")
		}},
	{"autopath", []string{"autopath.enabled=true"}, iptablesMode, true,
		func(objs []any, _ *appsv1.DaemonSet, c *corev1.Container) error {
			if !slices.Contains(kinds(objs), "v1.ClusterRole") {
				return fmt.Errorf("-autopath without its ClusterRole: %v", kinds(objs))
			}
			return hasArg(c, "-autopath")
		}},
	{"no endpoint RBAC", []string{"rbac.endpointSlices=false"}, iptablesMode, false,
		func(objs []any, ds *appsv1.DaemonSet, _ *corev1.Container) error {
			if a := ds.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
				return fmt.Errorf("the token is mounted with no RBAC to use it")
			}
			if len(objs) != 4 {
				return fmt.Errorf("want the ServiceAccount, two Services and the DaemonSet, have %v", kinds(objs))
			}
			return nil
		}},
	{"scheduling", []string{"priorityClassName=node-dns", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists", "nodeSelector.pool=dns",
		`affinity@={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/arch","operator":"In","values":["amd64","arm64"]}]}]}}}`},
		iptablesMode, false,
		func(_ []any, ds *appsv1.DaemonSet, _ *corev1.Container) error {
			ps := ds.Spec.Template.Spec
			if ps.PriorityClassName != "node-dns" || len(ps.Tolerations) != 1 || ps.NodeSelector["pool"] != "dns" || ps.Affinity == nil || ps.Affinity.NodeAffinity == nil {
				return fmt.Errorf("pod spec %+v", ps)
			}
			return nil
		}},
	{"resources and memory", []string{"resources.limits.memory=640Mi", "resources.requests.memory=128Mi", "resources.requests.cpu=100m", "cacheMaxBytes=256Mi", "goMemLimit=480MiB"}, iptablesMode, true,
		func(_ []any, _ *appsv1.DaemonSet, c *corev1.Container) error {
			if c.Resources.Limits.Memory().String() != "640Mi" {
				return fmt.Errorf("limits %v", c.Resources.Limits)
			}
			return hasArg(c, "-cache-max-bytes=256Mi")
		}},
	{"update strategy", []string{"updateStrategy.rollingUpdate.maxUnavailable=10%", "updateStrategy.rollingUpdate.maxSurge=0"}, iptablesMode, false,
		func(_ []any, ds *appsv1.DaemonSet, _ *corev1.Container) error {
			if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru.MaxUnavailable.String() != "10%" || ru.MaxSurge.IntValue() != 0 {
				return fmt.Errorf("rollingUpdate %+v", ru)
			}
			return nil
		}},
	{"labels, annotations, flags, env", []string{"commonLabels.team=dns", "podLabels.tier=node", "podAnnotations.example\\.com/owner=dns",
		"extraArgs={-serve-stale=30m,-prefetch=0}", "extraEnv[0].name=GODEBUG", "extraEnv[0].value=madvdontneed=1", "lameDuck=3s", "udpSockets=2"}, iptablesMode, true,
		func(_ []any, ds *appsv1.DaemonSet, c *corev1.Container) error {
			tm := ds.Spec.Template.ObjectMeta
			if ds.Labels["team"] != "dns" || tm.Labels["tier"] != "node" || tm.Annotations["example.com/owner"] != "dns" || tm.Annotations["prometheus.io/scrape"] != "true" {
				return fmt.Errorf("labels %v %v annotations %v", ds.Labels, tm.Labels, tm.Annotations)
			}
			for _, a := range []string{"-serve-stale=30m", "-prefetch=0", "-lameduck=3s", "-udp-sockets=2"} {
				if err := hasArg(c, a); err != nil {
					return err
				}
			}
			return nil
		}},
	// The Cluster Autoscaler's opt-out (the manifest's annotation) yields
	// to podAnnotations, which a Helm map merge could not take away.
	{"cluster autoscaler eviction from podAnnotations", []string{`podAnnotations@={"cluster-autoscaler.kubernetes.io/enable-ds-eviction": "true"}`}, iptablesMode, true,
		func(_ []any, ds *appsv1.DaemonSet, _ *corev1.Container) error {
			if v := ds.Spec.Template.Annotations["cluster-autoscaler.kubernetes.io/enable-ds-eviction"]; v != "true" {
				return fmt.Errorf("enable-ds-eviction %q, want the value's true: %v", v, ds.Spec.Template.Annotations)
			}
			return nil
		}},
	{"extra Corefile blocks", []string{"corefile.extraBlocks=consul:53 {\n    errors\n    cache 30\n    bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__\n    forward . 10.0.0.53\n}"}, iptablesMode, false,
		func(objs []any, _ *appsv1.DaemonSet, c *corev1.Container) error {
			cm := configMap(objs, "nodelocaldns")
			if cm == nil || !strings.Contains(cm.Data["Corefile"], "consul:53 {") || !strings.Contains(cm.Data["Corefile"], "cluster.local:53 {") {
				return fmt.Errorf("Corefile: %v", cm)
			}
			return hasArg(c, "-basecorefile=/etc/coredns/Corefile.base")
		}},
	{"a whole Corefile", []string{"corefile.override=.:53 {\n    cache 30\n    bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__\n    forward . __PILLAR__CLUSTER__DNS__ {\n        force_tcp\n    }\n    prometheus :9253\n}"}, iptablesMode, false,
		func(objs []any, _ *appsv1.DaemonSet, _ *corev1.Container) error {
			if cm := configMap(objs, "nodelocaldns"); cm == nil || strings.Count(cm.Data["Corefile"], ":53 {") != 1 {
				return fmt.Errorf("Corefile: %v", cm)
			}
			return nil
		}},
	{"lrp with extra blocks", []string{"mode=lrp", "lrp.ciliumPolicy=false", "corefile.extraBlocks=example.org:53 {\n    bind 0.0.0.0\n    forward . 10.0.0.53\n}"}, lrpMode, false,
		func(objs []any, _ *appsv1.DaemonSet, _ *corev1.Container) error {
			if slices.Contains(kinds(objs), "deploy.ciliumLRP") {
				return fmt.Errorf("a CiliumLocalRedirectPolicy with lrp.ciliumPolicy=false")
			}
			if cm := configMap(objs, "nodelocaldns"); cm == nil || !strings.Contains(cm.Data["Corefile"], "example.org:53 {") {
				return fmt.Errorf("Corefile: %v", cm)
			}
			return nil
		}},
	{"ServiceMonitor", []string{"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom", "metrics.serviceMonitor.interval=15s"}, iptablesMode, false,
		func(objs []any, ds *appsv1.DaemonSet, _ *corev1.Container) error {
			sm := monitoring(objs, "ServiceMonitor")
			if sm == nil || sm.Labels["release"] != "prom" {
				return fmt.Errorf("no ServiceMonitor labelled release=prom: %v", kinds(objs))
			}
			if _, ok := ds.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
				return fmt.Errorf("scrape annotations beside a ServiceMonitor: every node scraped twice")
			}
			return nil
		}},
	{"PodMonitor", []string{"metrics.podMonitor.enabled=true"}, iptablesMode, false,
		func(objs []any, _ *appsv1.DaemonSet, _ *corev1.Container) error {
			if monitoring(objs, "PodMonitor") == nil {
				return fmt.Errorf("no PodMonitor: %v", kinds(objs))
			}
			return nil
		}},
	{"alert rules and dashboard", []string{"metrics.prometheusRule.enabled=true", "metrics.prometheusRule.coreDNSNames=true", "dashboard.enabled=true", "dashboard.namespace=monitoring"}, iptablesMode, false,
		func(objs []any, _ *appsv1.DaemonSet, _ *corev1.Container) error {
			pr := monitoring(objs, "PrometheusRule")
			if pr == nil {
				return fmt.Errorf("no PrometheusRule: %v", kinds(objs))
			}
			if groups, _ := pr.Spec["groups"].([]any); len(groups) != 2 {
				return fmt.Errorf("PrometheusRule groups %v, want ours and the CoreDNS names'", pr.Spec["groups"])
			}
			for _, o := range objs {
				if cm, ok := o.(*corev1.ConfigMap); ok && cm.Namespace == "monitoring" && cm.Labels["grafana_dashboard"] == "1" && strings.HasPrefix(cm.Data["nodelocaldns.json"], "{") {
					return nil
				}
			}
			return fmt.Errorf("no dashboard ConfigMap in monitoring labelled grafana_dashboard")
		}},
}

// TestChartValues renders every case of chartCases with Helm 3 and 4: the
// objects decode strictly, keep the manifest's invariants where the value
// does not change them on purpose, pass -check-config, and show the value.
func TestChartValues(t *testing.T) {
	helms(t, func(t *testing.T, helm string) {
		for _, cc := range chartCases {
			t.Run(cc.name, func(t *testing.T) {
				out := mustRender(t, helm, append(append([]string{}, testChartValues...), cc.values...)...)
				objs := checkChartRender(t, out, cc.mode, cc.full)
				ds := daemonSets(objs)[0]
				if cc.check != nil {
					if err := cc.check(objs, ds, &ds.Spec.Template.Spec.Containers[0]); err != nil {
						t.Error(err)
					}
				}
			})
		}
	})
}

// TestChartRejectsBadValues: a value the daemon or the cluster would refuse
// fails `helm template` (and so `helm install`) with a message naming it,
// from the schema or from the chart's own checks.
func TestChartRejectsBadValues(t *testing.T) {
	cases := []struct {
		values []string
		want   string
	}{
		{[]string{"image.repository="}, "image.repository is required"},
		{[]string{"mode=ipvs"}, "/mode"},
		{[]string{"localIPs={169.254.20.300}"}, "/localIPs/0"},
		{[]string{"localIPs={fe80::10}"}, "localIPs: fe80::10 is an IPv6 link-local address"},
		{[]string{"localIPs=null"}, "localIPs"},
		{[]string{"kubeDNS.clusterIP=kube-dns"}, "/kubeDNS/clusterIP"},
		{[]string{"mode=linkLocal", "kubeDNS.clusterIP=10.96.0.10"}, "kubeDNS.clusterIP is served in iptables mode only"},
		{[]string{"image.digest=sha256:1234"}, "/image/digest"},
		{[]string{"image.pullPolicy=Sometimes"}, "/image/pullPolicy"},
		{[]string{"cacheMaxBytes=64MB"}, "/cacheMaxBytes"},
		{[]string{"lameDuck=5"}, "/lameDuck"},
		{[]string{"goMemLimit=168M"}, "/goMemLimit"},
		{[]string{"terminationGracePeriodSeconds=10"}, "/terminationGracePeriodSeconds"},
		{[]string{"metrics.port=53"}, "metrics.port 53 is the DNS port"},
		{[]string{"extraArgs={autopath}"}, "/extraArgs/0"},
		{[]string{"clusterDomain=Cluster.Local."}, "/clusterDomain"},
		{[]string{"corefile.extraBlocks=a", "corefile.override=b"}, "corefile.extraBlocks and corefile.override"},
		{[]string{"metrics.serviceMonitor.interval=often"}, "/metrics/serviceMonitor/interval"},
		{[]string{"replicas=2"}, "additional properties 'replicas' not allowed"},
	}
	helms(t, func(t *testing.T, helm string) {
		for _, c := range cases {
			_, err := renderChart(helm, append(append([]string{}, testChartValues...), c.values...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: want an error naming %q, got %v", c.values, c.want, err)
			}
		}
		if _, err := renderChartIn(helm, "default", testChartValues...); err == nil || !strings.Contains(err.Error(), `install into kube-dns' namespace`) {
			t.Errorf("namespace default: want the namespace error, got %v", err)
		}
	})
}

// TestChartRulesAreTheFiles: the PrometheusRule carries the plain rules
// files' groups unchanged, but for each alert's runbook_url, which follows
// metrics.prometheusRule.runbookURL.
func TestChartRulesAreTheFiles(t *testing.T) {
	var want []any
	for _, f := range []string{"nodelocaldns.rules.yaml", "coredns-names.rules.yaml"} {
		data, err := os.ReadFile(filepath.Join(chartPath, "files", f))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct{ Groups []any }
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		want = append(want, doc.Groups...)
	}
	helms(t, func(t *testing.T, helm string) {
		out := mustRender(t, helm, append(append([]string{}, testChartValues...), "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.coreDNSNames=true")...)
		objs, err := decodeObjects([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := yaml.Marshal(monitoring(objs, "PrometheusRule").Spec["groups"])
		w, _ := yaml.Marshal(want)
		if !bytes.Equal(got, w) {
			t.Errorf("the PrometheusRule's groups are not the files':\n%s", lineDiff(want, monitoring(objs, "PrometheusRule").Spec["groups"]))
		}
		out = mustRender(t, helm, append(append([]string{}, testChartValues...), "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.runbookURL=https://wiki.example/dns")...)
		if !strings.Contains(out, "runbook_url: https://wiki.example/dns#nodelocaldnsupstreamgroupdown") {
			t.Error("runbook_url does not follow metrics.prometheusRule.runbookURL")
		}
	})
}
