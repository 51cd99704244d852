package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/daemon"
	"github.com/nodelocaldns/nodelocaldns/internal/gcfloor"
)

// The manifests under deploy/ as the API server, the kubelet and the daemon
// see them (issue 7): every document decoded strictly into the Kubernetes API
// types, every invariant of the DaemonSet checked, and the container's args
// passed through the daemon's own flag parser.

const (
	repoRoot     = "../.."
	manifestPath = repoRoot + "/deploy/daemonset.yaml"

	// What an operator puts in place of the tokens (docs/deploy.md).
	testLocalDNS = "169.254.20.10"
	testKubeDNS  = "10.96.0.10"
	testDomain   = "cluster.local"
	testImage    = "registry.example.com/nodelocaldns:test"
	// The first ClusterIP the API server gives the manifest's Services.
	testServiceIPs = "10.96.0.%d"
)

// mode is one of the two deployments docs/deploy.md describes.
type mode string

const (
	// kube-proxy in iptables mode: serve the link-local address and the
	// kube-dns ClusterIP; pods and kubelet unchanged.
	iptablesMode mode = "iptables"
	// IPVS or an eBPF kube-proxy replacement: the link-local address only;
	// the kubelet's clusterDNS points at it.
	ipvsMode mode = "ipvs"
)

// substitute replaces the operator's tokens as docs/deploy.md's sed lines do
// (TestDocCommands checks that they produce the same bytes).
func substitute(manifest string, m mode) string {
	r := []string{
		"__PILLAR__LOCAL__DNS__", testLocalDNS,
		"__PILLAR__DNS__DOMAIN__", testDomain,
		"__NODELOCALDNS__IMAGE__", testImage,
	}
	if m == ipvsMode {
		manifest = strings.ReplaceAll(manifest, ",__PILLAR__DNS__SERVER__", "")
	} else {
		r = append(r, "__PILLAR__DNS__SERVER__", testKubeDNS)
	}
	return strings.NewReplacer(r...).Replace(manifest)
}

// decodeObjects decodes every YAML document of data strictly into its
// Kubernetes type: an unknown field (names are case-sensitive) or a
// duplicate one fails, and so does a kind this test does not know (adding
// one is a decision worth a test).
func decodeObjects(data []byte) ([]any, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []any
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var generic any
		if err := yaml.Unmarshal(doc, &generic); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if generic == nil {
			continue // comments only
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Pod":
			obj = &corev1.Pod{}
		case "apps/v1 DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "cilium.io/v2 CiliumLocalRedirectPolicy":
			obj = &ciliumLRP{}
		case "readiness.node.x-k8s.io/v1alpha1 NodeReadinessRule":
			obj = &nodeReadinessRule{}
		case "rbac.authorization.k8s.io/v1 Role":
			obj = &rbacv1.Role{}
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			obj = &rbacv1.RoleBinding{}
		default:
			return nil, fmt.Errorf("document %d: apiVersion %q kind %q is not a kind this test knows", i, tm.APIVersion, tm.Kind)
		}
		// As the API server decodes with field validation Strict (kubectl's
		// default): duplicate keys, and field names matched case-sensitively.
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err = errors.Join(append(strict, err)...); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		out = append(out, obj)
	}
}

func loadManifest(t *testing.T, m mode) []any {
	t.Helper()
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects([]byte(substitute(string(raw), m)))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func services(objs []any) []*corev1.Service {
	var out []*corev1.Service
	for _, o := range objs {
		if s, ok := o.(*corev1.Service); ok {
			out = append(out, s)
		}
	}
	return out
}

func daemonSets(objs []any) []*appsv1.DaemonSet {
	var out []*appsv1.DaemonSet
	for _, o := range objs {
		if d, ok := o.(*appsv1.DaemonSet); ok {
			out = append(out, d)
		}
	}
	return out
}

// podEnv is the container's environment as the kubelet builds it: the
// Service links of its namespace (enableServiceLinks; the manifest's
// Services with ClusterIPs in order, and kube-dns at testKubeDNS, as in a
// real cluster), then the container's own env, which wins.
func podEnv(objs []any, ns string, c *corev1.Container) map[string]string {
	env := map[string]string{"KUBE_DNS_SERVICE_HOST": testKubeDNS, "KUBE_DNS_SERVICE_PORT": "53"}
	next := 11
	for _, s := range services(objs) {
		if s.Namespace != ns || s.Spec.ClusterIP == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		name := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		env[name+"_SERVICE_HOST"] = fmt.Sprintf(testServiceIPs, next)
		env[name+"_SERVICE_PORT"] = strconv.Itoa(int(s.Spec.Ports[0].Port))
		next++
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			env[e.Name] = "node-1" // the downward API
			continue
		}
		env[e.Name] = expand(e.Value, env)
	}
	return env
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand does the kubelet's $(VAR) expansion of args and env values.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

func containerArgs(c *corev1.Container, env map[string]string) []string {
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = expand(a, env)
	}
	return args
}

// nodeResolvConf is the node's resolv.conf, which dnsPolicy: Default gives
// the pod as /etc/resolv.conf.
func nodeResolvConf(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("nameserver 192.0.2.53\nnameserver 2001:db8::53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// flagSet reports whether args set the flag name (-name or -name=value).
func flagSet(args []string, name string) bool {
	for _, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// Memory the daemon uses besides the cache, per unit, as the comment in
// deploy/daemonset.yaml states it.
const (
	udpSocketHeap  = 340 << 10 // one recvmmsg batch: 64 x 4 KiB in, 64 x 1232 B out
	perMissHeap    = 16 << 10  // the worst case, a goroutine per miss (stack, pooled request, flight, answer); test/memory measures 5-10 KiB of peak RSS per miss held
	perTCPConnHeap = 10 << 10  // reader goroutine and buffers (a query over 2 KiB closes its connection)
	// The clients waiting on the misses beyond one each (the server's
	// bound is twice -max-inflight), ~7 KiB each (TestWaitingClientMemory).
	perWaitingHeap = 7 << 10
	// Answers to misses being written to TCP clients, at most
	// server.MaxTCPAnswerBytes.
	tcpAnswersHeap = 8 << 20
	// An HTTP listener holds at most 256 connections of ~17 KiB each
	// (internal/metrics, httpMaxConns).
	httpListenerHeap = 256 * 17 << 10
	baseHeap         = 8 << 20 // runtime, metrics, routes, upstream pools
	// kube-dns' pods asked directly: endpoints.DefaultMax (16) x -tcp-pool-size (2)
	// connections x ~110 KiB (reader buffer up to a 64 KiB frame, two goroutines, the
	// write queue), and the slices' store (at most 5000 endpoints, ~1 MiB).
	kubeDNSEndpointsHeap = 5 << 20
	// A client TCP connection's kernel buffers, fixed (server.tcpSndBuf
	// and tcpRcvBuf, doubled by the kernel).
	perTCPConnKernel = 24 << 10
	// SO_RCVBUF asks 4 MiB, which the kernel doubles (capped by rmem_max);
	// queued datagrams are charged to the pod's memory cgroup.
	socketRcvBuf = 2 * 4 << 20
	// iptables(-save) children and the binary's pages.
	childrenAndText = 32 << 20
	// Share of GOMEMLIMIT left for garbage between collections.
	minGarbage = 0.25
)

// parseGoMemLimit parses GOMEMLIMIT as the Go runtime does.
func parseGoMemLimit(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("GOMEMLIMIT %q is not a byte count", s)
	}
	return n * mult, nil
}

// checkDeployment checks every invariant of issue 7 on the decoded,
// substituted manifest and returns what is wrong. entrypoint is the image's
// ENTRYPOINT (from the Dockerfile); resolvConf stands in for the node's.
func checkDeployment(objs []any, m mode, entrypoint []string, resolvConf string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	dss := daemonSets(objs)
	if len(dss) != 1 {
		fail("want exactly one DaemonSet, have %d", len(dss))
		return errs
	}
	ds := dss[0]
	ns := ds.Namespace
	if ns != "kube-system" {
		fail("DaemonSet in namespace %q, want kube-system (the kube-dns ConfigMap and Service live there)", ns)
	}
	for _, o := range objs {
		switch o.(type) {
		case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			continue // cluster-scoped
		}
		if mo, ok := o.(metav1.Object); ok && mo.GetNamespace() != ns {
			fail("%s %s in namespace %q, not the DaemonSet's %q", fmt.Sprintf("%T", o), mo.GetName(), mo.GetNamespace(), ns)
		}
	}
	tmpl := ds.Spec.Template
	ps := &tmpl.Spec

	// Selector and labels.
	sel, err := metav1.LabelSelectorAsMap(ds.Spec.Selector)
	if err != nil || len(sel) == 0 {
		fail("selector: %v", err)
	}
	for k, v := range sel {
		if tmpl.Labels[k] != v {
			fail("selector %s=%s does not match the pod template's labels", k, v)
		}
	}

	// The node-level pod.
	if !ps.HostNetwork {
		fail("hostNetwork must be true: the cache serves the node's own addresses")
	}
	if ps.DNSPolicy != corev1.DNSDefault {
		fail("dnsPolicy %q, want Default: the node's resolvers, never ourselves", ps.DNSPolicy)
	}
	if ps.PriorityClassName != "system-node-critical" {
		fail("priorityClassName %q, want system-node-critical", ps.PriorityClassName)
	}
	if ps.HostPID {
		fail("hostPID must be false: the exec probe finds its instance by PID namespace")
	}
	if ps.ShareProcessNamespace != nil && *ps.ShareProcessNamespace {
		fail("shareProcessNamespace must be false: the exec probe finds its instance by PID namespace")
	}
	if ps.EnableServiceLinks != nil && !*ps.EnableServiceLinks {
		fail("enableServiceLinks must not be false: -upstreamsvc reads the kubelet's NAME_SERVICE_HOST")
	}
	if !slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == "" && t.Operator == corev1.TolerationOpExists && t.Effect == ""
	}) {
		fail("no toleration for every taint (operator: Exists, no key, no effect)")
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ds.Spec.UpdateStrategy.RollingUpdate == nil {
		fail("updateStrategy must be RollingUpdate")
	} else {
		ru := ds.Spec.UpdateStrategy.RollingUpdate
		if ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(1) {
			fail("rollingUpdate.maxSurge %v, want 1 (the new pod starts beside the old one)", ru.MaxSurge)
		}
		if ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(0) {
			fail("rollingUpdate.maxUnavailable %v, want 0", ru.MaxUnavailable)
		}
	}

	// ServiceAccount: present, no token.
	var sa *corev1.ServiceAccount
	for _, o := range objs {
		if s, ok := o.(*corev1.ServiceAccount); ok && s.Name == ps.ServiceAccountName {
			sa = s
		}
	}
	if ps.ServiceAccountName == "" || sa == nil {
		fail("serviceAccountName %q is not a ServiceAccount of the manifest", ps.ServiceAccountName)
	} else {
		// The kube-dns endpoint watch (and -autopath's pod watch) talk to
		// the API server. The pod's setting wins over the ServiceAccount's;
		// unset is true.
		mounted := sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken
		if ps.AutomountServiceAccountToken != nil {
			mounted = *ps.AutomountServiceAccountToken
		}
		autopath := len(ps.Containers) > 0 && slices.Contains(ps.Containers[0].Args, "-autopath")
		if !mounted {
			fail("the service account token is not mounted: the cache cannot follow kube-dns' endpoints (ClusterIP only)")
		}
		if autopath && !mounted {
			fail("-autopath without the service account token: the pod watch cannot reach the API server")
		}
		// RBAC per enabled feature (issue 41): the endpoint watch's Role
		// always; the pod watch's ClusterRole (deploy/autopath/rbac.yaml)
		// with -autopath, and no cluster-wide grant at all without it.
		for _, err := range append(checkEndpointAccess(objs, sa), checkNodeName(ps)...) {
			fail("%v", err)
		}
		if autopath {
			for _, err := range checkAutopathAccess(objs, sa) {
				fail("%v", err)
			}
		} else if b := clusterBindings(objs, sa); len(b) > 0 {
			fail("ClusterRoleBinding %s grants the service account cluster-wide rights with -autopath off: root on a node could use them with the pod's token (deploy/autopath/rbac.yaml is for -autopath only)", strings.Join(b, ", "))
		}
	}

	// Containers: exactly ours, and no ports anywhere.
	all := append(append([]corev1.Container(nil), ps.InitContainers...), ps.Containers...)
	for _, c := range all {
		if len(c.Ports) > 0 {
			fail("container %s declares containerPorts %v: on the host network they are host ports and block the surge pod", c.Name, c.Ports)
		}
	}
	if len(ps.Containers) != 1 || len(ps.InitContainers) != 0 {
		fail("want one container and no init containers, have %d and %d", len(ps.Containers), len(ps.InitContainers))
		return errs
	}
	c := &ps.Containers[0]
	if c.Image == "" || strings.Contains(c.Image, "__") {
		fail("image %q is not set", c.Image)
	}
	if len(c.Command) > 0 {
		fail("command %v overrides the image's ENTRYPOINT %v", c.Command, entrypoint)
	}

	// The args, through the daemon's own parser.
	env := podEnv(objs, ns, c)
	args := containerArgs(c, env)
	if flagSet(args, "resolv-conf") && !slices.Contains(args, "-resolv-conf=/etc/resolv.conf") {
		fail("-resolv-conf must be /etc/resolv.conf, the node's (dnsPolicy: Default)")
	}
	cfg, err := config.Parse(append(slices.Clone(args), "-resolv-conf="+resolvConf), func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		fail("args %q: %v", args, err)
		return errs
	}
	if cfg.LocalMode || cfg.CheckConfig || !cfg.SetupInterface || !cfg.SetupIPTables {
		fail("args must set up link and rules, not -local-mode or -check-config")
	}
	wantIPs := []string{testLocalDNS}
	if m == iptablesMode {
		wantIPs = append(wantIPs, testKubeDNS)
	}
	var gotIPs []string
	for _, a := range cfg.LocalIPs {
		gotIPs = append(gotIPs, a.String())
	}
	if !slices.Equal(gotIPs, wantIPs) {
		fail("%s mode: -localip %v, want %v", m, gotIPs, wantIPs)
	}
	if cfg.ClusterDomain != testDomain+"." {
		fail("-cluster-domain %q, want %q", cfg.ClusterDomain, testDomain)
	}
	if cfg.Port != 53 {
		fail("-port %d: pods ask port 53", cfg.Port)
	}

	// kube-dns through its own Service, never through an address we serve.
	var upstream *corev1.Service
	for _, s := range services(objs) {
		if env[strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))+"_SERVICE_HOST"] == cfg.KubeDNS.Addr().String() {
			upstream = s
		}
	}
	if upstream == nil {
		fail("kube-dns %s (%s) is not a Service of the manifest: want kube-dns-upstream, in front of the kube-dns pods", cfg.KubeDNS, cfg.KubeDNSSource)
	} else {
		if upstream.Spec.Selector["k8s-app"] != "kube-dns" || len(upstream.Spec.Selector) != 1 {
			fail("Service %s selects %v, want k8s-app: kube-dns", upstream.Name, upstream.Spec.Selector)
		}
		var protos []corev1.Protocol
		for _, p := range upstream.Spec.Ports {
			if p.Port != 53 || p.TargetPort != intstr.FromInt32(53) {
				fail("Service %s port %s: %d -> %s, want 53 -> 53", upstream.Name, p.Name, p.Port, p.TargetPort.String())
			}
			protos = append(protos, p.Protocol)
		}
		slices.Sort(protos)
		if !slices.Equal(protos, []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}) {
			fail("Service %s has protocols %v, want 53/UDP and 53/TCP", upstream.Name, protos)
		}
		if upstream.Spec.ClusterIP == corev1.ClusterIPNone {
			fail("Service %s is headless: the kubelet gives no NAME_SERVICE_HOST for it", upstream.Name)
		}
		// The kubelet sets the env only for Services that exist when the
		// pod is created: the Service comes first in the file.
		if slices.Index(objs, any(upstream)) > slices.Index(objs, any(ds)) {
			fail("Service %s comes after the DaemonSet: pods created before it lack its environment", upstream.Name)
		}
	}

	// Probes: exec, this container's instance, our state directory.
	if cfg.StateDir == "" {
		fail("-state-dir is off: no socket handover and no exec probes")
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		want  string
		need  bool
	}{
		{"livenessProbe", c.LivenessProbe, "health", true},
		{"readinessProbe", c.ReadinessProbe, "ready", true},
		{"startupProbe", c.StartupProbe, "ready", false},
	} {
		if p.probe == nil {
			if p.need {
				fail("no %s", p.name)
			}
			continue
		}
		if err := checkProbe(p.probe, p.want, cfg.StateDir, entrypoint); err != nil {
			fail("%s: %v", p.name, err)
		}
	}
	if c.StartupProbe != nil {
		// A start may wait 20 s for a twin, then for iptables-save.
		if window := time.Duration(c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold) * time.Second; window < 30*time.Second {
			fail("startupProbe allows %v, want at least 30s", window)
		}
	}

	// Security context: only the capabilities the daemon uses.
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		fail("no securityContext.capabilities")
	} else {
		var add []string
		for _, cp := range sc.Capabilities.Add {
			add = append(add, string(cp))
		}
		slices.Sort(add)
		if want := []string{"NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"}; !slices.Equal(add, want) {
			fail("capabilities add %v, want exactly %v (NET_ADMIN: link and rules; NET_RAW: iptables-legacy; NET_BIND_SERVICE: port 53)", add, want)
		}
		if !slices.Contains(sc.Capabilities.Drop, "ALL") {
			fail("capabilities must drop ALL first")
		}
		if sc.Privileged != nil && *sc.Privileged {
			fail("privileged: the capabilities above are enough")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			fail("allowPrivilegeEscalation must be false")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			fail("readOnlyRootFilesystem must be true: the daemon writes only to its mounts")
		}
		if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot {
			fail("runAsNonRoot: the state directory and the xtables lock are root's")
		}
	}

	// Volumes.
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	mounted := map[string]corev1.Volume{} // by mount path
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			fail("volumeMount %s names no volume", vm.Name)
			continue
		}
		mounted[vm.MountPath] = v
	}
	hostPath := func(mountPath, path string, typ corev1.HostPathType, why string) {
		v, ok := mounted[mountPath]
		switch {
		case !ok:
			fail("nothing mounted at %s (%s)", mountPath, why)
		case v.HostPath == nil || v.HostPath.Path != path || v.HostPath.Type == nil || *v.HostPath.Type != typ:
			fail("%s must be the host's %s (hostPath, type %s): %s", mountPath, path, typ, why)
		}
	}
	hostPath("/run/xtables.lock", "/run/xtables.lock", corev1.HostPathFileOrCreate, "the host's xtables lock, shared with kube-proxy")
	if cfg.StateDir != "" {
		hostPath(cfg.StateDir, cfg.StateDir, corev1.HostPathDirectoryOrCreate, "-state-dir, where the old and the new pod meet")
	}
	// The cache snapshot: in a directory of the pod's own, never in the
	// shared state directory (every pod that mounts it could read every
	// cached name, and write what the next start after a crash loads), in
	// memory the budget below counts, sized for the old file and the new.
	if snap := cfg.Cache.SnapshotDir; cfg.Cache.SnapshotInterval > 0 && snap == "" && cfg.StateDir != "" {
		fail("-cache-snapshot-dir is not set: the cache snapshot would be in the shared state directory %s, which every pod that mounts it can read", cfg.StateDir)
	} else if v, ok := mounted[snap]; cfg.Cache.SnapshotInterval > 0 && snap != "" && (!ok || v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory) {
		fail("-cache-snapshot-dir %s must be an emptyDir in memory (medium: Memory): the pod's own, found again by a restarted container", snap)
	} else if ok && v.EmptyDir != nil && (v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Value() < 2*cfg.Cache.SnapshotMaxBytes) {
		fail("-cache-snapshot-dir %s: sizeLimit %v below twice -cache-snapshot-max-bytes (%d MiB: the old file and the new one)", snap, v.EmptyDir.SizeLimit, 2*cfg.Cache.SnapshotMaxBytes>>20)
	}
	if cfg.KubeDNSConfigMap == "" {
		fail("-kubednscm is off: stubDomains and upstreamNameservers are ignored")
	} else if v, ok := mounted[cfg.KubeDNSConfigMap]; !ok || v.ConfigMap == nil || v.ConfigMap.Name != "kube-dns" {
		fail("the kube-dns ConfigMap is not mounted at -kubednscm %s", cfg.KubeDNSConfigMap)
	} else if v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional {
		fail("the kube-dns ConfigMap must be optional: most clusters have none")
	}

	// Resources against the cache's byte budget.
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().IsZero() {
		fail("requests must set cpu and memory")
	}
	if !lim.Cpu().IsZero() {
		fail("CPU limit %v: throttling a DNS server turns into client timeouts", lim.Cpu())
	}
	memLimit := lim.Memory().Value()
	if memLimit == 0 {
		fail("no memory limit")
	} else if req.Memory().Cmp(*lim.Memory()) > 0 {
		fail("memory request %v above the limit %v", req.Memory(), lim.Memory())
	}
	if !flagSet(args, "udp-sockets") {
		fail("-udp-sockets is not set: it would follow the node's core count, and the memory with it")
	}
	gml, err := parseGoMemLimit(env["GOMEMLIMIT"])
	if env["GOMEMLIMIT"] == "" || err != nil {
		fail("GOMEMLIMIT %q: without it the heap may reach twice the live data (%v)", env["GOMEMLIMIT"], err)
	}
	sockets := int64(cfg.UDPSockets * len(cfg.LocalIPs))
	listeners := int64(1) // metrics
	if cfg.HealthPort != 0 {
		listeners++
	}
	live := cfg.Cache.MaxBytes + sockets*udpSocketHeap + int64(cfg.MaxInflight)*(perMissHeap+perWaitingHeap) +
		int64(cfg.MaxTCPConns)*perTCPConnHeap + tcpAnswersHeap + listeners*httpListenerHeap + baseHeap + kubeDNSEndpointsHeap
	if float64(live) > (1-minGarbage)*float64(gml) {
		fail("memory: live heap %d MiB (cache %d MiB + overhead) leaves less than %.0f%% of GOMEMLIMIT %d MiB for garbage",
			live>>20, cfg.Cache.MaxBytes>>20, minGarbage*100, gml>>20)
	}
	// The collector's floor (internal/gcfloor: 1.125×DefaultFloor asked,
	// up to 1.25× kept) must fit between the live heap and GOMEMLIMIT, or
	// the limit, not the floor, spaces the collections of a busy node.
	if garbage := gml - live; garbage < gcfloor.DefaultFloor*5/4 {
		fail("memory: GOMEMLIMIT %d MiB leaves %d MiB over the live heap, less than the garbage collector's floor (%d MiB + 25%%)",
			gml>>20, garbage>>20, gcfloor.DefaultFloor>>20)
	}
	tcpKernel := int64(cfg.MaxTCPConns) * perTCPConnKernel
	// The cache snapshot in memory (checked above): its pages are charged
	// to the pod, the old file's and the new one's while it is replaced.
	var snapshot int64
	if cfg.Cache.SnapshotInterval > 0 && (cfg.StateDir != "" || cfg.Cache.SnapshotDir != "") {
		snapshot = 2 * cfg.Cache.SnapshotMaxBytes
	}
	if need := gml + sockets*socketRcvBuf + tcpKernel + childrenAndText + snapshot; memLimit < need {
		fail("memory: limit %d MiB below GOMEMLIMIT %d MiB + UDP socket buffers %d MiB + TCP socket buffers %d MiB + children %d MiB + cache snapshot %d MiB",
			memLimit>>20, gml>>20, sockets*socketRcvBuf>>20, tcpKernel>>20, childrenAndText>>20, snapshot>>20)
	}

	// Termination grace: the daemon's whole shutdown, as main computes it,
	// plus the watchdog's leeway.
	deadline := cfg.LameDuck + daemon.ShutdownBudget + daemon.WatchdogLeeway
	if g := ps.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= deadline {
		fail("terminationGracePeriodSeconds %v must exceed the shutdown deadline %v", ptrString(g), deadline)
	}

	// Metrics: reachable at the pod (= node) IP, scrape annotations and the
	// headless Service on the port the args configure.
	host, portStr, err := net.SplitHostPort(cfg.MetricsAddr)
	metricsPort, _ := strconv.Atoi(portStr)
	if err != nil || metricsPort == 0 {
		fail("-metrics-listen-address %q has no port", cfg.MetricsAddr)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		fail("-metrics-listen-address %q: Prometheus scrapes the node's IP, not %s", cfg.MetricsAddr, host)
	}
	a := tmpl.Annotations
	if a["prometheus.io/scrape"] != "true" {
		fail("annotation prometheus.io/scrape %q, want \"true\"", a["prometheus.io/scrape"])
	}
	if a["prometheus.io/port"] != strconv.Itoa(metricsPort) {
		fail("annotation prometheus.io/port %q, but the args serve metrics on %d", a["prometheus.io/port"], metricsPort)
	}
	if p, ok := a["prometheus.io/path"]; ok && p != "/metrics" {
		fail("annotation prometheus.io/path %q, want /metrics", p)
	}
	var metricsSvc *corev1.Service
	for _, s := range services(objs) {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			metricsSvc = s
		}
	}
	if metricsSvc == nil {
		fail("no headless metrics Service")
	} else {
		for k, v := range metricsSvc.Spec.Selector {
			if tmpl.Labels[k] != v {
				fail("metrics Service selector %s=%s does not select the pods", k, v)
			}
		}
		if len(metricsSvc.Spec.Selector) == 0 {
			fail("metrics Service has no selector")
		}
		if len(metricsSvc.Spec.Ports) != 1 || metricsSvc.Spec.Ports[0].Port != int32(metricsPort) ||
			metricsSvc.Spec.Ports[0].TargetPort != intstr.FromInt32(int32(metricsPort)) {
			fail("metrics Service ports %v, want %d -> %d (a number: there are no named containerPorts)", metricsSvc.Spec.Ports, metricsPort, metricsPort)
		}
	}
	return errs
}

func ptrString(p *int64) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatInt(*p, 10) + "s"
}

// checkProbe runs the probe's command with the daemon binary, with the state directory moved to an empty temporary one: a
// well-formed probe then fails with "no running nodelocaldns ... under DIR",
// naming what it asked; a bad flag exits 2.
func checkProbe(p *corev1.Probe, want, stateDir string, entrypoint []string) error {
	if p.Exec == nil || p.HTTPGet != nil || p.TCPSocket != nil || p.GRPC != nil {
		return errors.New("must be an exec probe: an HTTP probe may reach the other pod's instance on the same address")
	}
	cmd := p.Exec.Command
	if len(cmd) < 2 || len(entrypoint) == 0 || cmd[0] != entrypoint[0] {
		return fmt.Errorf("command %q does not run the image's %v", cmd, entrypoint)
	}
	if time.Duration(p.TimeoutSeconds)*time.Second <= daemon.ExecProbeTimeout {
		return fmt.Errorf("timeoutSeconds %d: the probe itself may take %v", p.TimeoutSeconds, daemon.ExecProbeTimeout)
	}
	tmp, err := os.MkdirTemp("", "nld-probe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	args := slices.Clone(cmd[1:])
	probeDir := config.DefaultStateDir
	found := false
	for i, a := range args {
		switch {
		case (a == "-state-dir" || a == "--state-dir") && i+1 < len(args):
			probeDir, args[i+1], found = args[i+1], tmp, true
		case strings.HasPrefix(a, "-state-dir=") || strings.HasPrefix(a, "--state-dir="):
			probeDir, args[i], found = a[strings.IndexByte(a, '=')+1:], "-state-dir="+tmp, true
		}
	}
	if !found {
		args = append(args, "-state-dir", tmp)
	}
	if probeDir != stateDir {
		return fmt.Errorf("asks -state-dir %s, the daemon's is %s", probeDir, stateDir)
	}
	if !slices.Contains(args, "-probe") && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-probe=") }) {
		return fmt.Errorf("command %q is not -probe", cmd)
	}
	var stdout, stderr bytes.Buffer
	code, err := runBinary(args, &stdout, &stderr)
	if err != nil {
		return err
	}
	wantMsg := fmt.Sprintf("nodelocaldns: %s: no running nodelocaldns in this PID namespace under %s", want, tmp)
	if code != 1 || !strings.HasPrefix(stderr.String(), wantMsg) {
		return fmt.Errorf("command %q: exit %d %q, want exit 1 %q", cmd, code, stderr.String(), wantMsg)
	}
	return nil
}

// kubectlFiles are what `kubectl apply -f deploy/` reads: the directory's
// own .yaml, .yml and .json files.
func kubectlFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, ext := range []string{"*.yaml", "*.yml", "*.json"} {
		m, _ := filepath.Glob(filepath.Join(repoRoot, "deploy", ext))
		out = append(out, m...)
	}
	if len(out) == 0 {
		t.Fatal("no manifests in deploy/")
	}
	return out
}

// TestDeployDecodesStrictly: every YAML document under deploy/ is a
// Kubernetes object of a known kind with no unknown field, and everything
// `kubectl apply -f deploy/` would read is one (the Grafana dashboard lives
// in a subdirectory, which kubectl does not read without -R).
func TestDeployDecodesStrictly(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range kubectlFiles(t) {
		seen[f] = true
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if objs, err := decodeObjects(data); err != nil || len(objs) == 0 {
			t.Errorf("%s: %d objects, %v", f, len(objs), err)
		}
	}
	err := filepath.WalkDir(filepath.Join(repoRoot, "deploy"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || seen[p] {
			return err
		}
		switch filepath.Ext(p) {
		case ".yaml", ".yml":
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if _, err := decodeObjects(data); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		case ".json":
			if filepath.Dir(p) != filepath.Join(repoRoot, "deploy", "grafana") {
				t.Errorf("%s: JSON outside deploy/grafana/, and not a Kubernetes object", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDeployManifest checks every invariant of the DaemonSet in both
// deployment modes, and runs -check-config with its args and the kubelet's
// environment.
func TestDeployManifest(t *testing.T) {
	entry := dockerfileEntrypoint(t)
	for _, m := range []mode{iptablesMode, ipvsMode} {
		t.Run(string(m), func(t *testing.T) {
			objs := loadManifest(t, m)
			rc := nodeResolvConf(t)
			for _, err := range checkDeployment(objs, m, entry, rc) {
				t.Error(err)
			}
			// -check-config with the same args and environment.
			c := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
			env := podEnv(objs, "kube-system", c)
			for k, v := range env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			args := append(containerArgs(c, env), "-resolv-conf="+rc, "-check-config")
			if code, err := runBinary(args, &stdout, &stderr); err != nil || code != 0 || !strings.Contains(stdout.String(), "configuration is valid") {
				t.Fatalf("-check-config: exit %d, %v\n%s%s", code, err, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), "kube-dns:         10.96.0.11:53 (from $KUBE_DNS_UPSTREAM_SERVICE_HOST)") {
				t.Errorf("-check-config does not forward to kube-dns-upstream:\n%s", stdout.String())
			}
		})
	}
}

// TestDeployAutopathTurnedOn: what docs/autopath.md tells operators to do
// (uncomment -autopath, apply deploy/autopath/rbac.yaml; the token is
// mounted already) gives a manifest that passes every check and a
// configuration with autopath on.
func TestDeployAutopathTurnedOn(t *testing.T) {
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, edit := range [][2]string{
		{"# - -autopath", "- -autopath"},
	} {
		if strings.Count(text, edit[0]) != 1 {
			t.Fatalf("the manifest does not have exactly one %q", edit[0])
		}
		text = strings.Replace(text, edit[0], edit[1], 1)
	}
	objs, err := decodeObjects([]byte(substitute(text, iptablesMode)))
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, loadAutopathRBAC(t)...)
	rc := nodeResolvConf(t)
	for _, err := range checkDeployment(objs, iptablesMode, dockerfileEntrypoint(t), rc) {
		t.Error(err)
	}
	c := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", c)
	cfg, err := config.Parse(append(containerArgs(c, env), "-resolv-conf="+rc), func(k string) string { return env[k] }, io.Discard)
	if err != nil || !cfg.Autopath.Enabled || cfg.Autopath.NodeName != "node-1" {
		t.Errorf("config with -autopath: %+v %v", cfg, err)
	}
}

// TestDeployPlaceholdersFailLoudly: applied without substitution, the
// daemon exits 2 with one line naming the token, instead of half-working.
func TestDeployPlaceholdersFailLoudly(t *testing.T) {
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(raw)
	if err != nil {
		t.Fatal(err)
	}
	c := &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	env := podEnv(objs, "kube-system", c)
	_, err = config.Parse(append(containerArgs(c, env), "-resolv-conf="+nodeResolvConf(t)), func(k string) string { return env[k] }, io.Discard)
	if !errors.Is(err, config.ErrUsage) || !strings.Contains(err.Error(), "__PILLAR__LOCAL__DNS__") {
		t.Fatalf("raw manifest: %v, want a usage error naming the token", err)
	}
	for _, tok := range []string{"__PILLAR__LOCAL__DNS__", "__PILLAR__DNS__SERVER__", "__PILLAR__DNS__DOMAIN__", "__NODELOCALDNS__IMAGE__"} {
		if !bytes.Contains(raw, []byte(tok)) {
			t.Errorf("token %s, documented in docs/deploy.md, is not in the manifest", tok)
		}
	}
	if left := regexp.MustCompile(`__[A-Z_]+__`).FindAllString(substitute(string(raw), iptablesMode), -1); len(left) > 0 {
		t.Errorf("tokens the docs do not substitute: %v", left)
	}
}

// TestDeployChecksCatchMistakes shows that each check bites: one mistake
// at a time, made in memory, must be reported.
func TestDeployChecksCatchMistakes(t *testing.T) {
	entry := dockerfileEntrypoint(t)
	rc := nodeResolvConf(t)
	container := func(objs []any) *corev1.Container {
		return &daemonSets(objs)[0].Spec.Template.Spec.Containers[0]
	}
	pod := func(objs []any) *corev1.PodSpec { return &daemonSets(objs)[0].Spec.Template.Spec }
	setArg := func(objs []any, name, value string) {
		c := container(objs)
		for i, a := range c.Args {
			if strings.HasPrefix(a, "-"+name+"=") {
				c.Args[i] = "-" + name + "=" + value
				return
			}
		}
		c.Args = append(c.Args, "-"+name+"="+value)
	}
	tests := []struct {
		name   string
		mutate func(objs []any)
		want   string
	}{
		{"misspelt flag", func(o []any) { container(o).Args[1] = "-upstreamscv=kube-dns-upstream" }, "flag provided but not defined: -upstreamscv"},
		{"invalid flag value", func(o []any) { setArg(o, "lameduck", "5") }, "-lameduck"},
		{"unknown flag", func(o []any) { container(o).Args = append(container(o).Args, "-frobnicate=1") }, "not defined: -frobnicate"},
		{"forwarding to kube-dns itself", func(o []any) { setArg(o, "upstreamsvc", "kube-dns") }, "forwarding there loops"},
		{"a containerPort", func(o []any) {
			container(o).Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9253, Protocol: corev1.ProtocolTCP}}
		}, "containerPorts"},
		{"no toleration", func(o []any) { pod(o).Tolerations = nil }, "toleration"},
		{"toleration of one taint only", func(o []any) {
			pod(o).Tolerations = []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}}
		}, "toleration"},
		{"no host network", func(o []any) { pod(o).HostNetwork = false }, "hostNetwork"},
		{"cluster DNS policy", func(o []any) { pod(o).DNSPolicy = corev1.DNSClusterFirst }, "dnsPolicy"},
		{"no priority class", func(o []any) { pod(o).PriorityClassName = "" }, "priorityClassName"},
		{"hostPID", func(o []any) { pod(o).HostPID = true }, "hostPID"},
		{"maxSurge 0", func(o []any) {
			s := intstr.FromInt32(0)
			daemonSets(o)[0].Spec.UpdateStrategy.RollingUpdate.MaxSurge = &s
		}, "maxSurge"},
		{"maxUnavailable 1", func(o []any) {
			s := intstr.FromInt32(1)
			daemonSets(o)[0].Spec.UpdateStrategy.RollingUpdate.MaxUnavailable = &s
		}, "maxUnavailable"},
		{"grace below the shutdown deadline", func(o []any) { g := int64(15); pod(o).TerminationGracePeriodSeconds = &g }, "terminationGracePeriodSeconds"},
		{"grace fits the default lame duck only", func(o []any) { setArg(o, "lameduck", "20s") }, "terminationGracePeriodSeconds"},
		{"no NET_ADMIN", func(o []any) {
			container(o).SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW", "NET_BIND_SERVICE"}
		}, "NET_ADMIN"},
		{"one capability too many", func(o []any) {
			cp := container(o).SecurityContext.Capabilities
			cp.Add = append(cp.Add, "SYS_ADMIN")
		}, "capabilities add"},
		{"privileged", func(o []any) { p := true; container(o).SecurityContext.Privileged = &p }, "privileged"},
		{"no xtables lock", func(o []any) {
			c := container(o)
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == "/run/xtables.lock" })
		}, "xtables"},
		{"xtables lock as a directory", func(o []any) {
			for i := range pod(o).Volumes {
				if v := &pod(o).Volumes[i]; v.HostPath != nil && v.HostPath.Path == "/run/xtables.lock" {
					typ := corev1.HostPathDirectoryOrCreate
					v.HostPath.Type = &typ
				}
			}
		}, "xtables"},
		{"kube-dns ConfigMap required", func(o []any) {
			for i := range pod(o).Volumes {
				if v := &pod(o).Volumes[i]; v.ConfigMap != nil {
					f := false
					v.ConfigMap.Optional = &f
				}
			}
		}, "optional"},
		{"ConfigMap mounted elsewhere", func(o []any) { setArg(o, "kubednscm", "/etc/coredns") }, "-kubednscm"},
		{"state dir not mounted", func(o []any) { setArg(o, "state-dir", "/var/run/nld") }, "state-dir"},
		{"HTTP liveness probe", func(o []any) {
			container(o).LivenessProbe.ProbeHandler = corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}}
		}, "exec probe"},
		{"probe asks the wrong state dir", func(o []any) {
			container(o).ReadinessProbe.Exec.Command = []string{"/nodelocaldns", "-probe", "ready", "-state-dir", "/tmp/elsewhere"}
		}, "state-dir"},
		{"probe with a bad flag", func(o []any) {
			container(o).LivenessProbe.Exec.Command = []string{"/nodelocaldns", "-probe", "health", "-state-dir", "/run/nodelocaldns", "-verbose"}
		}, "exit 2"},
		{"readiness asks health", func(o []any) {
			container(o).ReadinessProbe.Exec.Command = []string{"/nodelocaldns", "-probe", "health", "-state-dir", "/run/nodelocaldns"}
		}, "readinessProbe"},
		{"probe runs another binary", func(o []any) { container(o).LivenessProbe.Exec.Command[0] = "/usr/bin/nodelocaldns" }, "image's"},
		{"scrape port differs", func(o []any) { daemonSets(o)[0].Spec.Template.Annotations["prometheus.io/port"] = "9353" }, "prometheus.io/port"},
		{"metrics on the link-local address", func(o []any) { setArg(o, "metrics-listen-address", testLocalDNS+":9253") }, "node's IP"},
		{"metrics moved, annotations not", func(o []any) { setArg(o, "metrics-listen-address", ":9254") }, "prometheus.io/port"},
		{"memory limit below the budget", func(o []any) { container(o).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("128Mi") }, "memory: limit"},
		{"cache snapshot over the memory budget", func(o []any) { setArg(o, "cache-snapshot-max-bytes", "32Mi") }, "cache snapshot 64 MiB"},
		{"cache snapshot over its volume", func(o []any) { setArg(o, "cache-snapshot-max-bytes", "12Mi") }, "sizeLimit 16Mi below twice"},
		{"cache snapshot in the shared state directory", func(o []any) {
			container(o).Args = slices.DeleteFunc(container(o).Args, func(a string) bool { return strings.HasPrefix(a, "-cache-snapshot-dir") })
		}, "-cache-snapshot-dir is not set"},
		{"cache snapshot on a host path", func(o []any) { setArg(o, "cache-snapshot-dir", "/run/nodelocaldns") }, "must be an emptyDir in memory"},
		{"cache budget raised alone", func(o []any) { setArg(o, "cache-max-bytes", "256Mi") }, "memory: live heap"},
		{"UDP sockets per core", func(o []any) {
			container(o).Args = slices.DeleteFunc(container(o).Args, func(a string) bool { return strings.HasPrefix(a, "-udp-sockets") })
		}, "-udp-sockets"},
		{"no GOMEMLIMIT", func(o []any) { container(o).Env = nil }, "GOMEMLIMIT"},
		{"GOMEMLIMIT with no room for the GC floor", func(o []any) {
			// Live heap ~24.7 MiB: within 75% of 34 MiB, 9.3 MiB under it.
			setArg(o, "cache-max-bytes", "4Mi")
			setArg(o, "max-inflight", "16")
			for i, e := range container(o).Env {
				if e.Name == "GOMEMLIMIT" {
					container(o).Env[i].Value = "34MiB"
				}
			}
		}, "garbage collector's floor"},
		{"CPU limit", func(o []any) { container(o).Resources.Limits[corev1.ResourceCPU] = resource.MustParse("100m") }, "CPU limit"},
		{"no upstream Service", func(o []any) {
			for i, x := range o {
				if s, ok := x.(*corev1.Service); ok && s.Name == "kube-dns-upstream" {
					o[i] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "kube-system"}}
				}
			}
		}, "$KUBE_DNS_UPSTREAM_SERVICE_HOST is not set"},
		{"upstream Service without TCP", func(o []any) {
			for _, s := range services(o) {
				if s.Name == "kube-dns-upstream" {
					s.Spec.Ports = s.Spec.Ports[:1]
				}
			}
		}, "53/UDP and 53/TCP"},
		{"headless metrics Service on another port", func(o []any) {
			for _, s := range services(o) {
				if s.Spec.ClusterIP == corev1.ClusterIPNone {
					s.Spec.Ports[0].TargetPort = intstr.FromString("metrics")
				}
			}
		}, "metrics Service ports"},
		{"token not mounted", func(o []any) {
			f := false
			pod(o).AutomountServiceAccountToken = &f
		}, "token is not mounted"},
		{"Role grants more than watching endpointslices", func(o []any) {
			for _, x := range o {
				if r, ok := x.(*rbacv1.Role); ok {
					r.Rules[0].Resources = append(r.Rules[0].Resources, "secrets")
				}
			}
		}, "want exactly list/watch on discovery.k8s.io endpointslices"},
		{"-autopath without the token", func(o []any) {
			f := false
			pod(o).AutomountServiceAccountToken = &f
			pod(o).Containers[0].Args = append(pod(o).Containers[0].Args, "-autopath")
		}, "-autopath without the service account token"},
		{"-autopath without its grant", func(o []any) {
			pod(o).Containers[0].Args = append(pod(o).Containers[0].Args, "-autopath")
		}, "no ClusterRoleBinding gives ServiceAccount kube-system/nodelocaldns the pod watch's rights"},
		{"no NODE_NAME", func(o []any) {
			pod(o).Containers[0].Env = slices.DeleteFunc(pod(o).Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" })
		}, "NODE_NAME"},
	}
	// With deploy/autopath/rbac.yaml applied beside the manifest.
	withAutopath := func(o []any) []any { return append(o, loadAutopathRBAC(t)...) }
	for _, tc := range []struct {
		name     string
		autopath bool // -autopath on
		mutate   func([]any)
		want     string
	}{
		{"the pods' grant with -autopath off", false, func([]any) {}, "grants the service account cluster-wide rights with -autopath off"},
		{"the pods' grant with get", true, func(o []any) {
			for _, x := range o {
				if r, ok := x.(*rbacv1.ClusterRole); ok {
					r.Rules[0].Verbs = append([]string{"get"}, r.Rules[0].Verbs...)
				}
			}
		}, "want exactly list/watch on pods"},
		{"the pods' grant reads secrets too", true, func(o []any) {
			for _, x := range o {
				if r, ok := x.(*rbacv1.ClusterRole); ok {
					r.Rules[0].Resources = append(r.Rules[0].Resources, "secrets")
				}
			}
		}, "want exactly list/watch on pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := withAutopath(loadManifest(t, iptablesMode))
			if tc.autopath {
				pod(objs).Containers[0].Args = append(pod(objs).Containers[0].Args, "-autopath")
			}
			tc.mutate(objs)
			for _, err := range checkDeployment(objs, iptablesMode, entry, rc) {
				if strings.Contains(err.Error(), tc.want) {
					t.Log(err)
					return
				}
			}
			t.Errorf("no error mentions %q", tc.want)
		})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := loadManifest(t, iptablesMode)
			tc.mutate(objs)
			errs := checkDeployment(objs, iptablesMode, entry, rc)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					t.Log(err)
					return
				}
			}
			t.Errorf("no error mentions %q; got %v", tc.want, errs)
		})
	}

	// Strict decoding: a misspelt field is an error, not silently dropped.
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, typo := range [][2]string{
		{"hostNetwork: true", "hostNetwrok: true"},
		{"maxSurge: 1", "maxsurge: 1"},
		{"readOnly: true", "readonly: true"},
	} {
		bad := strings.Replace(substitute(string(raw), iptablesMode), typo[0], typo[1], 1)
		if _, err := decodeObjects([]byte(bad)); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%q: decoded without an unknown-field error: %v", typo[1], err)
		}
	}
	if _, err := decodeObjects([]byte("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n")); err == nil {
		t.Error("an unknown kind decoded")
	}
}

// TestGrafanaDashboard: valid JSON, a Prometheus data source variable, and
// panels that graph only metrics the daemon has (docs/metrics.md), covering
// what docs/deploy.md's troubleshooting section points at.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name, Type, Query string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || d.UID == "" {
		t.Error("dashboard needs a title and a uid")
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool {
		return v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Error("no Prometheus data source variable: the dashboard would be bound to one Grafana's data source")
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	metricName := regexp.MustCompile(`\b(nodelocaldns_[a-z_]+|process_[a-z_]+|go_[a-z_]+)`)
	documented := map[string]bool{}
	for _, n := range metricName.FindAllString(string(doc), -1) {
		documented[n] = true
	}
	used := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
				if strings.HasPrefix(n, "nodelocaldns_") && !documented[base] {
					t.Errorf("panel %q graphs %s, which docs/metrics.md does not list", p.Title, n)
				}
				used[base] = true
			}
		}
	}
	for _, n := range []string{
		"nodelocaldns_responses_total", "nodelocaldns_requests_total", "nodelocaldns_cache_hits_total",
		"nodelocaldns_cache_misses_total", "nodelocaldns_cache_bytes", "nodelocaldns_upstream_request_duration_seconds",
		"nodelocaldns_upstream_failures_total", "nodelocaldns_upstream_healthy", "nodelocaldns_forward_errors_total",
		"nodelocaldns_setup_errors_total", "process_resident_memory_bytes",
	} {
		if !used[n] {
			t.Errorf("no panel graphs %s", n)
		}
	}
}

// autopathRBACPath is -autopath's grant, applied with it only.
var autopathRBACPath = repoRoot + "/deploy/autopath/rbac.yaml"

// loadAutopathRBAC decodes deploy/autopath/rbac.yaml.
func loadAutopathRBAC(t *testing.T) []any {
	t.Helper()
	raw, err := os.ReadFile(autopathRBACPath)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(raw)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// clusterBindings names the ClusterRoleBindings that bind sa.
func clusterBindings(objs []any, sa *corev1.ServiceAccount) []string {
	var out []string
	for _, o := range objs {
		if b, ok := o.(*rbacv1.ClusterRoleBinding); ok && slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa.Name && s.Namespace == sa.Namespace
		}) {
			out = append(out, b.Name)
		}
	}
	return out
}

// checkAutopathAccess: the service account may list and watch pods
// (nothing more: the informer never gets one pod).
func checkAutopathAccess(objs []any, sa *corev1.ServiceAccount) []error {
	return checkGrant(objs, sa, "ClusterRole", "the pod watch's",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
}

// checkNodeName: the pod knows its node's name (the kube-dns endpoint
// watch's choice per node, -autopath's pod watch).
func checkNodeName(ps *corev1.PodSpec) []error {
	var errs []error
	nodeName := false
	for _, c := range ps.Containers {
		for _, e := range c.Env {
			if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
				nodeName = true
			}
		}
	}
	if !nodeName {
		errs = append(errs, errors.New("no NODE_NAME from the downward API (spec.nodeName): the kube-dns endpoint watch (each node's own subset) and -autopath need it"))
	}
	return errs
}

// checkEndpointAccess: the service account may list and watch
// EndpointSlices in its own namespace (kube-dns-upstream's), get Service
// kube-dns (which address is kube-dns' ClusterIP: the fallback) and its own
// DaemonSet (on exit: an uninstall or a rollout?), nothing more.
func checkEndpointAccess(objs []any, sa *corev1.ServiceAccount) []error {
	return checkGrant(objs, sa, "Role", "the kube-dns endpoint watch's and the fallback's",
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: []string{"kube-dns"}, Verbs: []string{"get"}},
		rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{"nodelocaldns"}, Verbs: []string{"get"}})
}

// checkGrant: a binding of kind (ClusterRole: a ClusterRoleBinding; Role:
// a RoleBinding to a Role in the service account's namespace) gives sa
// exactly the rules want, in that order, and nothing more.
func checkGrant(objs []any, sa *corev1.ServiceAccount, kind, what string, want ...rbacv1.PolicyRule) []error {
	type role struct {
		ns    string
		rules []rbacv1.PolicyRule
	}
	type binding struct {
		name     string
		ref      rbacv1.RoleRef
		subjects []rbacv1.Subject
	}
	roles := map[string]role{}
	var bindings []binding
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			if kind == "ClusterRole" {
				roles[o.Name] = role{rules: o.Rules}
			}
		case *rbacv1.Role:
			if kind == "Role" {
				roles[o.Name] = role{ns: o.Namespace, rules: o.Rules}
			}
		case *rbacv1.ClusterRoleBinding:
			if kind == "ClusterRole" {
				bindings = append(bindings, binding{o.Name, o.RoleRef, o.Subjects})
			}
		case *rbacv1.RoleBinding:
			if kind == "Role" {
				bindings = append(bindings, binding{o.Name, o.RoleRef, o.Subjects})
			}
		}
	}
	var errs []error
	bound := false
	for _, b := range bindings {
		for _, s := range b.subjects {
			if s.Kind != rbacv1.ServiceAccountKind || s.Name != sa.Name || s.Namespace != sa.Namespace {
				continue
			}
			r, ok := roles[b.ref.Name]
			if b.ref.Kind != kind || !ok || kind == "Role" && r.ns != sa.Namespace {
				errs = append(errs, fmt.Errorf("%sBinding %s refers to %s %q, not a %s of the manifest (in %s)", kind, b.name, b.ref.Kind, b.ref.Name, kind, sa.Namespace))
				continue
			}
			same := len(r.rules) == len(want)
			for i := 0; same && i < len(want); i++ {
				same = slices.Equal(r.rules[i].APIGroups, want[i].APIGroups) && slices.Equal(r.rules[i].Resources, want[i].Resources) &&
					slices.Equal(r.rules[i].Verbs, want[i].Verbs) && slices.Equal(r.rules[i].ResourceNames, want[i].ResourceNames) &&
					len(r.rules[i].NonResourceURLs) == 0
			}
			if !same {
				var on []string
				for _, w := range want {
					o := strings.Join(w.Verbs, "/") + " on " + strings.Join(w.Resources, ",")
					if g := strings.Join(w.APIGroups, ","); g != "" {
						o = strings.Join(w.Verbs, "/") + " on " + g + " " + strings.Join(w.Resources, ",")
					}
					if len(w.ResourceNames) > 0 {
						o += " " + strings.Join(w.ResourceNames, ",")
					}
					on = append(on, o)
				}
				errs = append(errs, fmt.Errorf("%s %s grants %+v, want exactly %s", kind, b.ref.Name, r.rules, strings.Join(on, "; ")))
			}
			bound = true
		}
	}
	if !bound {
		errs = append(errs, fmt.Errorf("no %sBinding gives ServiceAccount %s/%s %s rights", kind, sa.Namespace, sa.Name, what))
	}
	return errs
}
