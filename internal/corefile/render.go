package corefile

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// The placeholders of node-cache's Corefile.base, as the reference manifest
// and every distribution's template spell them.
const (
	VarLocalDNS         = "__PILLAR__LOCAL__DNS__"
	VarDNSServer        = "__PILLAR__DNS__SERVER__"
	VarClusterDNS       = "__PILLAR__CLUSTER__DNS__"
	VarUpstreamServers  = "__PILLAR__UPSTREAM__SERVERS__"
	VarPrometheusListen = "__PROMETHEUS__ENDPOINT__"
)

// DefaultResolvConf is what node-cache puts in __PILLAR__UPSTREAM__SERVERS__
// without upstreamNameservers: forward reads the node's resolvers from it.
const DefaultResolvConf = "/etc/resolv.conf"

// stubTTL is the cache TTL node-cache writes into a stub domain's block.
const stubTTL = 30

// The forward line node-cache rewrites when upstreamNameservers are set:
// it replaces this exact text (TCP to the node's resolvers) by the UDP form.
// Different indentation misses it, and node-cache then only substitutes the
// servers; Render does the same.
const (
	upstreamTCPBlock = "\n    forward . " + VarUpstreamServers + " {\n            force_tcp\n    }\n"
	upstreamUDPBlock = "\n    forward . " + VarUpstreamServers + "\n"
)

// RenderParams is what node-cache substitutes into Corefile.base.
type RenderParams struct {
	// LocalIP is the -localip value as given (comma separated); node-cache
	// puts it in with the commas turned into spaces.
	LocalIP string
	// Port is the DNS port (-dns.port), used in stub domains' keys.
	Port int
	// ClusterDNS is the -upstreamsvc Service's IP ($NAME_SERVICE_HOST).
	ClusterDNS string
	// StubDomains and UpstreamNameservers are the kube-dns ConfigMap's keys,
	// the server strings as written there (validated by the caller).
	StubDomains         map[string][]string
	UpstreamNameservers []string
	// PrometheusListen replaces __PROMETHEUS__ENDPOINT__ (not a node-cache
	// placeholder: some templates carry it for -prometheus-listen-address).
	PrometheusListen string
}

// Render returns the Corefile node-cache writes for base and p: the
// placeholders substituted in node-cache's order, then one block per stub
// domain appended. The only difference: stub domains come in sorted order
// (node-cache walks a Go map, so its order changes between writes).
func Render(base []byte, p RenderParams) []byte {
	out := append([]byte(nil), base...)
	local := strings.ReplaceAll(p.LocalIP, ",", " ")
	upstream := strings.Join(p.UpstreamNameservers, " ")
	if upstream == "" {
		out = bytes.ReplaceAll(out, []byte(VarUpstreamServers), []byte(DefaultResolvConf))
	} else {
		udp := strings.ReplaceAll(upstreamUDPBlock, VarUpstreamServers, upstream)
		out = bytes.ReplaceAll(out, []byte(upstreamTCPBlock), []byte(udp))
		out = bytes.ReplaceAll(out, []byte(VarUpstreamServers), []byte(upstream))
	}
	out = bytes.ReplaceAll(out, []byte(VarClusterDNS), []byte(p.ClusterDNS))
	out = bytes.ReplaceAll(out, []byte(VarLocalDNS), []byte(local))
	out = bytes.ReplaceAll(out, []byte(VarDNSServer), nil)
	if p.PrometheusListen != "" {
		out = bytes.ReplaceAll(out, []byte(VarPrometheusListen), []byte(p.PrometheusListen))
	}
	zones := make([]string, 0, len(p.StubDomains))
	for z := range p.StubDomains {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	for _, z := range zones {
		out = fmt.Appendf(out, "\n%s:%d {\n    errors\n    cache %d\n    bind %s\n    forward . %s\n}\n",
			z, p.Port, stubTTL, local, strings.Join(p.StubDomains[z], " "))
	}
	return out
}
