package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// mapCorefile translates the typed Corefile into the daemon's settings:
// listen addresses = the union of the binds; kube-dns = the forward target
// of the cluster domain's block, and every block forwarding there goes to
// kube-dns whatever its zones; the "." block's forward = the node's
// resolvers; other forward blocks = zone routes; cache capacities add up,
// TTL caps come from the cluster block and the "." block (every block's
// policy is its zones' ZonePolicies); health, metrics, pprof, bufsize,
// timeouts as said; what every other directive does is its own package's
// to say (corefile.Server.Describe). A flag given explicitly wins over the
// Corefile, with a note.
func (c *Config) mapCorefile(cc *CorefileConfig, set map[string]bool) error {
	m := newMapping(c, cc, set)
	m.port()
	m.kubeDNS()
	for _, s := range cc.Servers {
		if err := m.block(s); err != nil {
			return err
		}
	}
	m.listenAddrs()
	m.healthAndMetrics()
	if !c.LocalMode && (slices.Contains(c.Sockets(), c.KubeDNS) || (int(c.KubeDNS.Port()) == c.Port && serves(c.LocalIPs, c.KubeDNS.Addr()))) {
		return usage("kube-dns %s (from %s) is one of the Corefile's listen addresses (bind): forwarding there loops; forward to a second Service in front of the kube-dns pods (__PILLAR__CLUSTER__DNS__, -upstreamsvc kube-dns-upstream)", c.KubeDNS, c.KubeDNSSource)
	}
	dropped, err := checkDNS64(cc.Servers, c.LocalIPs)
	if err != nil {
		return err
	}
	for _, s := range dropped {
		m.mapped(s, "dns64 without allow_ipv4: every listen address %v is IPv4, so its clients are IPv4 and CoreDNS translates for none of them: no effect", c.LocalIPs)
	}
	if m.haveCache {
		c.mapCacheTTLs(set, m.succCap, m.denCap)
	}
	return c.zonePolicies(cc, set)
}

// mapping is mapCorefile's state: what the blocks add up to.
type mapping struct {
	c   *Config
	cc  *CorefileConfig
	set map[string]bool
	// kube are kube-dns' addresses (the cluster domain block's forward
	// targets, and -kube-dns).
	kube []netip.AddrPort
	// firstOf is a zone's first block: it fills the shared route table;
	// the views (views.go) route the others.
	firstOf map[string]*corefile.Server
	// listen are the listen addresses, sockets every block's addresses on
	// its port, created those the interface holds (-localip, explicit
	// binds): what -setupinterface puts on it and the rules name;
	// addresses found on the host (the wildcard's, an interface's) are
	// neither.
	listen, created []netip.Addr
	sockets         []netip.AddrPort
	blockPort       uint16
	succCap, denCap int
	haveCache       bool
	metrics, health string
}

func newMapping(c *Config, cc *CorefileConfig, set map[string]bool) *mapping {
	m := &mapping{c: c, cc: cc, set: set, firstOf: map[string]*corefile.Server{}}
	for _, s := range cc.Servers {
		for _, z := range s.Zones {
			if m.firstOf[z] == nil {
				m.firstOf[z] = s
			}
		}
	}
	return m
}

// mapped notes how a directive of s was mapped, for -check-config.
func (m *mapping) mapped(s *corefile.Server, format string, a ...any) {
	m.cc.Mapping = append(m.cc.Mapping, fmt.Sprintf("%s  %s", s.Pos, fmt.Sprintf(format, a...)))
}

// flagWins notes a flag given explicitly that wins over the Corefile.
func (m *mapping) flagWins(flag, what string, corefileVal, flagVal any) {
	m.c.note("-%s %v wins over the Corefile's %s %v: a flag given explicitly is the operator's latest word", flag, flagVal, what, corefileVal)
}

// port: the DNS port is the first block's (CoreDNS's -dns.port only fills
// keys without a port); blocks on other ports listen there too (Listen).
func (m *mapping) port() {
	c := m.c
	if port := m.cc.Servers[0].Port; port != c.Port {
		c.note("the Corefile's port %d wins over -port/-dns.port %d: as in CoreDNS, the flag only fills keys written without a port", port, c.Port)
		c.Port = port
	}
}

// kubeDNS: kube-dns is the cluster domain block's forward target.
func (m *mapping) kubeDNS() {
	c := m.c
	for _, s := range m.cc.Servers {
		if !slices.Contains(s.Zones, c.ClusterDomain) || s.Forward == nil || s.Forward.From != "." {
			continue
		}
		for _, u := range s.Forward.To {
			if u.ResolvConf == "" {
				m.kube = append(m.kube, u.Addr)
			}
		}
		if len(m.kube) > 0 {
			kube := m.kube
			if m.set["kube-dns"] && c.KubeDNS != kube[0] {
				m.flagWins("kube-dns", "cluster DNS", kube[0], c.KubeDNS)
			} else if !c.LocalMode {
				c.KubeDNS, c.KubeDNSSource = kube[0], "Corefile "+s.Pos.String()
			}
			if len(kube) > 1 && !m.set["kube-dns"] && !c.LocalMode {
				c.DropIn.KubeDNSAlso = slices.Clone(kube[1:])
				m.mapped(s, "forward . %v: the kube-dns group asks %v too, by the block's policy, with failover", kube, kube[1:])
			} else if len(kube) > 1 {
				c.note("%s: the cluster domain forwards to %v; kube-dns is asked at %s only (-kube-dns given)", s.Pos, kube, c.KubeDNS)
			}
		}
		break
	}
	if !c.LocalMode && c.KubeDNS.IsValid() && !slices.Contains(m.kube, c.KubeDNS) {
		m.kube = append(m.kube, c.KubeDNS)
	}
}

// isKube reports whether every target of f is kube-dns.
func (m *mapping) isKube(f *corefile.Forward) bool {
	if f == nil {
		return false
	}
	for _, u := range f.To {
		if u.ResolvConf != "" || !slices.Contains(m.kube, u.Addr) {
			return false
		}
	}
	return true
}

// block maps one server block.
func (m *mapping) block(s *corefile.Server) error {
	m.blockPort = uint16(s.Port)
	m.bind(s)
	if err := m.forward(s); err != nil {
		return err
	}
	if err := m.forwardOptions(s); err != nil {
		return err
	}
	if len(s.MoreForwards) > 0 {
		if err := m.links(s); err != nil {
			return err
		}
	}
	m.cache(s)
	if err := m.endpoints(s); err != nil {
		return err
	}
	for _, l := range s.Describe() { // the registered directives: log, whoami, dnstap, trace, loadbalance, ...
		m.mapped(s, "%s", l)
	}
	for _, d := range s.Dials() { // where they send: never to ourselves
		if m.c.Ours(d.Addr) {
			return usage("%s: %s: one of our own DNS listen sockets: %s (a loop)", s.Pos, d.What, d.Why)
		}
	}
	for _, n := range s.Notes() {
		m.c.note("%s", n)
	}
	if s.Metadata {
		m.mapped(s, "metadata: the labels log sets (log/type, log/class) have values in this block's log formats; no other directive sets one before a query is forwarded (template's .Meta and rewrite edns0 {/label} values stay empty, as in CoreDNS with the stock node-cache's plugins)")
	}
	m.serverSettings(s)
	for _, p := range s.Plugins {
		if p.NoOp {
			m.mapped(s, "%s: accepted, no-op (%s)", p.Name, noopWhy[p.Name])
		}
	}
	return nil
}

// addListen adds a listen address of the block being mapped.
func (m *mapping) addListen(a netip.Addr) {
	if !slices.Contains(m.listen, a) {
		m.listen = append(m.listen, a)
	}
	if ap := netip.AddrPortFrom(a, m.blockPort); !slices.Contains(m.sockets, ap) {
		m.sockets = append(m.sockets, ap)
	}
}

func (m *mapping) addCreated(a netip.Addr) {
	if !slices.Contains(m.created, a) {
		m.created = append(m.created, a)
	}
}

// bind maps the block's listen addresses.
func (m *mapping) bind(s *corefile.Server) {
	c := m.c
	if len(s.Bind) == 0 {
		for _, a := range c.LocalIPs {
			m.addListen(a)
			m.addCreated(a)
		}
		m.mapped(s, "bind: none: serving on -localip %v", c.LocalIPs)
	}
	for _, a := range s.Bind {
		if a.IsUnspecified() {
			// One wildcard socket, as CoreDNS's: 0.0.0.0 and :: are the
			// same dual-stack socket (server's wildcard_linux.go).
			if i := slices.IndexFunc(m.listen, netip.Addr.IsUnspecified); i >= 0 {
				a = m.listen[i]
			}
			m.addListen(a)
			// The interface and the rules are -localip's, as the stock's.
			for _, l := range c.LocalIPs {
				m.addCreated(l)
			}
			m.mapped(s, "bind %s: every address of this host, now and later, one wildcard socket (as CoreDNS's: dual-stack, IPv4 and IPv6), each answer sent from the address its query was sent to", a)
			continue
		}
		m.addListen(a)
		if !c.foundOnHost(s, a) {
			m.addCreated(a)
		}
	}
	for name, addrs := range s.BindIfaces {
		m.mapped(s, "bind %s: the interface's addresses %v", name, addrs)
	}
	if len(s.Bind) > 0 {
		m.mapped(s, "bind %v: listen addresses", s.Bind)
	}
}

// forward maps the block's (first) forward: to kube-dns, to the node's
// resolvers (the "." block), or a zone route.
func (m *mapping) forward(s *corefile.Server) error {
	c, f := m.c, s.Forward
	switch {
	case f == nil:
		m.mapped(s, "no forward: names of %v are not forwarded by this block; the longest other zone's route answers them", s.Zones)
	case f.From != "." && !slices.Contains(s.Zones, f.From):
		return usage("%s: forward %s: FROM must be \".\" or one of the block's zones %v", s.Pos, f.From, s.Zones)
	case m.isKube(f):
		if c.DropIn.KubeForward == nil { // the cluster domain's block first
			o := forwardOptions(f, c.MaxInflight)
			c.DropIn.KubeForward = &o
		}
		root := c.addKubeZones(s, m.firstOf)
		how := "pipelined TCP (force_tcp)"
		if !f.ForceTCP {
			how = "pipelined TCP (our kube-dns group always uses TCP: one connection carries many queries, no conntrack entry per query)"
		}
		m.mapped(s, "forward . %v: zones %v go to kube-dns %s over %s", upstreams(f), s.Zones, c.KubeDNS, how)
		if root {
			m.mapped(s, "forward . %v in the \".\" block: every name no other block forwards goes to kube-dns, as the stock's; the node's resolvers (-resolv-conf, upstreamNameservers) are not asked", upstreams(f))
		}
	case slices.Contains(s.Zones, ".") && m.firstOf["."] != s:
		m.mapped(s, "forward . %v: the \".\" zone of another bind: this block's addresses forward there (a view of its own)", upstreams(f))
	case slices.Contains(s.Zones, "."):
		return m.rootForward(s)
	default:
		ns, err := c.resolve(s, f)
		if err != nil {
			return err
		}
		for _, z := range s.Zones {
			if m.firstOf[z] != s {
				continue // the zone's first block routes it; views route the others (views.go)
			}
			c.DropIn.Routes = append(c.DropIn.Routes, ZoneRoute{Zone: z, Servers: ns, ForceTCP: f.ForceTCP, Opts: forwardOptions(f, c.MaxInflight), From: s.Pos.String()})
		}
		m.mapped(s, "forward . %v: zones %v routed to their own group %v (like a stub domain)%s", upstreams(f), s.Zones, ns, map[bool]string{true: " over TCP", false: ""}[f.ForceTCP])
	}
	return nil
}

// rootForward maps the "." block's forward: the node's resolvers.
func (m *mapping) rootForward(s *corefile.Server) error {
	c, f := m.c, s.Forward
	o := forwardOptions(f, c.MaxInflight)
	c.DropIn.NodeForward = &o
	if len(f.To) == 1 && f.To[0].ResolvConf != "" {
		if m.set["resolv-conf"] && c.ResolvConf != f.To[0].ResolvConf {
			m.flagWins("resolv-conf", "forward .", f.To[0].ResolvConf, c.ResolvConf)
		} else {
			c.ResolvConf = f.To[0].ResolvConf
		}
		m.mapped(s, "forward . %s: every other name goes to the node's resolvers read from %s (watched)", f.To[0].ResolvConf, c.ResolvConf)
	} else {
		ns, err := c.resolve(s, f)
		if err != nil {
			return err
		}
		c.Nameservers, c.ResolvConf = ns, ""
		// upstreamNameservers do not replace literal targets (as stock).
		m.cc.RootLiteral = !slices.ContainsFunc(f.To, func(u corefile.Upstream) bool { return u.ResolvConf != "" })
		m.mapped(s, "forward . %v: every other name goes to %v", upstreams(f), ns)
	}
	if f.ForceTCP {
		m.mapped(s, "force_tcp: the node's resolvers are asked over TCP")
	}
	return nil
}

// forwardOptions checks the block's forward's TLS files and notes its
// options.
func (m *mapping) forwardOptions(s *corefile.Server) error {
	c, f := m.c, s.Forward
	if f == nil {
		return nil
	}
	if f.UsesTLS() {
		o := forwardOptions(f, c.MaxInflight)
		if _, err := o.TLSConfig(); err != nil {
			pos := s.Pos
			for _, p := range s.Plugins {
				if p.Name == "forward" {
					pos = p.Pos
				}
			}
			return usage("%s: %v", pos, err)
		}
	} else if f.TLS != nil {
		m.mapped(s, "forward tls/tls_servername: no tls:// upstream, unused (as CoreDNS)")
	}
	m.mapped(s, "forward options: policy %s, max_fails %d, expire %v, health_check %v, max_concurrent %d: the group's %s",
		f.Policy, f.MaxFails, f.Expire, f.HealthCheck, f.MaxConcurrent, forwardOptions(f, c.MaxInflight))
	if (len(f.Next) > 0 || f.NextOnNodata) && len(s.MoreForwards) == 0 {
		m.mapped(s, "forward next/next_on_nodata: the block has one forward, so the upstream's answer is returned as it is (CoreDNS hands it on only to a further forward)")
	}
	if len(f.Except) > 0 && len(s.MoreForwards) == 0 {
		m.mapped(s, "forward except %v: names there that this block answers are not forwarded: SERVFAIL, as CoreDNS without a plugin after forward (a zone with a block of its own is answered by that block)", f.Except)
	}
	return nil
}

// cache adds the block's cache to the shared cache's capacities.
func (m *mapping) cache(s *corefile.Server) {
	ca := s.Cache
	if ca == nil {
		m.mapped(s, "no cache: names of %v are not cached", s.Zones)
		return
	}
	m.haveCache = true
	m.succCap += ca.SuccessCap
	m.denCap += ca.DenialCap
	policy := ""
	if ca.PreferPositive {
		policy = " (serve_stale_policy prefer_positive)"
	}
	m.mapped(s, "cache: success %d cap %v min %v, denial %d cap %v min %v, servfail %v, prefetch %d, serve_stale %v%s: the policy of names in %v; capacities add to the shared cache",
		ca.SuccessCap, ca.SuccessTTL, ca.SuccessMinTTL, ca.DenialCap, ca.DenialTTL, ca.DenialMinTTL, ca.ServFail, ca.Prefetch, ca.ServeStale, policy, s.Zones)
}

// endpoints maps the block's health, prometheus and pprof addresses.
func (m *mapping) endpoints(s *corefile.Server) error {
	c := m.c
	if s.Health != nil {
		if m.health != "" && m.health != s.Health.Addr {
			return usage("%s: health %s: another block serves health on %s; one health address is supported", s.Pos, s.Health.Addr, m.health)
		}
		m.health = s.Health.Addr
		if s.Health.LameDuck > 0 {
			if m.set["lameduck"] && c.LameDuck != s.Health.LameDuck {
				m.flagWins("lameduck", "health lameduck", s.Health.LameDuck, c.LameDuck)
			} else {
				c.LameDuck = s.Health.LameDuck
			}
		}
		m.mapped(s, "health %s: /health (and /ready) there", s.Health.Addr)
	}
	if s.Prometheus != "" {
		if m.metrics == "" {
			m.metrics = s.Prometheus
		} else if m.metrics != s.Prometheus {
			c.note("%s: prometheus %s: metrics are served once, on %s (the first block's address)", s.Pos, s.Prometheus, m.metrics)
		}
		m.mapped(s, "prometheus %s: /metrics there", s.Prometheus)
	}
	if s.PProf != "" {
		if m.set["pprof"] && c.PProf != s.PProf {
			m.flagWins("pprof", "pprof", s.PProf, c.PProf)
		} else {
			c.PProf = s.PProf
		}
		m.mapped(s, "pprof %s: /debug/pprof/ on %s, a listener of its own", s.PProf, c.PProf)
		if s.PProfBlock != 0 {
			c.PProfBlock = s.PProfBlock
			m.mapped(s, "pprof block %d: the block profile on (/debug/pprof/block), one event per %d ns blocked", s.PProfBlock, s.PProfBlock)
		}
	}
	return nil
}

// serverSettings maps the block's timeouts and bufsize: one DNS server
// serves every block, as CoreDNS's blocks on one port share one, so the
// last block's win, as there.
func (m *mapping) serverSettings(s *corefile.Server) {
	c := m.c
	if t := s.Timeouts; t != nil {
		if t.Read > 0 {
			c.DropIn.TCPReadTimeout = t.Read
		}
		if t.Write > 0 {
			c.DropIn.TCPWriteTimeout = t.Write
		}
		if t.Idle > 0 {
			if m.set["tcp-idle-timeout"] && c.TCPIdleTimeout != t.Idle {
				m.flagWins("tcp-idle-timeout", "timeouts idle", t.Idle, c.TCPIdleTimeout)
			} else {
				c.TCPIdleTimeout = t.Idle
			}
		}
		if t.MaxTCPQueries != 0 {
			c.DropIn.TCPMaxQueries = t.MaxTCPQueries
		}
		m.mapped(s, "timeouts read %v write %v idle %v maxtcpqueries %d: client TCP connections (0: unchanged; -1: unlimited)", t.Read, t.Write, t.Idle, t.MaxTCPQueries)
	}
	if s.Bufsize > 0 {
		if m.set["max-udp-size"] && c.MaxUDPSize != s.Bufsize {
			m.flagWins("max-udp-size", "bufsize", s.Bufsize, c.MaxUDPSize)
		} else {
			c.MaxUDPSize = s.Bufsize
		}
		m.mapped(s, "bufsize %d: the EDNS size we advertise and the largest UDP answer", s.Bufsize)
	}
}

// listenAddrs makes the blocks' binds the listen addresses.
func (m *mapping) listenAddrs() {
	c, listen := m.c, m.listen
	if len(listen) == 0 {
		return
	}
	if m.set["localip"] && !slices.Equal(listen, c.LocalIPs) {
		c.note("the Corefile's binds %v are the listen addresses; -localip %v only fills blocks without bind and names the interface's addresses in node-cache", listen, c.LocalIPs)
	}
	// The health and metrics addresses derived from -localip follow the
	// listen addresses when -localip is not among them (bind 0.0.0.0
	// without -setupinterface: a pod's own addresses). With the wildcard,
	// -localip stays theirs when -setupinterface creates it (the wildcard
	// serves it; 0.0.0.0 would clash with the node's own services on a
	// host network).
	wildLocal := slices.ContainsFunc(listen, netip.Addr.IsUnspecified) && c.SetupInterface && !c.LocalMode
	if old := c.LocalIPs[0]; !slices.Contains(listen, old) && !wildLocal {
		for flag, hp := range map[string]*string{"health-listen-address": &c.HealthAddr, "metrics-listen-address": &c.MetricsAddr} {
			if ap, err := netip.ParseAddrPort(*hp); err == nil && ap.Addr() == old && !m.set[flag] {
				*hp = netip.AddrPortFrom(listen[0], ap.Port()).String()
			}
		}
	}
	c.LocalIPs = listen
	c.InterfaceIPs = m.created
	c.Listen = nil
	for _, ap := range m.sockets {
		if int(ap.Port()) != c.Port {
			c.Listen = m.sockets
			m.mapped(m.cc.Servers[0], "listen: %v: blocks on several ports, each block served on its own port", m.sockets)
			break
		}
	}
}

// healthAndMetrics sets the health and metrics addresses from the blocks'.
func (m *mapping) healthAndMetrics() {
	c, health := m.c, m.health
	if health != "" {
		if m.set["health-listen-address"] {
			m.flagWins("health-listen-address", "health", health, c.HealthAddr)
		} else {
			c.HealthAddr = health
		}
		if p, err := strconv.Atoi(health[strings.LastIndexByte(health, ':')+1:]); err == nil && p != c.HealthPort {
			if m.set["health-port"] {
				// node-cache uses -health-port only for its conntrack rule;
				// the Corefile's health listens where it says.
				c.note("-health-port %d: the NOTRACK rule names it, but the Corefile's health listens on port %d; the rule follows the Corefile (%d)", c.HealthPort, p, p)
			}
			c.HealthPort = p
		}
	}
	// node-cache serves its own metrics on -metrics-listen-address
	// (default 0.0.0.0:9353) besides CoreDNS's prometheus: so do we.
	nodeCache := nodeCacheMetricsDefault
	if m.set["metrics-listen-address"] {
		nodeCache = c.MetricsAddr
	}
	if m.metrics != "" {
		c.MetricsAddr = m.metrics
	}
	if nodeCache != c.MetricsAddr {
		c.DropIn.NodeCacheMetricsAddr = nodeCache
		m.mapped(m.cc.Servers[0], "-metrics-listen-address %s: node-cache's own endpoint, served too (/metrics, /health, /ready)", nodeCache)
	}
}

// nodeCacheMetricsDefault is node-cache's -metrics-listen-address default.
const nodeCacheMetricsDefault = "0.0.0.0:9353"

var noopWhy = map[string]string{
	"errors": "errors are logged once per state change and counted",
	"reload": "the Corefile and ConfigMaps are watched",
	"loop":   "a forward to one of our own addresses is refused at start",
	"debug":  "panics are always recovered per query (answered SERVFAIL, counted in nodelocaldns_panics_recovered_total, logged); logs are structured",
}

// resolve turns a forward's targets into addresses, reading resolv.conf
// paths (our own addresses dropped, as for -resolv-conf). A target that is
// one of our own listen sockets is refused: forwarding there loops.
func (c *Config) resolve(s *corefile.Server, f *corefile.Forward) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, u := range f.To {
		if u.ResolvConf == "" {
			if c.Ours(u.Addr) {
				return nil, usage("%s: forward %s %s: one of our own listen sockets: forwarding there loops back into us", s.Pos, f.From, u.Addr)
			}
			out = append(out, u.Addr)
			continue
		}
		ns, err := LoadResolvConf(u.ResolvConf, c.LocalIPs, c.Port)
		if err != nil {
			return nil, usage("%s: forward %s: %v", s.Pos, u.ResolvConf, err)
		}
		out = append(out, ns...)
	}
	return out, nil
}

func upstreams(f *corefile.Forward) []string {
	out := make([]string, len(f.To))
	for i, u := range f.To {
		out[i] = u.String()
	}
	return out
}

// addKubeZones adds to the kube-dns zones those of block s (whose forward
// targets kube-dns) that s is the first block for, "." too: kops'
// forwardToKubeDNS, Gardener's disableForwardToUpstreamDNS and users send
// every name to kube-dns (its rewrites and stub zones), as the stock does.
// It reports whether "." is one of them.
func (c *Config) addKubeZones(s *corefile.Server, firstOf map[string]*corefile.Server) (root bool) {
	for _, z := range s.Zones {
		if firstOf[z] == s && !slices.Contains(c.DropIn.KubeDNSZones, z) {
			c.DropIn.KubeDNSZones = append(c.DropIn.KubeDNSZones, z)
		}
	}
	return firstOf["."] == s && slices.Contains(s.Zones, ".")
}
