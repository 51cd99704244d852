package config

import (
	"fmt"
	"io"
)

// Describe prints what a start with c would do, for -check-config.
func Describe(w io.Writer, c *Config) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("configuration is valid")
	p("listen:           %v port %d (udp x%d sockets per address, tcp)", c.LocalIPs, c.Port, c.UDPSockets)
	if c.LocalMode {
		p("kube-dns:         none (local mode): every name goes to the node's resolvers")
	} else {
		p("kube-dns:         %s (from %s) over TCP, pool %d: %s, in-addr.arpa., ip6.arpa.", c.KubeDNS, c.KubeDNSSource, c.TCPPoolSize, c.ClusterDomain)
	}
	p("node resolvers:   %v (from %s)", c.Nameservers, c.ResolvConf)
	p("metrics:          http://%s/metrics (/health, /ready)", c.MetricsAddr)
	p("interface:        %v (%s)", c.SetupInterface, c.InterfaceName)
	p("iptables:         %v (backend %s, health port %d, sync every %v, teardown on exit %v)", c.SetupIPTables, c.IPTablesMode, c.HealthPort, c.SyncInterval, !c.SkipTeardown)
	p("cache:            success %d, denial %d entries, %d bytes", c.Cache.SuccessCapacity, c.Cache.DenialCapacity, c.Cache.MaxBytes)
	p("ttl caps:         cluster success %v denial %v; other success %v denial %v; min %v; servfail %v",
		c.Cache.ClusterSuccessTTL, c.Cache.ClusterDenialTTL, c.Cache.SuccessTTL, c.Cache.DenialTTL, c.Cache.MinTTL, c.Cache.ServFailTTL)
}
