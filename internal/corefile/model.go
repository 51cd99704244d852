package corefile

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Server is one server block, typed: what it listens on, which zones it
// answers, and each directive's settings. A nil pointer means the
// directive is absent.
type Server struct {
	Pos   Pos
	Keys  []string // as written
	Zones []string // lower-case FQDNs ("." for the root)
	Port  int      // every key's: Build splits a block whose keys name several ports (splitPorts)
	// Bind lists the addresses of `bind`: interface names resolved to
	// their addresses (Options.Interface) and except's taken out, as
	// CoreDNS's bind does; empty means every address (as CoreDNS without
	// bind). The unspecified address (0.0.0.0, ::) stays as written: it
	// is every address of the host (the caller expands it).
	Bind []netip.Addr
	// BindIfaces names the interfaces bind resolved, and what to.
	BindIfaces map[string][]netip.Addr
	binds      []bindSpec // bind directives as written, resolved by Build

	Cache   *Cache
	Forward *Forward
	// MoreForwards are the block's further forward directives, in the
	// order written (CoreDNS runs them in turn: a name one's FROM or
	// except does not take, or an answer its next or next_on_nodata
	// names, goes on to the next); Forward is the first.
	MoreForwards []*Forward
	Health       *Health
	Prometheus   string // listen address; "" when absent
	PProf        string // listen address; "" when absent
	// PProfBlock is pprof's block [RATE]: the block profile's rate
	// (runtime.SetBlockProfileRate; 0: not given).
	PProfBlock int
	Bufsize    int // 0 when absent
	Errors     bool
	Reload     bool
	Loop       bool
	Debug      bool
	// Metadata: the block has metadata (the labels log sets have values
	// in its formats).
	Metadata bool
	// Timeouts is the timeouts directive (nil when absent).
	Timeouts *Timeouts

	// Directives are the configurations of the registered directives the
	// block has (registry.go: template, hosts, rewrite, dns64, log,
	// loadbalance, whoami, trace, dnstap, ...), by name, as each
	// directive's package read them; Config returns one.
	Directives map[string]any

	// Plugins are the directives present, in CoreDNS's execution order
	// (plugin.cfg), not the order of the lines.
	Plugins []Plugin
	// Skipped are the block's entries skipped as CoreDNS skips them
	// (skip.go).
	Skipped []Skip
}

// ForwardAnswersAll reports whether the block's forward answers every name
// the block serves: its FROM holds every zone of the block, and no except,
// next or next_on_nodata hands a name or an answer on to the directives
// CoreDNS runs after forward (plugin.cfg), such as whoami.
func (s *Server) ForwardAnswersAll() bool {
	// With further forwards, the first alone answering every name is
	// enough (nothing is handed on); otherwise a name may pass them all.
	f := s.Forward
	if f == nil || len(f.Except) > 0 || len(f.Next) > 0 || f.NextOnNodata {
		return false
	}
	for _, z := range s.Zones {
		if !zone.Holds(f.From, z) {
			return false
		}
	}
	return true
}

// Plugin is one directive of a block as loaded.
type Plugin struct {
	Name string
	Pos  Pos
	Args []string
	// NoOp says the directive is accepted but its job is done another way
	// (see the table in directives.go).
	NoOp bool
	// Text is the line and its block as read (arguments and options,
	// environment references replaced; no positions): what a comparison
	// of two blocks' directives compares (Sig).
	Text string
}

// Sig is what of the block's directives decides how it answers, without
// file positions: two blocks with equal signatures answer alike. It is
// derived, not listed: the cache and forward as read, whether it has
// metadata, and every other directive's text, except those that set up
// the server rather than the block's answers (where it listens, its
// health, metrics, profiles, timeouts and buffer size, and the no-ops).
// A directive added to the Corefile's language is in it without a word.
func (s *Server) Sig() any {
	var texts []string
	for _, p := range s.Plugins {
		if !serverWide[p.Name] && p.Name != "cache" && p.Name != "forward" && p.Name != "metadata" {
			texts = append(texts, p.Text)
		}
	}
	return []any{s.Cache, s.Forward, s.MoreForwards, s.Metadata, texts}
}

// serverWide are the directives that set up the server, not a block's
// answers.
var serverWide = map[string]bool{
	"bind": true, "bufsize": true, "debug": true, "errors": true, "health": true, "loop": true,
	"pprof": true, "prometheus": true, "reload": true, "timeouts": true,
}

// Cache is the `cache` directive with CoreDNS's defaults filled in.
type Cache struct {
	SuccessCap, DenialCap       int
	SuccessTTL, DenialTTL       time.Duration // caps
	SuccessMinTTL, DenialMinTTL time.Duration // floors
	Prefetch                    int           // 0: off
	PrefetchDuration            time.Duration
	PrefetchPercent             int
	ServeStale                  time.Duration // 0: off
	ServeStaleVerify            bool
	// serve_stale's VERIFY_TIMEOUT (0: wait for the upstream), RESPONSE_TTL
	// and FAILURE_RECHECK (each with whether it was given), and
	// serve_stale_policy prefer_positive.
	ServeStaleVerifyTimeout time.Duration
	ServeStaleTTL           time.Duration
	ServeStaleTTLSet        bool
	ServeStaleRecheck       time.Duration
	ServeStaleRecheckSet    bool
	PreferPositive          bool
	ServFail                time.Duration
	// DisableSuccess and DisableDenial: `disable success|denial` for
	// every name; DisableSuccessZones and DisableDenialZones: for the
	// names under these zones only (`disable success|denial ZONE...`).
	// Denial covers SERVFAIL too, as CoreDNS's.
	DisableSuccess      bool
	DisableDenial       bool
	DisableSuccessZones []string
	DisableDenialZones  []string
	KeepTTL             bool
	// Zones limits the cache to these zones (`cache [TTL] ZONE...`; nil:
	// every name of the block, as without; empty: none, every zone
	// written skipped): the block's other names are not cached, as
	// CoreDNS's cache passes them on.
	Zones []string
}

// DisabledAt reports whether the cache keeps no positive (success) and no
// negative (denial) answers for the names of zone z: disabled for every
// name, or for a zone that is z or holds it.
func (c *Cache) DisabledAt(z string) (success, denial bool) {
	holds := func(zones []string) bool {
		return zone.HoldsAny(zones, z)
	}
	return c.DisableSuccess || holds(c.DisableSuccessZones), c.DisableDenial || holds(c.DisableDenialZones)
}

// Covers reports whether the cache holds every name of the block zone z
// (no zone limit, or a limit zone that is z or its ancestor). A limit of
// no zone (every zone written was skipped: zoneList) covers none.
func (c *Cache) Covers(z string) bool {
	if c.Zones == nil {
		return true
	}
	for _, cz := range c.Zones {
		if zone.Holds(cz, z) {
			return true
		}
	}
	return false
}

// CoreDNS's cache defaults (plugin/cache): capacity per kind, TTL caps of
// an hour (half for denials), floor 5 s, SERVFAIL cached 5 s, prefetch
// window 1 m at 10 %.
const (
	DefaultCacheCap      = 10000
	DefaultSuccessTTL    = 3600 * time.Second
	DefaultDenialTTL     = 1800 * time.Second
	DefaultMinTTL        = 5 * time.Second
	DefaultServFailTTL   = 5 * time.Second
	defaultPrefetchDur   = time.Minute
	defaultPrefetchPct   = 10
	defaultServeStale    = time.Hour
	maxStaleRecheck      = 5 * time.Minute
	maxServFailTTL       = 5 * time.Minute
	maxForwardUpstreams  = 15 // CoreDNS's forward refuses more
	maxForwards          = 16 // forward directives in one block (each is a group of its own)
	DefaultHealthAddr    = ":8080"
	DefaultPrometheus    = "localhost:9153"
	DefaultPProf         = "localhost:6053"
	defaultForwardFails  = 2
	defaultForwardExpire = 10 * time.Second
	defaultHealthCheck   = 500 * time.Millisecond
)

// Forward is the `forward` directive.
type Forward struct {
	From   string // lower-case FQDN
	To     []Upstream
	Except []string
	// Options as CoreDNS documents them, defaults filled in.
	ForceTCP    bool
	PreferUDP   bool
	Policy      string // random, round_robin, sequential
	MaxFails    int
	Expire      time.Duration
	HealthCheck time.Duration
	// HealthDomain is health_check's domain: the name a down upstream is
	// probed for (lower-case FQDN; "": the root, CoreDNS's default).
	HealthDomain  string
	MaxConcurrent int
	// FailFast is failfast_all_unhealthy_upstreams: SERVFAIL at once when
	// every upstream is down.
	FailFast bool
	// Next are next's rcodes and NextOnNodata next_on_nodata: with them
	// CoreDNS hands such an answer to the next forward of the block
	// (Server.MoreForwards); the last forward returns it as it is.
	Next         []int
	NextOnNodata bool
	// Failover are failover's rcodes, a bit per rcode (1<<rcode): an
	// answer with one of them moves on to the next upstream, as SERVFAIL
	// and REFUSED always do here.
	Failover uint16
	// MaxConnectAttempts caps the tries of one query over all upstreams
	// (max_connect_attempts; 0: no cap); unset: CoreDNS's two per
	// upstream, our walk's two passes.
	MaxConnectAttempts    int
	MaxConnectAttemptsSet bool
	// TLS is the tls option's files (CoreDNS's `tls [CERT KEY] [CA]`) and
	// tls_servername, for the tls:// upstreams; nil when neither is given.
	TLS *ForwardTLS
}

// ForwardTLS is how a forward's tls:// upstreams are asked: the client
// certificate and key ("" none), the CA file that verifies the server (""
// the system's), the name its certificate must hold ("" none: CoreDNS's
// default, which Go then refuses for an IP address without an IP SAN).
type ForwardTLS struct {
	Cert, Key, CA string
	ServerName    string
}

// UsesTLS reports whether some of the forward's upstreams are tls:// ones
// (the others, if any, are plain: Upstream.TLS says which).
func (f *Forward) UsesTLS() bool {
	return slices.ContainsFunc(f.To, func(u Upstream) bool { return u.TLS })
}

// Upstream is one forward target: an address, or a resolv.conf path whose
// nameservers are the targets.
type Upstream struct {
	Addr       netip.AddrPort
	ResolvConf string
	TLS        bool // tls://: DNS over TLS (RFC 7858), port 853 by default
	// ServerName is the target's own TLS server name (CoreDNS's
	// tls://IP%NAME), over the forward's tls_servername; "": that.
	ServerName string
}

func (u Upstream) String() string {
	if u.ResolvConf != "" {
		return u.ResolvConf
	}
	if u.TLS && u.ServerName != "" {
		return "tls://" + u.Addr.String() + "%" + u.ServerName
	}
	if u.TLS {
		return "tls://" + u.Addr.String()
	}
	return u.Addr.String()
}

// Timeouts is the `timeouts` directive: the server's TCP read, write and
// idle timeouts (0: not given).
type Timeouts struct {
	Read, Write, Idle time.Duration
	// MaxTCPQueries is maxtcpqueries: a TCP connection is closed after
	// this many queries (-1: unlimited; 0: not given).
	MaxTCPQueries int
}

// Health is the `health` directive.
type Health struct {
	Addr     string
	LameDuck time.Duration
}

// Options control Load.
type Options struct {
	// DefaultPort is the port of a key without one (-dns.port, 53).
	DefaultPort int
	// Interface gives the addresses of the host interface name (IPv6
	// link-local ones with the interface as their zone), and whether there
	// is one: bind takes interface names. Nil: no interface exists (every
	// bind argument must be an address).
	Interface func(name string) ([]netip.Addr, bool)
}

// bindSpec is one bind directive as written.
type bindSpec struct {
	pos          Pos
	args, except []string
}

// resolveBinds fills s.Bind from its bind directives as CoreDNS's bind
// does: each argument is an address, or an interface name standing for
// every address of the interface (the stock node-cache, CoreDNS 1.13.2,
// binds its IPv6 link-local ones too, with the interface as their zone);
// except takes addresses out of its own directive only; the directives add
// up. CoreDNS starts a block whose except leaves nothing, listening
// nowhere; we refuse it.
func resolveBinds(s *Server, o Options) error {
	list := func(b bindSpec, args []string) ([]netip.Addr, error) {
		var out []netip.Addr
		for _, a := range args {
			if ip, err := netip.ParseAddr(a); err == nil {
				out = append(out, ip.Unmap())
				continue
			}
			var addrs []netip.Addr
			ok := false
			if o.Interface != nil {
				addrs, ok = o.Interface(a)
			}
			if !ok {
				return nil, errAt(b.pos, "bind: %q is not an IP address or the name of an interface of this host", a)
			}
			if s.BindIfaces == nil {
				s.BindIfaces = map[string][]netip.Addr{}
			}
			s.BindIfaces[a] = addrs
			out = append(out, addrs...)
		}
		return out, nil
	}
	for _, b := range s.binds {
		addrs, err := list(b, b.args)
		if err != nil {
			return err
		}
		except, err := list(b, b.except)
		if err != nil {
			return err
		}
		for _, ip := range addrs {
			if !slices.Contains(except, ip) && !slices.Contains(s.Bind, ip) {
				s.Bind = append(s.Bind, ip)
			}
		}
	}
	if len(s.binds) > 0 && len(s.Bind) == 0 {
		return errAt(s.binds[0].pos, "bind: %s leaves no address to listen on", bindWritten(s.binds))
	}
	return nil
}

// bindWritten renders bind directives as written, for errors.
func bindWritten(bs []bindSpec) string {
	var parts []string
	for _, b := range bs {
		p := strings.Join(b.args, " ")
		if len(b.except) > 0 {
			p += " except " + strings.Join(b.except, " ")
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// Load parses the Corefile at path and types it. Every error names the
// file and line.
func Load(path string, env Env, o Options) ([]*Server, error) {
	bs, err := ParseFile(path, env)
	if err != nil {
		return nil, err
	}
	return Build(path, bs, o)
}

// Build types parsed blocks.
func Build(path string, bs []*Block, o Options) ([]*Server, error) {
	if o.DefaultPort == 0 {
		o.DefaultPort = 53
	}
	if len(bs) == 0 {
		return nil, fmt.Errorf("%s: %w", path, ErrNoBlocks)
	}
	var out []*Server
	seen := map[string]Pos{}
	// bound is a zone and port's first block that binds it: a block
	// without bind on them overlaps it (looked up, not searched: 5,000
	// blocks were 12.5 million key formats).
	bound := map[string]Pos{}
	for _, b := range bs {
		whole, err := buildServer(b, o)
		if err != nil {
			return nil, err
		}
		if err := resolveBinds(whole, o); err != nil {
			return nil, err
		}
		for _, s := range splitPorts(whole, o.DefaultPort) {
			if err := claimZones(s, seen, bound); err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	if err := checkDistinct(out); err != nil {
		return nil, err
	}
	return out, nil
}

// claimZones records s's zones on its port and binds in seen (and bound),
// refusing what CoreDNS refuses: the same zone and port in two blocks
// unless their binds differ, and overlapping binds likewise.
func claimZones(s *Server, seen, bound map[string]Pos) error {
	for _, z := range s.Zones {
		binds := []string{"*"}
		if len(s.Bind) > 0 {
			binds = binds[:0]
			for _, a := range s.Bind {
				binds = append(binds, a.String())
			}
		}
		zp := fmt.Sprintf("%s|%d", z, s.Port)
		for _, a := range binds {
			k := zp + "|" + a
			if p, ok := seen[k]; ok {
				return errAt(s.Pos, "zone %s port %d on %s is already served by the block at %s", z, s.Port, a, p)
			}
			// CoreDNS 1.15 (core/dnsserver/address.go) also refuses a
			// zone both without bind and with one on the same port:
			// "zone overlap listener capacity".
			if a == "*" {
				if p, ok := bound[zp]; ok {
					return errAt(s.Pos, "zone %s port %d without bind overlaps the block at %s, which binds it (CoreDNS refuses it too: a query to that address would reach one of them only)", z, s.Port, p)
				}
			} else {
				if p, ok := seen[zp+"|*"]; ok {
					return errAt(s.Pos, "zone %s port %d on %s overlaps the block at %s, which has no bind (CoreDNS refuses it too: a query to that address would reach one of them only)", z, s.Port, a, p)
				}
				if _, ok := bound[zp]; !ok {
					bound[zp] = s.Pos
				}
			}
			seen[k] = s.Pos
		}
	}
	return nil
}

// splitPorts makes a block whose keys name several ports one Server per
// port, in the order of their first keys, each with the keys and zones on
// that port and the block's directives: CoreDNS listens on every port its
// keys name and serves each key's zone on the key's own port only
// (`example.com example.io:1053` is example.com on the default port and
// example.io on 1053, as the stock node-cache prints at start).
func splitPorts(s *Server, defPort int) []*Server {
	var ports []int
	byPort := map[int]*Server{}
	for _, k := range s.Keys {
		zones, port, _ := parseKey(k, defPort) // checked by buildServer
		t := byPort[port]
		if t == nil {
			c := *s
			c.Port, c.Keys, c.Zones = port, nil, nil
			t = &c
			byPort[port] = t
			ports = append(ports, port)
		}
		t.Keys = append(t.Keys, k)
		for _, zone := range zones {
			if !slices.Contains(t.Zones, zone) {
				t.Zones = append(t.Zones, zone)
			}
		}
	}
	if len(ports) == 1 {
		return []*Server{s}
	}
	out := make([]*Server, len(ports))
	for i, p := range ports {
		out[i] = byPort[p]
	}
	return out
}

func buildServer(b *Block, o Options) (*Server, error) {
	s := &Server{Pos: b.Pos, Port: -1}
	for _, k := range b.Keys {
		zones, port, err := parseKey(k.Text, o.DefaultPort)
		if err != nil {
			return nil, errAt(k.Pos, "server block key %q: %v", k.Text, err)
		}
		if s.Port < 0 {
			s.Port = port // the first key's; splitPorts gives each port its block
		}
		s.Keys = append(s.Keys, k.Text)
		for _, zone := range zones {
			if !slices.Contains(s.Zones, zone) {
				s.Zones = append(s.Zones, zone)
			}
		}
	}
	seen := map[string]Pos{}
	for _, d := range b.Directives {
		noop, repeatable := false, false
		spec, own := directiveTable[d.Name]
		reg, isReg := registered(d.Name)
		switch {
		case own:
			noop, repeatable = spec.noop, spec.repeatable
		case isReg:
			repeatable = reg.Repeatable
		default:
			return nil, unknownDirective(d)
		}
		if p, ok := seen[d.Name]; ok && !repeatable {
			return nil, errAt(d.Pos, "%s: given twice in this block (first at line %d)", d.Name, p.Line)
		}
		seen[d.Name] = d.Pos
		if own {
			if err := spec.setup(s, d); err != nil {
				return nil, err
			}
		} else {
			if s.Directives == nil {
				s.Directives = map[string]any{}
			}
			cfg, err := reg.Parse(s, d, s.Directives[d.Name])
			if err != nil {
				return nil, err
			}
			s.Directives[d.Name] = cfg
		}
		s.Plugins = append(s.Plugins, Plugin{Name: d.Name, Pos: d.Pos, Args: d.ArgStrings(), NoOp: noop, Text: d.Text()})
	}
	slices.SortStableFunc(s.Plugins, func(a, b Plugin) int { return order(a.Name) - order(b.Name) })
	if err := checkDirectives(s, seen); err != nil {
		return nil, err
	}
	return s, nil
}

// unknownDirective is the error of a directive neither read here nor
// registered.
func unknownDirective(d *Directive) error {
	if why, ok := refusedWhy[d.Name]; ok {
		return errAt(d.Pos, "directive %s is not supported by nodelocaldns: %s; supported: %s", d.Name, why, supportedList())
	}
	if slices.Contains(coreDNSOrder, d.Name) {
		return errAt(d.Pos, "directive %s is not supported by nodelocaldns; supported: %s", d.Name, supportedList())
	}
	return errAt(d.Pos, "unknown directive %s; supported: %s", d.Name, supportedList())
}

// checkDirectives runs the registered directives' checks once the whole
// block is read (Spec.Check), in plugin.cfg order. seen gives each
// directive's first line, where an error of its check is placed.
func checkDirectives(s *Server, seen map[string]Pos) error {
	done := map[string]bool{}
	for _, p := range s.Plugins {
		sp, ok := registered(p.Name)
		if !ok || sp.Check == nil || done[p.Name] {
			continue
		}
		done[p.Name] = true
		cfg, err := sp.Check(s, s.Directives[p.Name])
		if err != nil {
			if _, positioned := err.(*Error); !positioned {
				err = errAt(seen[p.Name], "%s: %v", p.Name, err)
			}
			return err
		}
		s.Directives[p.Name] = cfg
	}
	return nil
}

// parseKey splits a server block key into zones and port: `zone`,
// `zone:port`, `dns://zone[:port]`, with or without the trailing dot, and
// a network (`10.0.0.0/15`, `fd00::/30`), which is its reverse zones
// (cidrZones), as CoreDNS reads such a key; a key with a slash that is not
// a network is a name, as in CoreDNS.
func parseKey(k string, defPort int) ([]string, int, error) {
	if i := strings.Index(k, "://"); i >= 0 {
		if scheme := strings.ToLower(k[:i]); scheme != "dns" {
			return nil, 0, fmt.Errorf("transport %s:// is not supported (plain DNS only: dns:// or no scheme)", scheme)
		}
		k = k[i+3:]
	}
	port := defPort
	if i := strings.LastIndexByte(k, ':'); i >= 0 && !strings.Contains(k[i:], "/") && (strings.Count(k, ":") == 1 || strings.HasPrefix(k, "[") || strings.Contains(k, "/")) {
		p, err := strconv.Atoi(k[i+1:])
		if err != nil || p < 1 || p > 65535 {
			return nil, 0, fmt.Errorf("%q is not a port", k[i+1:])
		}
		port, k = p, strings.TrimSuffix(strings.TrimPrefix(k[:i], "["), "]")
	}
	if strings.Contains(k, "/") {
		if zs, err := cidrZones(k); err == nil {
			return zs, port, nil
		}
		// Not a network (10.0.0.0/33): a name, as CoreDNS takes it.
	}
	z, err := normalizeZone(k)
	return []string{z}, port, err
}

// cidrZones are the reverse zones of the network n, as CoreDNS makes them
// of a CIDR key: the prefix rounded up to a whole label (8 bits in
// in-addr.arpa, 4 in ip6.arpa) and one zone per network of that length
// within n (10.0.0.0/15 is 0.10.in-addr.arpa. and 1.10.in-addr.arpa.;
// 172.16.5.0/26 is 64 zones, one per address). At most 128 zones (a
// prefix one bit past a label boundary).
func cidrZones(n string) ([]string, error) {
	p, err := netip.ParsePrefix(n)
	if err != nil {
		return nil, fmt.Errorf("%q is not a network: %v", n, err)
	}
	p = p.Masked()
	step := 8
	if p.Addr().Is6() {
		step = 4
	}
	bits := (p.Bits() + step - 1) / step * step
	count := 1 << (bits - p.Bits())
	var zones []string
	a := p.Addr()
	for range count {
		b := a.AsSlice()
		var labels []string
		if step == 8 {
			for i := bits/8 - 1; i >= 0; i-- {
				labels = append(labels, strconv.Itoa(int(b[i])))
			}
			labels = append(labels, "in-addr", "arpa")
		} else {
			for i := bits/4 - 1; i >= 0; i-- {
				nib := b[i/2] >> 4
				if i%2 == 1 {
					nib = b[i/2] & 0x0f
				}
				labels = append(labels, strconv.FormatUint(uint64(nib), 16))
			}
			labels = append(labels, "ip6", "arpa")
		}
		zones = append(zones, strings.Join(labels, ".")+".")
		// The next network of length bits: add 1 at bit position bits.
		for i := (bits - 1) / 8; i >= 0; i-- {
			inc := byte(1)
			if i == (bits-1)/8 {
				inc = byte(1) << (7 - (bits-1)%8)
			}
			v := b[i] + inc
			carry := v < b[i]
			b[i] = v
			if !carry {
				break
			}
		}
		a, _ = netip.AddrFromSlice(b)
	}
	return zones, nil
}

func normalizeZone(z string) (string, error) {
	z = strings.ToLower(z)
	if z == "" || z == "." {
		return ".", nil
	}
	if !strings.HasSuffix(z, ".") {
		z += "."
	}
	if len(z) > 254 {
		return "", fmt.Errorf("%q is too long for a domain name", z)
	}
	for _, l := range strings.Split(strings.TrimSuffix(z, "."), ".") {
		if l == "" || len(l) > 63 || strings.ContainsAny(l, " \t\\\"{}()") {
			return "", fmt.Errorf("%q is not a domain name", z)
		}
	}
	return z, nil
}
