package dropin

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// stockArgs are the reference manifest's container args; the corpus adds
// -setupiptables=false everywhere (the rules are not what is compared, and
// this host may lack the iptables binaries the stock runs).
var stockArgs = []string{"-localip", "169.254.20.10,10.96.0.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-setupiptables=false"}

// lrpArgs are the Local Redirect Policy mode's: no interface, no rules, no
// teardown (the pod has its own network namespace).
var lrpArgs = []string{"-localip", "169.254.20.10,10.96.0.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream",
	"-skipteardown=true", "-setupinterface=false", "-setupiptables=false"}

// wildcardDiff was what bind 0.0.0.0 served differently (a socket per
// address at start, where the stock's one *:53 socket also answers on
// 127.0.0.2 and on addresses added later). Ours is one wildcard socket
// now (internal/server/wildcard_linux.go): the same addresses.
const wildcardDiff = ""

func corpusCases(t *testing.T) []corpusCase {
	ref := referenceCorefile(t, false)
	// IPVS mode forwards to the kube-dns ClusterIP, which is not local:
	// the stand-in's address stands for it.
	ipvs := strings.ReplaceAll(referenceCorefile(t, true), "forward . 10.96.0.10", "forward . "+oracleKubeDNS)
	return []corpusCase{
		{
			name:   "k8s-reference-iptables",
			source: "kubernetes/kubernetes cluster/addons/dns/nodelocaldns/nodelocaldns.yaml (iptables mode)",
			base:   ref, args: stockArgs,
		},
		{
			name:   "k8s-reference-ipvs",
			source: "kubernetes/kubernetes cluster/addons/dns/nodelocaldns/nodelocaldns.yaml, the docs' IPVS-mode sed",
			base:   ipvs, args: []string{"-localip", "169.254.20.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-setupiptables=false"},
		},
		{
			// The pod network namespace: bind 0.0.0.0, health on the pod's
			// own address; Cilium redirects the kube-dns ClusterIP to it.
			name:     "cilium-lrp-example",
			source:   "cilium/cilium examples/kubernetes-local-redirect/node-local-dns.yaml",
			base:     lrpCorefile("health"),
			args:     lrpArgs,
			addrDiff: wildcardDiff,
		},
		{
			// use_cilium_lrp: the chart's four blocks with bind 0.0.0.0,
			// health without an address, prometheus :9253.
			name:     "rke2-use_cilium_lrp",
			source:   "rancher/rke2-charts packages/rke2-coredns/charts/templates/_helpers.tpl (nodelocal.bindPlugin, nodelocal.healthPlugin with use_cilium_lrp)",
			base:     rke2Corefile(true),
			args:     lrpArgs,
			addrDiff: wildcardDiff,
		},
		{
			name:   "rke2-nodelocal",
			source: "rancher/rke2-charts packages/rke2-coredns/charts/templates/_helpers.tpl (use_cilium_lrp false)",
			base:   rke2Corefile(false),
			args:   stockArgs,
		},
		{
			// bind by interface name: eth0's addresses (its IPv6
			// link-local one too, with the interface as zone), lo's.
			name:   "bind-iface",
			source: "CoreDNS's bind plugin (plugin/bind/README.md: bind lo, bind ADDRESS|IFACE ... { except ... })",
			base:   ".:53 {\n    errors\n    cache 30\n    bind eth0 lo\n    forward . __PILLAR__CLUSTER__DNS__ {\n        force_tcp\n    }\n}\n",
			args:   lrpArgs,
		},
		{
			name:   "bind-except",
			source: "CoreDNS's bind plugin (plugin/bind/README.md)",
			base:   ".:53 {\n    errors\n    cache 30\n    bind eth0 lo {\n        except 127.0.0.1 " + podIPv6 + "\n    }\n    forward . __PILLAR__CLUSTER__DNS__ {\n        force_tcp\n    }\n}\n",
			args:   lrpArgs,
		},
		{
			// bind 0.0.0.0 beside -setupinterface: the node's addresses
			// and the link-local ones it creates.
			name:     "bind-wildcard-hostnetwork",
			source:   "the reference Corefile with bind 0.0.0.0 (kubernetes/kubernetes nodelocaldns.yaml)",
			base:     strings.ReplaceAll(ref, "bind 169.254.20.10 10.96.0.10", "bind 0.0.0.0"),
			args:     stockArgs,
			addrDiff: wildcardDiff,
		},
		{
			// Kubespray renders the Corefile itself (no Corefile.base):
			// nodelocaldns_ip 169.254.25.10, health port 9254, the
			// coredns Service (skydns_server, here the stand-in) for the
			// cluster zones, /etc/resolv.conf for the rest.
			name:   "kubespray",
			source: "kubernetes-sigs/kubespray@46dbdd39 roles/kubernetes-apps/ansible/templates/nodelocaldns-config.yml.j2, nodelocaldns-daemonset.yml.j2 (defaults)",
			conf:   kubesprayCorefile(oracleKubeDNS, ""),
			args:   kubesprayArgs,
		},
		{
			// dns_mode coredns_dual: forwardTarget is both coredns
			// Services. Both answer here; with the first down the stock
			// fails over to the second (as ours: one group with failover).
			name:   "kubespray-coredns_dual",
			source: "kubernetes-sigs/kubespray@46dbdd39 roles/kubernetes-apps/ansible/tasks/main.yml (forwardTarget), nodelocaldns-config.yml.j2",
			conf:   kubesprayCorefile(oracleKubeDNS+" "+kubeDNSTwo, ""),
			args:   kubesprayArgs,
		},
		{
			// coredns_dual with the first coredns Service not answering
			// (nothing routes 10.96.0.13): both fail over to the second
			// (one group with the block's policy and failover).
			name:            "kubespray-coredns_dual-first-down",
			stockMayTimeOut: "its random policy picks the dead server, and its retry may outlast the client's 3 s",
			source:          "kubernetes-sigs/kubespray@46dbdd39 roles/kubernetes-apps/ansible/tasks/main.yml (forwardTarget), the first Service down",
			conf:            kubesprayCorefile("10.96.0.13 "+kubeDNSTwo, ""),
			args:            kubesprayArgs,
		},
		{
			// nodelocaldns_external_zones, the inventory sample's first
			// and third zones (nameservers: the stand-ins): a key on port
			// 1053, a rewrite, log in those blocks only. Probed on port
			// 53: example.com from its block (cache 5: denial TTL 5),
			// example.io from "." (cache 30).
			name:   "kubespray-external-zones",
			source: "kubernetes-sigs/kubespray@46dbdd39 inventory/sample/group_vars/k8s_cluster/k8s-cluster.yml (nodelocaldns_external_zones), nodelocaldns-config.yml.j2",
			conf:   kubesprayExternalZones,
			args:   kubesprayArgs,
			extra:  externalZonesQuestions,
		},
		{
			// The same, probed on port 1053: example.io from its block,
			// every other name REFUSED (no block there), as CoreDNS.
			name:   "kubespray-external-zones-1053",
			source: "kubernetes-sigs/kubespray@46dbdd39 inventory/sample/group_vars/k8s_cluster/k8s-cluster.yml (nodelocaldns_external_zones), nodelocaldns-config.yml.j2",
			conf:   kubesprayExternalZones,
			args:   kubesprayArgs,
			port:   1053,
			extra:  externalZonesQuestions,
		},
		{
			name:   "kops",
			source: "kubernetes/kops upup/models/cloudup/resources/addons/nodelocaldns.addons.k8s.io/k8s-1.12.yaml.template (ForwardToKubeDNS false)",
			base:   kopsCorefile(false),
			args:   kopsArgs,
		},
		{
			name:   "kops-forward-to-kube-dns",
			source: "kubernetes/kops nodelocaldns.addons.k8s.io/k8s-1.12.yaml.template (ForwardToKubeDNS true)",
			base:   kopsCorefile(true),
			args:   kopsArgs,
		},
		{
			// A kops user's node-local Corefile (coredns/coredns#2340,
			// #4066): log . { class denial error } in the "." block.
			name:   "kops-log-class",
			source: "coredns/coredns issues 2340 and 4066 (kops node-local-dns Corefiles with log classes)",
			base:   strings.Replace(kopsCorefile(false), "forward . __PILLAR__UPSTREAM__SERVERS__", "forward . __PILLAR__UPSTREAM__SERVERS__\n    log . {\n      class denial error\n    }", 1),
			args:   kopsArgs,
		},
		{
			// The chart's defaults: bind 0.0.0.0 on the host network,
			// commProtocol force_tcp, health :8080, an empty forward
			// block in ".", -setupinterface and -setupiptables true.
			name:     "deliveryhero",
			source:   "deliveryhero/helm-charts@0369ea0e stable/node-local-dns/templates/configmap.yaml, values.yaml (defaults; dnsServer is the kube-dns ClusterIP)",
			base:     deliveryheroCorefile(false),
			args:     deliveryheroArgs,
			addrDiff: wildcardDiff,
		},
		{
			name:     "deliveryhero-logging-prefetch",
			source:   "deliveryhero/helm-charts@0369ea0e stable/node-local-dns/templates/configmap.yaml (enableLogging, prefetch.enabled)",
			base:     deliveryheroCorefile(true),
			args:     deliveryheroArgs,
			addrDiff: wildcardDiff,
		},
		{
			// The chart's defaults: three blocks, all forwarding to the
			// node's resolvers, log . combined { class all }.
			name:   "lablabs",
			source: "lablabs/k8s-nodelocaldns-helm@011d48d5 charts/node-local-dns/templates/configmap.yaml, daemonset.yaml, values.yaml (defaults)",
			base:   lablabsCorefile(false),
			args:   lablabsArgs,
		},
		{
			// config.cilium set: bind 0.0.0.0, health on the pod's
			// addresses, the pod network (setupInterface stays true).
			name:     "lablabs-cilium",
			source:   "lablabs/k8s-nodelocaldns-helm@011d48d5 charts/node-local-dns/templates/configmap.yaml (config.cilium)",
			base:     lablabsCorefile(true),
			args:     lablabsArgs,
			addrDiff: wildcardDiff,
		},
		{
			// RKE1's NodelocalTemplateV115: force_tcp on the "." forward
			// too (to the node's resolvers): both ask them over TCP.
			name:   "rke1-v115-force_tcp",
			source: "rancher/kontainer-driver-metadata@dc022571 pkg/rke/templates/nodelocal.go (NodelocalTemplateV115)",
			base:   strings.Replace(ref, "forward . __PILLAR__UPSTREAM__SERVERS__", "forward . __PILLAR__UPSTREAM__SERVERS__ {\n            force_tcp\n    }", 1),
			args:   stockArgs,
		},
		{
			name:   "rke1-v121",
			source: "rancher/kontainer-driver-metadata@dc022571 pkg/rke/templates/nodelocal.go (NodelocalTemplateV121, the reference manifest's Corefile)",
			base:   ref,
			args:   stockArgs,
		},
		{
			// Gardener's Corefile with its defaults (force_tcp to the
			// cluster DNS and to the upstream servers, health on 8099) and
			// the imports of the node-local-dns-custom ConfigMap's
			// *.override and *.server files, none given here.
			name:   "gardener",
			source: "gardener/gardener@bde2b1da pkg/component/networking/nodelocaldns/resources.go, nodelocaldns.go (constants)",
			base:   gardenerCorefile(),
			args:   []string{"-localip", "169.254.20.10,10.96.0.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-health-port", "8099", "-setupiptables=false"},
		},
		{
			// disableForwardToUpstreamDNS in iptables mode: "." forwards to
			// the cluster DNS too, so coredns-custom's rewrites and stub
			// zones apply to every name (routeProbe shows kube-dns answers
			// it for both).
			name:   "gardener-no-upstream-forward",
			source: "gardener/gardener@bde2b1da pkg/component/networking/nodelocaldns/resources.go, nodelocaldns.go (upstreamDNSAddress with DisableForwardToUpstreamDNS; ClusterDNS __PILLAR__CLUSTER__DNS__ without IPVS: botanist/nodelocaldns.go)",
			base:   gardenerCorefileFor("169.254.20.10 10.96.0.10", "__PILLAR__CLUSTER__DNS__", "__PILLAR__CLUSTER__DNS__"),
			args:   []string{"-localip", "169.254.20.10,10.96.0.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-health-port", "8099", "-setupiptables=false"},
		},
		{
			// The same in IPVS mode: the link-local address alone, every
			// forward to the kube-dns Service's address written out (the
			// stand-in stands for the ClusterIP, as in k8s-reference-ipvs).
			name:   "gardener-ipvs-no-upstream-forward",
			source: "gardener/gardener@bde2b1da pkg/component/networking/nodelocaldns/resources.go, nodelocaldns.go (IPVS: bindIP and -localip the link-local address, ClusterDNS the Service's address)",
			base:   gardenerCorefileFor("169.254.20.10", oracleKubeDNS, oracleKubeDNS),
			args:   []string{"-localip", "169.254.20.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-health-port", "8099", "-setupiptables=false"},
		},
		{
			// Issue 29's report: the reference Corefile (bind the link-local
			// address and the ClusterIP) with the LRP mode's arguments in a
			// pod namespace. Neither starts: nothing creates the addresses
			// (-check-config says so now: TestCheckConfigInPodNamespace).
			name:         "k8s-reference-lrp-args",
			source:       "kubernetes/kubernetes nodelocaldns.yaml's Corefile with cilium/cilium examples/kubernetes-local-redirect/node-local-dns.yaml's args",
			base:         ref,
			args:         lrpArgs,
			stockRefuses: "cannot assign requested address",
			oursRefuses:  "cannot assign requested address",
		},
	}
}

// lrpCorefile is the reference Corefile as the LRP mode writes it: bind
// 0.0.0.0, and the cluster block's health as given.
func lrpCorefile(health string) string {
	blocks := []struct{ keys, cache, fwd, extra string }{
		{"__PILLAR__DNS__DOMAIN__:53", "cache {\n            success 9984 30\n            denial 9984 5\n    }", "forward . __PILLAR__CLUSTER__DNS__ {\n            force_tcp\n    }", "\n    " + health},
		{"in-addr.arpa:53", "cache 30", "forward . __PILLAR__CLUSTER__DNS__ {\n            force_tcp\n    }", ""},
		{"ip6.arpa:53", "cache 30", "forward . __PILLAR__CLUSTER__DNS__ {\n            force_tcp\n    }", ""},
		{".:53", "cache 30", "forward . __PILLAR__UPSTREAM__SERVERS__", ""},
	}
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.keys + " {\n    errors\n    " + bl.cache + "\n    reload\n    loop\n    bind 0.0.0.0\n    " + bl.fwd + "\n    prometheus :9253" + bl.extra + "\n    }\n")
	}
	return strings.ReplaceAll(b.String(), "__PILLAR__DNS__DOMAIN__", "cluster.local")
}

// rke2Corefile is rke2-coredns's generated nodelocal Corefile (the chart's
// defaults: no pluginOverrides, no customPlugins), the cluster DNS as
// __PILLAR__CLUSTER__DNS__ (nodelocal.ipvs false).
func rke2Corefile(lrp bool) string {
	bind, health := "bind 169.254.20.10 10.96.0.10", "health 169.254.20.10:8080"
	if lrp {
		bind, health = "bind 0.0.0.0", "health"
	}
	fwd := "forward . __PILLAR__CLUSTER__DNS__ {\n            force_tcp\n    }"
	return "cluster.local:53 {\n    errors\n    cache {\n            success 9984 30\n            denial 9984 5\n    }\n    reload\n    loop\n    " + bind + "\n    " + fwd + "\n    prometheus :9253\n    " + health + "\n    }\n" +
		"in-addr.arpa:53 {\n    errors\n    cache 30\n    reload\n    loop\n    " + bind + "\n    " + fwd + "\n    prometheus :9253\n    }\n" +
		"ip6.arpa:53 {\n    errors\n    cache 30\n    reload\n    loop\n    " + bind + "\n    " + fwd + "\n    prometheus :9253\n    }\n" +
		".:53 {\n    errors\n    cache 30\n    reload\n    loop\n    " + bind + "\n    forward . __PILLAR__UPSTREAM__SERVERS__\n    prometheus :9253\n    }\n"
}

// kubesprayArgs are kubespray's DaemonSet args (the Corefile mounted as
// written, -upstreamsvc coredns).
var kubesprayArgs = []string{"-localip", "169.254.25.10", "-conf", "CONF", "-upstreamsvc", "coredns", "-setupiptables=false"}

// kubesprayExternalZones is kubespray's Corefile with the inventory
// sample's first and third external zones (nameservers: the stand-ins).
var kubesprayExternalZones = kubesprayCorefile(oracleKubeDNS, "example.com example.io:1053 {\n    errors\n    cache 5\n    reload\n    loop\n    bind 169.254.25.10\n    forward . "+oracleNodeDNS+"\n    prometheus :9253\n    log\n}\n"+
	"mydomain.tld {\n    errors\n    cache 5\n    reload\n    rewrite name website.tld website.namespace.svc.cluster.local\n    loop\n    bind 169.254.25.10\n    forward . "+oracleKubeDNS+"\n    prometheus :9253\n    log\n}\n")

// externalZonesQuestions tell the external zones' blocks from ".": their
// names on each port.
var externalZonesQuestions = []corpusQ{{"www.example.com.", dns.TypeA}, {"www.example.io.", dns.TypeA}, {"nx.example.io.", dns.TypeAAAA}}

// kubesprayCorefile renders kubespray's template with its defaults:
// external zones first, then the four blocks; forwardTarget as given.
func kubesprayCorefile(forwardTarget, external string) string {
	block := func(keys, cache, fwd, extra string) string {
		return keys + " {\n    errors\n    " + cache + "\n    reload\n    loop\n    bind 169.254.25.10\n    " + fwd + "\n    prometheus :9253" + extra + "\n}\n"
	}
	cl := "forward . " + forwardTarget + " {\n        force_tcp\n    }"
	return external +
		block("cluster.local:53", "cache {\n        success 9984 30\n        denial 9984 5\n    }", cl, "\n    health 169.254.25.10:9254") +
		block("in-addr.arpa:53", "cache 30", cl, "") +
		block("ip6.arpa:53", "cache 30", cl, "") +
		block(".:53", "cache 30", "forward . /etc/resolv.conf", "")
}

// kopsArgs are kops's DaemonSet args.
var kopsArgs = []string{"-localip=169.254.20.10", "-conf=CONF", "-upstreamsvc=kube-dns-upstream", "-setupiptables=false"}

// kopsCorefile renders kops's template (LocalIP 169.254.20.10, the cluster
// DNS as __PILLAR__CLUSTER__DNS__, health on 8080, not IPv6-only).
func kopsCorefile(forwardToKubeDNS bool) string {
	fwd := "forward . __PILLAR__CLUSTER__DNS__ {\n      force_tcp\n    }"
	block := func(keys, cache, fwd, extra string) string {
		return keys + " {\n    errors\n    " + cache + "\n    reload\n    loop\n    bind 169.254.20.10\n    " + fwd + "\n    prometheus :9253" + extra + "\n}\n"
	}
	out := block("cluster.local:53", "cache {\n      success 9984 30\n      denial 9984 5\n    }", fwd, "\n    health 169.254.20.10:8080")
	if forwardToKubeDNS {
		return out + block(".:53", "cache 30", fwd, "")
	}
	return out + block("in-addr.arpa:53", "cache 30", fwd, "") + block("ip6.arpa:53", "cache 30", fwd, "") +
		block(".:53", "cache 30", "forward . __PILLAR__UPSTREAM__SERVERS__", "")
}

// deliveryheroArgs: the chart's defaults (localDns 169.254.20.25 and
// dnsServer, the kube-dns ClusterIP, in -localip).
var deliveryheroArgs = []string{"-localip", "169.254.20.25,10.96.0.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-setupiptables=false"}

func deliveryheroCorefile(logging bool) string {
	log, prefetch, cache := "", "", "cache 30"
	if logging {
		log = "\n    log"
		prefetch = "\n            prefetch 3 30s 20%"
		cache = "cache 30 {\n            prefetch 3 30s 20%\n    }"
	}
	fwd := "forward . __PILLAR__CLUSTER__DNS__ {\n            force_tcp\n    }"
	return "cluster.local:53 {" + log + "\n    errors\n    cache {\n            success 9984 30\n            denial 9984 5" + prefetch + "\n    }\n    reload\n    loop\n    bind 0.0.0.0\n    " + fwd + "\n    prometheus :9253\n    health :8080\n    }\n" +
		"in-addr.arpa:53 {\n    errors\n    " + cache + "\n    reload\n    loop\n    bind 0.0.0.0\n    " + fwd + "\n    prometheus :9253\n    }\n" +
		"ip6.arpa:53 {\n    errors\n    " + cache + "\n    reload\n    loop\n    bind 0.0.0.0\n    " + fwd + "\n    prometheus :9253\n    }\n" +
		".:53 {" + log + "\n    errors\n    " + cache + "\n    reload\n    loop\n    bind 0.0.0.0\n    forward . __PILLAR__UPSTREAM__SERVERS__ {\n    }\n    prometheus :9253\n    }\n"
}

// lablabsArgs are the chart's default args.
var lablabsArgs = []string{"-localip", "169.254.20.11", "-skipteardown=true", "-setupinterface=true", "-setupiptables=false",
	"-health-port", "8080", "-upstreamsvc", "kube-dns", "-conf", "CONF", "-syncinterval", "1ns", "-interfacename", "nodelocaldns",
	"-metrics-listen-address", "0.0.0.0:9353"}

func lablabsCorefile(cilium bool) string {
	bind, health := "bind 169.254.20.11", "health 169.254.20.11:8080"
	if cilium {
		bind, health = "bind 0.0.0.0", "health"
	}
	var b strings.Builder
	for _, k := range []string{".:53", "in-addr.arpa:53", "ip6.arpa:53"} {
		b.WriteString(k + " {\n  errors\n  cache 30 {\n  }\n  reload\n  log . combined {\n    class all\n  }\n  loop\n  " + bind +
			"\n  forward . __PILLAR__UPSTREAM__SERVERS__ {\n  }\n  prometheus :9253\n  " + health + "\n}\n")
	}
	return b.String()
}

// gardenerCorefile is Gardener's generated Corefile: bindIP the link-local
// address and the kube-dns ClusterIP (iptables mode), the cluster DNS as
// __PILLAR__CLUSTER__DNS__ (the stand-in), force_tcp both ways.
func gardenerCorefile() string {
	return gardenerCorefileFor("169.254.20.10 10.96.0.10", "__PILLAR__CLUSTER__DNS__", "__PILLAR__UPSTREAM__SERVERS__")
}

// gardenerCorefileFor is Gardener's Corefile with its bindIP, its cluster
// DNS (ClusterDNS: __PILLAR__CLUSTER__DNS__ in iptables mode, the kube-dns
// Service's address in IPVS mode) and the "." block's target
// (upstreamDNSAddress: __PILLAR__UPSTREAM__SERVERS__, or the cluster DNS
// with disableForwardToUpstreamDNS).
func gardenerCorefileFor(bind, clusterDNS, root string) string {
	bind = "bind " + bind
	fwd := "forward . " + clusterDNS + " {\n            force_tcp\n    }"
	return "cluster.local:53 {\n    errors\n    cache {\n            success 9984 30\n            denial 9984 5\n    }\n    reload\n    loop\n    import custom/*.override\n    " + bind + "\n    " + fwd + "\n    prometheus :9253\n    health 169.254.20.10:8099\n    }\n" +
		"in-addr.arpa:53 {\n    errors\n    cache 30\n    reload\n    loop\n    " + bind + "\n    " + fwd + "\n    prometheus :9253\n    }\n" +
		"ip6.arpa:53 {\n    errors\n    cache 30\n    reload\n    loop\n    " + bind + "\n    " + fwd + "\n    prometheus :9253\n    }\n" +
		".:53 {\n    errors\n    cache 30\n    reload\n    loop\n    import custom/*.override\n    " + bind + "\n    forward . " + root + " {\n            force_tcp\n    }\n    prometheus :9253\n    }\n    import custom/*.server\n"
}
