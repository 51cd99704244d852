package config

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/endpoints"
)

// Describe prints what a start with c would do, for -check-config.
func Describe(w io.Writer, c *Config) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("configuration is valid")
	if c.Listen != nil {
		p("listen:           %v (udp x%d sockets per address and port, tcp; the Corefile's blocks on each port are served on that port only)", c.Listen, c.UDPSockets)
	} else {
		p("listen:           %v port %d (udp x%d sockets per address, tcp)", c.LocalIPs, c.Port, c.UDPSockets)
	}
	for _, a := range c.LocalIPs {
		if a.IsUnspecified() {
			p("                  %s: every address of this host, now and later, one wildcard socket (dual-stack); each UDP answer leaves from the address its query was sent to", a)
			break
		}
	}
	p("udp sizes:        answers to a client up to its EDNS size, at most %d (512 without EDNS); we advertise %d", c.MaxClientUDPSize, c.MaxUDPSize)
	if c.LocalMode {
		p("kube-dns:         none (local mode): every name goes to the node's resolvers")
	} else {
		zones := c.ClusterDomain + " in-addr.arpa. ip6.arpa."
		if c.DropIn.Corefile != nil {
			zones = strings.Join(c.DropIn.KubeDNSZones, " ")
		}
		p("kube-dns:         %s (from %s) over TCP, pool %d: %s", c.KubeDNS, c.KubeDNSSource, c.TCPPoolSize, zones)
		p("kube-dns pods:    %s", describeKubeDNSPods(c))
	}
	if c.RootToKubeDNS() {
		p("node resolvers:   none asked: the Corefile's \".\" block forwards every other name to kube-dns (%v from %s unused)", c.Nameservers, c.ResolvConf)
	} else {
		p("node resolvers:   %v (from %s)", c.Nameservers, c.ResolvConf)
	}
	if c.KubeDNSConfigMap == "" {
		p("kube-dns cm:      off")
	} else if k, _, err := c.LoadKubeDNSConfigMap(); err != nil {
		p("kube-dns cm:      %s (watched): %v; a start ignores it (logged, counted) until it is fixed", c.KubeDNSConfigMap, err)
	} else {
		p("kube-dns cm:      %s (watched): %s", c.KubeDNSConfigMap, k)
	}
	describeNode(p, c)
	p("metrics:          http://%s/metrics (/health, /ready)", c.MetricsAddr)
	if c.HealthAddr != "" {
		p("health:           http://%s/health, /ready", c.HealthAddr)
	}
	if c.StateDir != "" {
		p("lifecycle:        lame duck %v; twins meet in %s (socket handover, exec probes: nodelocaldns -probe ready|health -state-dir %s)", c.LameDuck, c.StateDir, c.StateDir)
	} else {
		p("lifecycle:        lame duck %v; no state dir: no handover to a twin, no exec probes", c.LameDuck)
	}
	if c.PProf != "" {
		scope := "loopback only"
		if h, _, err := net.SplitHostPort(c.PProf); err == nil {
			if a, err := netip.ParseAddr(h); (err != nil && h != "localhost") || (err == nil && !a.IsLoopback()) {
				scope = "NOT loopback: every pod that reaches this address can read the daemon's memory profile"
			}
		}
		p("pprof:            http://%s/debug/pprof/ (%s)", c.PProf, scope)
	} else {
		p("pprof:            off")
	}
	p("query log:        %v", c.QueryLog)
	if c.SocketUID >= 0 {
		p("socket owner:     uid %d (only its processes can join the DNS port group)", c.SocketUID)
	}
	p("interface:        %v (%s)", c.SetupInterface, c.InterfaceName)
	p("iptables:         %v (backend %s, health port %d, sync every %v)", c.SetupIPTables, c.IPTablesMode, c.HealthPort, c.SyncInterval)
	describeFallback(p, c)
	if x := c.ExtraPorts(); len(x) > 0 && c.SetupIPTables {
		p("iptables ports:   DNS %d and %v: the NOTRACK/ACCEPT rules cover every DNS port (the stock node-cache's name its one port)", c.Port, x)
	}
	p("cache:            success %d, denial %d entries, %d bytes", c.Cache.SuccessCapacity, c.Cache.DenialCapacity, c.Cache.MaxBytes)
	p("cache snapshot:   %s", describeSnapshot(c))
	p("ttl caps:         cluster success %v denial %v; other success %v denial %v; min %v; servfail %v",
		c.Cache.ClusterSuccessTTL, c.Cache.ClusterDenialTTL, c.Cache.SuccessTTL, c.Cache.DenialTTL, c.Cache.MinTTL, c.Cache.ServFailTTL)
	p("serve-stale:      %v past expiry (client waits %v for a refresh, recheck %v after a failed one)", c.Cache.StaleWindow, c.Cache.StaleClientTimeout, c.Cache.StaleRecheck)
	if len(c.Cache.LastKnownGood) > 0 {
		p("last-known-good:  %v: the last answer that answers is kept, within the serve-stale window, over NXDOMAIN, NODATA, empty and referral refreshes (a deleted record is served until the window ends)", c.Cache.LastKnownGood)
	} else {
		p("last-known-good:  off")
	}
	if c.Autopath.Enabled {
		p("autopath:         on: pods of node %q (API server, in-cluster credentials), node search domains from %s", c.Autopath.NodeName, c.Autopath.NodeResolvConf)
	} else {
		p("autopath:         off")
	}
	describeDropIn(p, c) // drop-in: the Corefile block by block, and the notes
}

// describeSnapshot says where the cache snapshot is kept, or why not.
func describeSnapshot(c *Config) string {
	where := c.Cache.SnapshotDir + "/cache.snapshot"
	switch {
	case c.Cache.SnapshotDir == "" && c.StateDir == "":
		return "off: no -state-dir nor -cache-snapshot-dir (a start after a crash is cold)"
	case c.Cache.SnapshotInterval == 0:
		return "off (-cache-snapshot-interval=0; a file left by an earlier run is removed at start)"
	case c.Cache.SnapshotDir == "":
		where = c.StateDir + "/<group>/cache.snapshot (the group: a hash of the network namespace, addresses and port; the start logs the path; " +
			"every process that mounts " + c.StateDir + " can read the cached names: -cache-snapshot-dir keeps it private)"
	}
	return fmt.Sprintf("%s, written every %v when the cache changed and at exit, at most %d bytes; loaded at a start that has no twin to take the cache from (off: -cache-snapshot-interval=0)",
		where, c.Cache.SnapshotInterval, c.Cache.SnapshotMaxBytes)
}

// ServiceAccountDir is where the kubelet mounts the pod's service account token and namespace.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// describeKubeDNSPods says whether kube-dns' pods are asked directly (docs/design.md,
// "kube-dns endpoints"). It reads the environment and the token's files, and asks nothing.
func describeKubeDNSPods(c *Config) string {
	if c.KubeDNSService == "" {
		return fmt.Sprintf("the ClusterIP only: %s is not the ClusterIP of -upstreamsvc's Service ($NAME_SERVICE_HOST), so its EndpointSlices are unknown", c.KubeDNS)
	}
	follow := fmt.Sprintf("the ready endpoints of Service %s (its EndpointSlices, port dns-tcp; at most %d per node), each query to the next in turn, pool %d each; %s as fallback",
		c.KubeDNSService, endpoints.DefaultMax, c.TCPPoolSize, c.KubeDNS)
	if _, err := os.Stat(ServiceAccountDir + "/token"); err != nil || os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return "the ClusterIP only: no API server credentials here (token not mounted, or not in a pod); in a pod with them: " + follow
	}
	return follow + " (live shares: nodelocaldns_upstream_request_duration_seconds_count{group=\"kube-dns\"} per upstream)"
}

// describeFallback says which addresses have a fallback on this node and
// which not, and what an exit leaves (docs/design.md, "No black hole").
func describeFallback(p func(string, ...any), c *Config) {
	switch {
	case !c.SetupIPTables:
		p("fallback:         none: -setupiptables=false, no rules of ours (in Cilium's LRP mode Cilium sends the kube-dns ClusterIP to kube-dns' own pods when no cache pod is ready)")
		return
	case c.FallbackAfter == 0:
		p("fallback:         off (-fallback-after=0): the stock's rules; while no process serves, queries to every address are lost")
	default:
		p("fallback:         while no process of ours serves an address (killed, crashed, not started yet) the kernel sends its queries to kube-dns; a hung one (stopped, a serving loop stuck) is bypassed within %v", c.FallbackAfter)
		addrs := c.InterfaceIPs
		if addrs == nil {
			addrs = c.LocalIPs
		}
		for _, a := range addrs {
			switch {
			case a.IsUnspecified():
			case slices.Contains(c.Node.Listen, a):
				p("                  %s: the node listener: the node's own resolvers %v by a DNAT (never kube-dns, which may forward to it)", a, c.Nameservers)
			case c.LocalMode:
				p("                  %s: none (local mode: no kube-dns)", a)
			case a.Is6() != c.KubeDNS.Addr().Is6():
				p("                  %s: if it is a Service's ClusterIP, kube-proxy's own rules; otherwise none (kube-dns' pods are known in kube-dns' family only, %s's)", a, c.KubeDNS.Addr())
			case c.KubeDNSService == "":
				p("                  %s: if it is a Service's ClusterIP, kube-proxy's own rules; otherwise kube-dns' pods by a DNAT rewritten while a process serves, from kube-proxy's iptables rules for %s (none while they name none)", a, c.KubeDNS)
			default:
				p("                  %s: if it is a Service's ClusterIP, kube-proxy's own rules; otherwise kube-dns' ready pods by a DNAT rewritten while a process serves, from the EndpointSlices of %s through the API, else kube-proxy's iptables rules (none while neither is known)", a, c.KubeDNSService)
			}
		}
	}
	switch {
	case c.SkipTeardown:
		p("on exit:          everything stays (-skipteardown)")
	case c.Teardown == "always" || c.FallbackAfter == 0:
		p("on exit:          link, addresses and rules removed unless a twin serves on")
	default:
		p("on exit:          removed on an uninstall (the API says this pod's DaemonSet is gone or being deleted) or outside a pod; otherwise left, the fallback serving, for the next instance (-teardown=auto)")
	}
}

// RootToKubeDNS reports whether the Corefile's "." block forwards to
// kube-dns (kops' forwardToKubeDNS, Gardener's disableForwardToUpstreamDNS):
// every name no other block forwards goes there, none to the node's
// resolvers.
func (c *Config) RootToKubeDNS() bool {
	return c.DropIn.Corefile != nil && !c.LocalMode && slices.Contains(c.DropIn.KubeDNSZones, ".")
}
