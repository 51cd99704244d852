package config

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
)

// mapCorefile translates the typed Corefile into the daemon's settings:
// listen addresses = the union of the binds; kube-dns = the forward target
// of the cluster domain's block, and every block forwarding there goes to
// kube-dns whatever its zones; the "." block's forward = the node's
// resolvers; other forward blocks = zone routes; cache capacities add up,
// TTL caps come from the cluster block and the "." block (every block's
// policy is in cc.Policies); health, metrics, log, pprof, bufsize as said.
// A flag given explicitly wins over the Corefile, with a note.
func (c *Config) mapCorefile(cc *CorefileConfig, set map[string]bool) error {
	srv := cc.Servers
	cc.Policies = corefile.NewPolicies(srv)
	mapped := func(s *corefile.Server, format string, a ...any) {
		cc.Mapping = append(cc.Mapping, fmt.Sprintf("%s  %s", s.Pos, fmt.Sprintf(format, a...)))
	}
	flagWins := func(flag, what string, corefileVal, flagVal any) {
		c.note("-%s %v wins over the Corefile's %s %v: a flag given explicitly is the operator's latest word", flag, flagVal, what, corefileVal)
	}

	// The DNS port is the first block's (CoreDNS's -dns.port only fills
	// keys without a port); blocks on other ports listen there too
	// (Listen).
	port := srv[0].Port
	if port != c.Port {
		c.note("the Corefile's port %d wins over -port/-dns.port %d: as in CoreDNS, the flag only fills keys written without a port", port, c.Port)
		c.Port = port
	}

	// kube-dns: the cluster domain block's forward target.
	var kube []netip.AddrPort
	for _, s := range srv {
		if slices.Contains(s.Zones, c.ClusterDomain) && s.Forward != nil && s.Forward.From == "." {
			for _, u := range s.Forward.To {
				if u.ResolvConf == "" {
					kube = append(kube, u.Addr)
				}
			}
			if len(kube) > 0 {
				if set["kube-dns"] && c.KubeDNS != kube[0] {
					flagWins("kube-dns", "cluster DNS", kube[0], c.KubeDNS)
				} else if !c.LocalMode {
					c.KubeDNS, c.KubeDNSSource = kube[0], "Corefile "+s.Pos.String()
				}
				if len(kube) > 1 && !set["kube-dns"] && !c.LocalMode {
					c.DropIn.KubeDNSAlso = slices.Clone(kube[1:])
					mapped(s, "forward . %v: the kube-dns group asks %v too, by the block's policy, with failover", kube, kube[1:])
				} else if len(kube) > 1 {
					c.note("%s: the cluster domain forwards to %v; kube-dns is asked at %s only (-kube-dns given)", s.Pos, kube, c.KubeDNS)
				}
			}
			break
		}
	}
	if !c.LocalMode && c.KubeDNS.IsValid() && !slices.Contains(kube, c.KubeDNS) {
		kube = append(kube, c.KubeDNS)
	}
	isKube := func(f *corefile.Forward) bool {
		if f == nil {
			return false
		}
		for _, u := range f.To {
			if u.ResolvConf != "" || !slices.Contains(kube, u.Addr) {
				return false
			}
		}
		return true
	}

	var listen, created []netip.Addr
	var sockets []netip.AddrPort // every block's listen addresses on its port
	var blockPort uint16
	addListen := func(a netip.Addr) {
		if !slices.Contains(listen, a) {
			listen = append(listen, a)
		}
		if ap := netip.AddrPortFrom(a, blockPort); !slices.Contains(sockets, ap) {
			sockets = append(sockets, ap)
		}
	}
	// created: the listen addresses that are the interface's (-localip, and
	// explicit binds, as before): the ones -setupinterface puts on it and
	// the rules name. Addresses found on the host (the wildcard's, an
	// interface's) are neither.
	addCreated := func(a netip.Addr) {
		if !slices.Contains(created, a) {
			created = append(created, a)
		}
	}
	var succCap, denCap int
	haveCache := false
	var metrics, health string
	// A zone in several blocks (other binds): the first block fills the
	// shared route table; the views (views.go) route the others.
	firstOf := map[string]*corefile.Server{}
	for _, s := range srv {
		for _, z := range s.Zones {
			if firstOf[z] == nil {
				firstOf[z] = s
			}
		}
	}
	taps := map[string]bool{} // distinct dnstap directives (dnstap.MaxTaps)
	for _, s := range srv {
		blockPort = uint16(s.Port)
		// bind
		if len(s.Bind) == 0 {
			for _, a := range c.LocalIPs {
				addListen(a)
				addCreated(a)
			}
			mapped(s, "bind: none: serving on -localip %v", c.LocalIPs)
		}
		for _, a := range s.Bind {
			if a.IsUnspecified() {
				// One wildcard socket, as CoreDNS's: 0.0.0.0 and :: are
				// the same dual-stack socket (server's wildcard_linux.go).
				if i := slices.IndexFunc(listen, netip.Addr.IsUnspecified); i >= 0 {
					a = listen[i]
				}
				addListen(a)
				// The interface and the rules are -localip's, as the
				// stock's.
				for _, l := range c.LocalIPs {
					addCreated(l)
				}
				mapped(s, "bind %s: every address of this host, now and later, one wildcard socket (as CoreDNS's: dual-stack, IPv4 and IPv6), each answer sent from the address its query was sent to", a)
				continue
			}
			addListen(a)
			if !c.foundOnHost(s, a) {
				addCreated(a)
			}
		}
		for name, addrs := range s.BindIfaces {
			mapped(s, "bind %s: the interface's addresses %v", name, addrs)
		}
		if len(s.Bind) > 0 {
			mapped(s, "bind %v: listen addresses", s.Bind)
		}
		// forward
		f := s.Forward
		switch {
		case f == nil:
			mapped(s, "no forward: names of %v are not forwarded by this block; the longest other zone's route answers them", s.Zones)
		case f.From != "." && !slices.Contains(s.Zones, f.From):
			return usage("%s: forward %s: FROM must be \".\" or one of the block's zones %v", s.Pos, f.From, s.Zones)
		case isKube(f):
			if c.DropIn.KubeForward == nil { // the cluster domain's block first
				o := forwardOptions(f, c.MaxInflight)
				c.DropIn.KubeForward = &o
			}
			root := c.addKubeZones(s, firstOf)
			how := "pipelined TCP (force_tcp)"
			if !f.ForceTCP {
				how = "pipelined TCP (our kube-dns group always uses TCP: one connection carries many queries, no conntrack entry per query)"
			}
			mapped(s, "forward . %v: zones %v go to kube-dns %s over %s", upstreams(f), s.Zones, c.KubeDNS, how)
			if root {
				mapped(s, "forward . %v in the \".\" block: every name no other block forwards goes to kube-dns, as the stock's; the node's resolvers (-resolv-conf, upstreamNameservers) are not asked", upstreams(f))
			}
		case slices.Contains(s.Zones, ".") && firstOf["."] != s:
			mapped(s, "forward . %v: the \".\" zone of another bind: this block's addresses forward there (a view of its own)", upstreams(f))
		case slices.Contains(s.Zones, "."):
			o := forwardOptions(f, c.MaxInflight)
			c.DropIn.NodeForward = &o
			if len(f.To) == 1 && f.To[0].ResolvConf != "" {
				if set["resolv-conf"] && c.ResolvConf != f.To[0].ResolvConf {
					flagWins("resolv-conf", "forward .", f.To[0].ResolvConf, c.ResolvConf)
				} else {
					c.ResolvConf = f.To[0].ResolvConf
				}
				mapped(s, "forward . %s: every other name goes to the node's resolvers read from %s (watched)", f.To[0].ResolvConf, c.ResolvConf)
			} else {
				ns, err := c.resolve(s, f)
				if err != nil {
					return err
				}
				c.Nameservers, c.ResolvConf = ns, ""
				// upstreamNameservers do not replace literal targets (as stock).
				cc.RootLiteral = !slices.ContainsFunc(f.To, func(u corefile.Upstream) bool { return u.ResolvConf != "" })
				mapped(s, "forward . %v: every other name goes to %v", upstreams(f), ns)
			}
			if f.ForceTCP {
				mapped(s, "force_tcp: the node's resolvers are asked over TCP")
			}
		default:
			ns, err := c.resolve(s, f)
			if err != nil {
				return err
			}
			for _, z := range s.Zones {
				if firstOf[z] != s {
					continue // the zone's first block routes it; views route the others (views.go)
				}
				c.DropIn.Routes = append(c.DropIn.Routes, ZoneRoute{Zone: z, Servers: ns, ForceTCP: f.ForceTCP, Opts: forwardOptions(f, c.MaxInflight), From: s.Pos.String()})
			}
			mapped(s, "forward . %v: zones %v routed to their own group %v (like a stub domain)%s", upstreams(f), s.Zones, ns, map[bool]string{true: " over TCP", false: ""}[f.ForceTCP])
		}
		if f != nil && f.UsesTLS() {
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
		} else if f != nil && f.TLS != nil {
			mapped(s, "forward tls/tls_servername: no tls:// upstream, unused (as CoreDNS)")
		}
		if f != nil {
			mapped(s, "forward options: policy %s, max_fails %d, expire %v, health_check %v, max_concurrent %d: the group's %s",
				f.Policy, f.MaxFails, f.Expire, f.HealthCheck, f.MaxConcurrent, forwardOptions(f, c.MaxInflight))
			if (len(f.Next) > 0 || f.NextOnNodata) && len(s.MoreForwards) == 0 {
				mapped(s, "forward next/next_on_nodata: the block has one forward, so the upstream's answer is returned as it is (CoreDNS hands it on only to a further forward)")
			}
			if len(f.Except) > 0 && len(s.MoreForwards) == 0 {
				mapped(s, "forward except %v: names there that this block answers are not forwarded: SERVFAIL, as CoreDNS without a plugin after forward (a zone with a block of its own is answered by that block)", f.Except)
			}
		}
		if len(s.MoreForwards) > 0 {
			links, err := c.forwardLinks(s, isKube)
			if err != nil {
				return err
			}
			if cc.Links == nil {
				cc.Links = map[*corefile.Server][]ForwardLink{}
			}
			cc.Links[s] = links
			all := append([]*corefile.Forward{f}, s.MoreForwards...)
			for i, g := range all {
				var how []string
				if g.From != "." {
					how = append(how, "names outside "+g.From+" go on to the next forward")
				}
				if len(g.Except) > 0 {
					how = append(how, fmt.Sprintf("names under %v go on to the next forward", g.Except))
				}
				if len(g.Next) > 0 || g.NextOnNodata {
					var rcs []string
					for _, rc := range g.Next {
						rcs = append(rcs, dns.RcodeToString[rc])
					}
					if g.NextOnNodata {
						rcs = append(rcs, "NODATA")
					}
					if i == len(all)-1 {
						how = append(how, fmt.Sprintf("next %v: the last forward, so returned as it is (as CoreDNS)", rcs))
					} else {
						how = append(how, fmt.Sprintf("answers %v go on to the next forward", rcs))
					}
				}
				group := "the block's group (above)"
				if i > 0 {
					group = fmt.Sprintf("a group of its own %v", links[i-1].Route.Servers)
					if links[i-1].Kube {
						group = fmt.Sprintf("a group of its own to kube-dns %v over pipelined TCP", links[i-1].Route.Servers)
					}
				}
				mapped(s, "forward %d of %d (%s %v): %s; %s", i+1, len(all), g.From, upstreams(g), group, strings.Join(append(how, "the rest is answered here"), "; "))
			}
		}
		// cache
		if ca := s.Cache; ca != nil {
			haveCache = true
			succCap += ca.SuccessCap
			denCap += ca.DenialCap
			policy := ""
			if ca.PreferPositive {
				policy = " (serve_stale_policy prefer_positive)"
			}
			mapped(s, "cache: success %d cap %v min %v, denial %d cap %v min %v, servfail %v, prefetch %d, serve_stale %v%s: the policy of names in %v; capacities add to the shared cache",
				ca.SuccessCap, ca.SuccessTTL, ca.SuccessMinTTL, ca.DenialCap, ca.DenialTTL, ca.DenialMinTTL, ca.ServFail, ca.Prefetch, ca.ServeStale, policy, s.Zones)
		} else {
			mapped(s, "no cache: names of %v are not cached", s.Zones)
		}
		if s.Health != nil {
			if health != "" && health != s.Health.Addr {
				return usage("%s: health %s: another block serves health on %s; one health address is supported", s.Pos, s.Health.Addr, health)
			}
			health = s.Health.Addr
			if s.Health.LameDuck > 0 {
				if set["lameduck"] && c.LameDuck != s.Health.LameDuck {
					flagWins("lameduck", "health lameduck", s.Health.LameDuck, c.LameDuck)
				} else {
					c.LameDuck = s.Health.LameDuck
				}
			}
			mapped(s, "health %s: /health (and /ready) there", s.Health.Addr)
		}
		if s.Prometheus != "" {
			if metrics == "" {
				metrics = s.Prometheus
			} else if metrics != s.Prometheus {
				c.note("%s: prometheus %s: metrics are served once, on %s (the first block's address)", s.Pos, s.Prometheus, metrics)
			}
			mapped(s, "prometheus %s: /metrics there", s.Prometheus)
		}
		if s.PProf != "" {
			if set["pprof"] && c.PProf != s.PProf {
				flagWins("pprof", "pprof", s.PProf, c.PProf)
			} else {
				c.PProf = s.PProf
			}
			mapped(s, "pprof %s: /debug/pprof/ on %s, a listener of its own", s.PProf, c.PProf)
			if s.PProfBlock != 0 {
				c.PProfBlock = s.PProfBlock
				mapped(s, "pprof block %d: the block profile on (/debug/pprof/block), one event per %d ns blocked", s.PProfBlock, s.PProfBlock)
			}
		}
		if s.Log {
			var rs []string
			for _, r := range s.LogRules {
				rs = append(rs, r.String())
			}
			mapped(s, "log: CoreDNS's query log lines on stdout, for the queries this block answers: %s", strings.Join(rs, "; "))
		}
		if s.Whoami && s.ForwardAnswersAll() {
			// Gardener's documented coredns-custom example puts whoami in
			// the blocks' overrides, beside their forward: CoreDNS never
			// reaches it.
			mapped(s, "whoami: never reached, as in CoreDNS: it runs after forward, and forward %s answers every name of this block; no query is answered by whoami", s.Forward.From)
			c.note("%s: whoami is never reached (forward %s answers every name of the block first, as in CoreDNS): it answers nothing", s.Pos, s.Forward.From)
		} else if s.Whoami {
			// whoami comes after template, hosts and forward in plugin.cfg
			// (and rewrite, dns64 act on what it answers): with any of them
			// it answers only what they pass on.
			var before []string
			for _, p := range []struct {
				on   bool
				name string
			}{{s.Forward != nil, "forward"}, {len(s.Templates) > 0, "template"}, {s.Hosts != nil, "hosts"}, {len(s.Rewrites) > 0, "rewrite"}, {s.DNS64 != nil, "dns64"}} {
				if p.on {
					before = append(before, p.name)
				}
			}
			if len(before) > 0 {
				return usage("%s: whoami with %s in the same block is not supported: CoreDNS runs whoami after them, for the names they pass on only; give whoami a block of its own", s.Pos, strings.Join(before, ", "))
			}
			note := "whoami: every query of the block answered with the client's own address and port (A or AAAA and SRV in the additional section, TTL 0), per client: never cached, coalesced or forwarded"
			if s.Cache != nil {
				note += "; CoreDNS's cache in the same block would keep one client's answer 5 s and give it to the others, ours does not"
			}
			mapped(s, "%s", note)
		}
		for _, t := range s.Dnstap {
			full := ""
			if t.Full {
				full = " full"
			}
			q := fmt.Sprintf("a queue of %d messages", t.QueueLen())
			if asked := max(t.QueueMultiple, 1) * dnstap.QueueUnit; asked > t.QueueLen() {
				q = fmt.Sprintf("a queue of %d messages (QUEUE asks for %d: at most %d here, each slot allocated at start)", t.QueueLen(), asked, dnstap.MaxQueueLen)
			}
			mapped(s, "dnstap %s%s: CLIENT_QUERY and CLIENT_RESPONSE of every query this block answers (cache hits too), identity %q, version %q; %s and at most %d MiB waiting in all taps, dropped and counted when the collector is slow or gone", t.Endpoint(), full, t.Identity, t.Version, q, dnstap.MaxQueueBytes>>20)
			if ap, err := netip.ParseAddrPort(t.Address); err == nil && t.Network != "unix" && c.Ours(ap) {
				return usage("%s: dnstap %s: one of our own DNS listen sockets: its frames would come back to us as queries, tapped in turn (a loop)", s.Pos, t.Endpoint())
			}
			taps[t.Key()] = true
			if len(taps) > dnstap.MaxTaps {
				return usage("%s: dnstap: more than %d distinct dnstap directives in the Corefile (each a queue, a connection and a goroutine)", s.Pos, dnstap.MaxTaps)
			}
		}
		if t := s.Trace; t != nil {
			mapped(s, "trace: %s spans of one query in %d to %s, service %q (internal/trace): sent in the background, dropped and counted when the collector is slow or gone", t.Type, t.Every, t.Endpoint, t.Service)
		}
		switch b := s.Balance; {
		case b != nil && b.Weights != nil:
			w := b.Weights
			mapped(s, "loadbalance weighted %s: one address of each A, AAAA or SRV answer of this block drawn by weight put first (cache hits too); %d names weighed, the file read again every %v when it changed", w.File, w.Names(), w.Reload)
			if w.Names() == 0 {
				if _, err := os.Stat(w.File); err != nil {
					c.note("%s: loadbalance weighted: %v; read again every %v (CoreDNS warns and retries the same way)", s.Pos, err, w.Reload)
				}
			}
		case b != nil:
			mapped(s, "loadbalance: the A, AAAA and MX records of every answer of this block shuffled (round_robin), then the addresses in %v first, in that order (prefer), cache hits too", b.Prefer)
		case s.Loadbalance:
			mapped(s, "loadbalance: the A, AAAA and MX records of every answer of this block shuffled (round_robin), cache hits too")
		}
		if s.Metadata {
			mapped(s, "metadata: the labels log sets (log/type, log/class) have values in this block's log formats; no other directive sets one before a query is forwarded (template's .Meta and rewrite edns0 {/label} values stay empty, as in CoreDNS with the stock node-cache's plugins)")
		}
		if t := s.Timeouts; t != nil {
			// One DNS server serves every block, as CoreDNS's blocks on one
			// port share one: the last block's timeouts win, as there.
			if t.Read > 0 {
				c.DropIn.TCPReadTimeout = t.Read
			}
			if t.Write > 0 {
				c.DropIn.TCPWriteTimeout = t.Write
			}
			if t.Idle > 0 {
				if set["tcp-idle-timeout"] && c.TCPIdleTimeout != t.Idle {
					flagWins("tcp-idle-timeout", "timeouts idle", t.Idle, c.TCPIdleTimeout)
				} else {
					c.TCPIdleTimeout = t.Idle
				}
			}
			if t.MaxTCPQueries != 0 {
				c.DropIn.TCPMaxQueries = t.MaxTCPQueries
			}
			mapped(s, "timeouts read %v write %v idle %v maxtcpqueries %d: client TCP connections (0: unchanged; -1: unlimited)", t.Read, t.Write, t.Idle, t.MaxTCPQueries)
		}
		if s.Bufsize > 0 {
			if set["max-udp-size"] && c.MaxUDPSize != s.Bufsize {
				flagWins("max-udp-size", "bufsize", s.Bufsize, c.MaxUDPSize)
			} else {
				c.MaxUDPSize = s.Bufsize
			}
			mapped(s, "bufsize %d: the EDNS size we advertise and the largest UDP answer", s.Bufsize)
		}
		for _, p := range s.Plugins {
			if p.NoOp {
				mapped(s, "%s: accepted, no-op (%s)", p.Name, noopWhy[p.Name])
			}
			if why, ok := fetchSide[p.Name]; ok {
				mapped(s, "%s: %s", strings.TrimSpace(p.Name+" "+strings.Join(p.Args, " ")), why)
			}
		}
	}
	if len(listen) > 0 {
		if set["localip"] && !slices.Equal(listen, c.LocalIPs) {
			c.note("the Corefile's binds %v are the listen addresses; -localip %v only fills blocks without bind and names the interface's addresses in node-cache", listen, c.LocalIPs)
		}
		// The health and metrics addresses derived from -localip follow
		// the listen addresses when -localip is not among them (bind
		// 0.0.0.0 without -setupinterface: a pod's own addresses).
		// With the wildcard, -localip stays theirs when -setupinterface
		// creates it (the wildcard serves it; 0.0.0.0 would clash with
		// the node's own services on a host network).
		wildLocal := slices.ContainsFunc(listen, netip.Addr.IsUnspecified) && c.SetupInterface && !c.LocalMode
		if old := c.LocalIPs[0]; !slices.Contains(listen, old) && !wildLocal {
			for flag, hp := range map[string]*string{"health-listen-address": &c.HealthAddr, "metrics-listen-address": &c.MetricsAddr} {
				if ap, err := netip.ParseAddrPort(*hp); err == nil && ap.Addr() == old && !set[flag] {
					*hp = netip.AddrPortFrom(listen[0], ap.Port()).String()
				}
			}
		}
		c.LocalIPs = listen
		c.InterfaceIPs = created
		c.Listen = nil
		for _, ap := range sockets {
			if int(ap.Port()) != c.Port {
				c.Listen = sockets
				mapped(srv[0], "listen: %v: blocks on several ports, each block served on its own port", sockets)
				break
			}
		}
	}
	if health != "" {
		if set["health-listen-address"] {
			flagWins("health-listen-address", "health", health, c.HealthAddr)
		} else {
			c.HealthAddr = health
		}
		if p, err := strconv.Atoi(health[strings.LastIndexByte(health, ':')+1:]); err == nil && p != c.HealthPort {
			if set["health-port"] {
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
	if set["metrics-listen-address"] {
		nodeCache = c.MetricsAddr
	}
	if metrics != "" {
		c.MetricsAddr = metrics
	}
	if nodeCache != c.MetricsAddr {
		c.DropIn.NodeCacheMetricsAddr = nodeCache
		mapped(srv[0], "-metrics-listen-address %s: node-cache's own endpoint, served too (/metrics, /health, /ready)", nodeCache)
	}
	if !c.LocalMode && (slices.Contains(c.Sockets(), c.KubeDNS) || (int(c.KubeDNS.Port()) == c.Port && serves(c.LocalIPs, c.KubeDNS.Addr()))) {
		return usage("kube-dns %s (from %s) is one of the Corefile's listen addresses (bind): forwarding there loops; forward to a second Service in front of the kube-dns pods (__PILLAR__CLUSTER__DNS__, -upstreamsvc kube-dns-upstream)", c.KubeDNS, c.KubeDNSSource)
	}
	dropped, err := checkDNS64(srv, c.LocalIPs)
	if err != nil {
		return err
	}
	for _, s := range dropped {
		mapped(s, "dns64 without allow_ipv4: every listen address %v is IPv4, so its clients are IPv4 and CoreDNS translates for none of them: no effect", c.LocalIPs)
	}
	if haveCache {
		c.mapCacheTTLs(set, succCap, denCap)
	}
	return c.zonePolicies(cc, set)
}

// nodeCacheMetricsDefault is node-cache's -metrics-listen-address default.
const nodeCacheMetricsDefault = "0.0.0.0:9353"

var noopWhy = map[string]string{
	"errors": "errors are logged once per state change and counted",
	"reload": "the Corefile and ConfigMaps are watched",
	"loop":   "a forward to one of our own addresses is refused at start",
	"debug":  "panics are always recovered per query (answered SERVFAIL, counted in nodelocaldns_panics_recovered_total, logged); logs are structured",
}

// mapCacheTTLs sets the shared cache from the blocks: capacities add up
// (the byte budget stays the memory bound); the cluster domain's block gives
// the cluster TTL caps, the "." block the others.
func (c *Config) mapCacheTTLs(set map[string]bool, succCap, denCap int) {
	cc := c.DropIn.Corefile
	setDur := func(flag string, dst *time.Duration, v time.Duration) {
		if set[flag] {
			if *dst != v {
				c.note("-%s %v wins over the Corefile's %v", flag, *dst, v)
			}
			return
		}
		*dst = v
	}
	setInt := func(flag string, dst *int, v int) {
		if set[flag] {
			if *dst != v {
				c.note("-%s %d wins over the Corefile's %d", flag, *dst, v)
			}
			return
		}
		*dst = v
	}
	setInt("success-capacity", &c.Cache.SuccessCapacity, max(succCap, 1))
	setInt("denial-capacity", &c.Cache.DenialCapacity, max(denCap, 1))
	minTTL := time.Duration(-1)
	for _, p := range cc.Policies {
		if p.Cached && (minTTL < 0 || min(p.SuccessMin, p.DenialMin) < minTTL) {
			minTTL = min(p.SuccessMin, p.DenialMin)
		}
	}
	if cl, ok := cc.Policies.Lookup(c.ClusterDomain); ok && cl.Cached {
		setDur("cluster-success-ttl", &c.Cache.ClusterSuccessTTL, cl.SuccessMax)
		setDur("cluster-denial-ttl", &c.Cache.ClusterDenialTTL, cl.DenialMax)
	}
	if root, ok := cc.Policies.Lookup("."); ok && root.Cached && root.Zone == "." {
		setDur("success-ttl", &c.Cache.SuccessTTL, root.SuccessMax)
		setDur("denial-ttl", &c.Cache.DenialTTL, root.DenialMax)
		// SERVFAIL: CoreDNS caches it 5 s by default and allows 5 m; we
		// never cache it past 5 s (an upstream blip must not outlive itself).
		sf := min(root.ServFail, 5*time.Second)
		if root.ServFail > sf {
			c.note("cache servfail %v: capped at %v", root.ServFail, sf)
		}
		setDur("servfail-ttl", &c.Cache.ServFailTTL, sf)
		setDur("serve-stale", &c.Cache.StaleWindow, root.ServeStale)
		setInt("prefetch", &c.Cache.PrefetchHits, root.Prefetch)
	}
	if minTTL >= 0 {
		// The floor may not exceed any cap.
		for _, d := range []time.Duration{c.Cache.ClusterSuccessTTL, c.Cache.ClusterDenialTTL, c.Cache.SuccessTTL, c.Cache.DenialTTL} {
			minTTL = min(minTTL, d)
		}
		setDur("min-ttl", &c.Cache.MinTTL, minTTL)
	}
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
