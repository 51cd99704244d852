package config

import (
	"flag"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// NodeConfig is what the daemon does for the node itself (issue 40): a
// listener of its own for the node's resolvers, where names outside the
// cluster go, and the readiness it publishes on its Node object.
type NodeConfig struct {
	// Listen are the node listener's addresses (-node-listen), on Port:
	// every name goes to the node's resolvers (-resolv-conf; never
	// upstreamNameservers, a stub domain or kube-dns), cached apart from
	// the pods' answers. The node's resolv.conf or systemd-resolved can
	// point there: the daemon drops its own addresses from every list it
	// forwards to.
	Listen []netip.Addr
	// ExternalToKubeDNS: -external-upstream=kube-dns, every name the pods
	// ask goes to kube-dns (the stub domains of the kube-dns ConfigMap
	// still go to theirs), so CoreDNS's rewrites, hosts and zones apply
	// to every pod. The node listener keeps the node's resolvers.
	ExternalToKubeDNS bool
	// Condition is the node condition type the daemon keeps on its Node
	// (-node-condition; "" off): True once it answers through every
	// listen address, False from SIGTERM (unless a twin serves on) and
	// while its health check fails. Label is the node label it keeps
	// "true" then and removes otherwise (-node-ready-label; "" off).
	Condition string
	Label     string
	// StatusAs is who patches the Node (-node-status-as): "node", the
	// node itself through the API server's constrained impersonation
	// (its own Node only: deploy/node-readiness/rbac.yaml), or
	// "serviceaccount", the pod's own identity (any Node's status:
	// deploy/node-readiness/rbac-any-node.yaml).
	StatusAs string
}

// Values of -external-upstream and -node-status-as.
const (
	ExternalNode     = "node"
	ExternalKubeDNS  = "kube-dns"
	StatusAsNode     = "node"
	StatusAsAccount  = "serviceaccount"
	nodeListenFlag   = "node-listen"
	externalFlag     = "external-upstream"
	conditionFlag    = "node-condition"
	readyLabelFlag   = "node-ready-label"
	statusAsFlag     = "node-status-as"
	maxConditionType = 316 // metav1.Condition's type: a qualified name, prefix ≤ 253, name ≤ 63
)

// nodeFlags are the raw values of the node's flags.
type nodeFlags struct {
	listen, external string
}

// registerNode registers the node's flags (issue 40); finishNode checks
// them.
func registerNode(fs *flag.FlagSet, c *Config) *nodeFlags {
	n := &nodeFlags{}
	fs.StringVar(&n.listen, nodeListenFlag, "", "comma-separated addresses of a second listener for the node itself (its resolv.conf, systemd-resolved, dnsPolicy: Default pods): the node's resolvers, cached apart, never kube-dns; put on the interface and in the rules like -localip")
	fs.StringVar(&n.external, externalFlag, ExternalNode, "where the pods' names outside the cluster domain go: node (the node's resolvers, or upstreamNameservers) or kube-dns (every name, so CoreDNS's own configuration applies to every pod)")
	fs.StringVar(&c.Node.Condition, conditionFlag, "", "node condition type kept True on this node while the cache answers through every listen address, False from SIGTERM and while unhealthy (e.g. nodelocaldns.io/DNSReady; needs deploy/node-readiness/rbac.yaml); \"\": off")
	fs.StringVar(&c.Node.Label, readyLabelFlag, "", "node label kept \"true\" on this node while the cache answers, removed otherwise (GKE's addon.gke.io/node-local-dns-ds-ready; needs deploy/node-readiness/rbac.yaml); \"\": off")
	fs.StringVar(&c.Node.StatusAs, statusAsFlag, StatusAsNode, "who writes -node-condition and -node-ready-label: node (the node itself, by constrained impersonation: its own Node only, Kubernetes 1.36+) or serviceaccount (the pod's account: any Node)")
	return n
}

// qualifiedName is a Kubernetes qualified name: an optional DNS subdomain
// prefix and '/', then a name of alphanumerics, '-', '_' and '.' starting
// and ending with an alphanumeric.
var qualifiedName = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// finishNode checks the node's flags once the rest is parsed (before the
// resolvers are read: the node listener's addresses are ours too).
func (c *Config) finishNode(n *nodeFlags, set map[string]bool, corefileMode bool) error {
	switch n.external {
	case ExternalNode:
	case ExternalKubeDNS:
		c.Node.ExternalToKubeDNS = true
	default:
		return usage("-%s: %q is not node or kube-dns", externalFlag, n.external)
	}
	if n.listen != "" {
		var err error
		if c.Node.Listen, err = parseIPs(n.listen); err != nil {
			return usage("-%s: %v", nodeListenFlag, err)
		}
		for _, a := range c.Node.Listen {
			if slices.Contains(c.LocalIPs, a) {
				return usage("-%s: %s is also a -localip address: the pods' and the node's listeners are apart", nodeListenFlag, a)
			}
		}
	}
	for _, name := range []string{nodeListenFlag, externalFlag} {
		if corefileMode && set[name] {
			return usage("-%s is the flags' configuration; a Corefile says the same itself (a block bound to the node's address forwarding to /etc/resolv.conf; forward . __PILLAR__CLUSTER__DNS__ in the \".\" block)", name)
		}
	}
	if c.LocalMode && c.Node.ExternalToKubeDNS {
		return usage("-%s=kube-dns needs a cluster: it does not work with -local-mode", externalFlag)
	}
	if !c.LocalMode && int(c.KubeDNS.Port()) == c.Port && slices.Contains(c.Node.Listen, c.KubeDNS.Addr()) {
		return usage("kube-dns %s (from %s) is a -%s address: forwarding there loops", c.KubeDNS, c.KubeDNSSource, nodeListenFlag)
	}
	if len(c.Node.Listen) > 0 && c.InterfaceIPs == nil {
		c.InterfaceIPs = append(slices.Clone(c.LocalIPs), c.Node.Listen...)
	}
	return c.finishNodeStatus()
}

// finishNodeStatus checks -node-condition, -node-ready-label and
// -node-status-as.
func (c *Config) finishNodeStatus() error {
	n := &c.Node
	switch n.StatusAs {
	case StatusAsNode, StatusAsAccount:
	default:
		return usage("-%s: %q is not node or serviceaccount", statusAsFlag, n.StatusAs)
	}
	if n.Condition != "" && (len(n.Condition) > maxConditionType || !qualifiedName.MatchString(n.Condition)) {
		return usage("-%s: %q is not a condition type (a qualified name: [DNS-SUBDOMAIN/]NAME, NAME of letters, digits, '-', '_', '.')", conditionFlag, n.Condition)
	}
	if builtin := []string{"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"}; slices.Contains(builtin, n.Condition) {
		return usage("-%s: %q is the kubelet's own condition; pick a type of our own (e.g. nodelocaldns.io/DNSReady)", conditionFlag, n.Condition)
	}
	if n.Label != "" {
		prefix, name, ok := strings.Cut(n.Label, "/")
		if !ok {
			name, prefix = prefix, ""
		}
		if len(name) > 63 || len(prefix) > 253 || !qualifiedName.MatchString(n.Label) {
			return usage("-%s: %q is not a label key ([DNS-SUBDOMAIN/]NAME, NAME at most 63 characters)", readyLabelFlag, n.Label)
		}
		if prefix == "kubernetes.io" || prefix == "k8s.io" || strings.HasSuffix(prefix, ".kubernetes.io") || strings.HasSuffix(prefix, ".k8s.io") {
			return usage("-%s: %q: the kubernetes.io and k8s.io prefixes are Kubernetes' own (the NodeRestriction admission plugin refuses most of them to a node)", readyLabelFlag, n.Label)
		}
	}
	if (n.Condition != "" || n.Label != "") && c.Autopath.NodeName == "" {
		return usage("-%s and -%s need this node's name: set -node-name or $NODE_NAME (downward API, spec.nodeName)", conditionFlag, readyLabelFlag)
	}
	if (n.Condition != "" || n.Label != "") && c.LocalMode {
		return usage("-%s and -%s need a cluster: they do not work with -local-mode", conditionFlag, readyLabelFlag)
	}
	return nil
}

// OwnAddrs are the DNS addresses this daemon serves on Port: -localip and
// -node-listen. A resolver list naming one of them on Port loops.
func (c *Config) OwnAddrs() []netip.Addr {
	if len(c.Node.Listen) == 0 {
		return c.LocalIPs
	}
	return append(slices.Clone(c.LocalIPs), c.Node.Listen...)
}

// NodeListenSockets are the node listener's sockets (address and port).
func (c *Config) NodeListenSockets() []netip.AddrPort {
	out := make([]netip.AddrPort, len(c.Node.Listen))
	for i, a := range c.Node.Listen {
		out[i] = netip.AddrPortFrom(a, uint16(c.Port))
	}
	return out
}

// PublishesNodeStatus reports whether the daemon writes its readiness on
// its Node (-node-condition, -node-ready-label).
func (c *Config) PublishesNodeStatus() bool { return c.Node.Condition != "" || c.Node.Label != "" }

// describeNode prints, for -check-config, what the node's flags do.
func describeNode(p func(string, ...any), c *Config) {
	if len(c.Node.Listen) > 0 {
		p("node listener:    %v port %d: every name to the node's resolvers %v, cached apart; never kube-dns (not even the cluster domain); on the interface and in the rules", c.Node.Listen, c.Port, c.Nameservers)
	} else {
		p("node listener:    off")
	}
	if c.Node.ExternalToKubeDNS {
		p("external names:   to kube-dns %s (-external-upstream=kube-dns): CoreDNS's own configuration applies to every pod; the kube-dns ConfigMap's stub domains still go to theirs, its upstreamNameservers are not used", c.KubeDNS)
	}
	if !c.PublishesNodeStatus() {
		p("node status:      off")
		return
	}
	var what []string
	if c.Node.Condition != "" {
		what = append(what, fmt.Sprintf("condition %s (True once answering through every listen address; False from SIGTERM unless a twin serves on, and while unhealthy)", c.Node.Condition))
	}
	if c.Node.Label != "" {
		what = append(what, fmt.Sprintf("label %s=true (removed when not ready)", c.Node.Label))
	}
	as := "as the node itself (constrained impersonation of system:node:" + c.Autopath.NodeName + ")"
	if c.Node.StatusAs == StatusAsAccount {
		as = "as the pod's service account"
	}
	p("node status:      node %s: %s, %s", c.Autopath.NodeName, strings.Join(what, "; "), as)
}
