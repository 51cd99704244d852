package corefile

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// coreDNSOrder is CoreDNS 1.15's plugin.cfg: the order in which a block's
// plugins handle a query, whatever the order of the Corefile's lines. A
// directive listed here that directiveTable lacks is refused as "not
// supported"; a name not listed here is "unknown" (CoreDNS refuses it too).
var coreDNSOrder = []string{
	"root", "metadata", "geoip", "cancel", "proxyproto", "quic", "grpc_server", "https", "https3",
	"timeouts", "multisocket", "reload", "nsid", "bufsize", "bind", "debug", "trace", "ready",
	"health", "pprof", "shed", "prometheus", "errors", "log", "dnstap", "local", "dns64", "siit",
	"any", "chaos", "loadbalance", "tsig", "rewrite", "autopath", "acl", "cache", "header", "dnssec",
	"tls", "minimal", "template", "transfer", "dynupdate", "hosts", "route53", "azure", "clouddns",
	"k8s_external", "kubernetes", "file", "auto", "secondary", "etcd", "loop", "forward", "grpc",
	"erratic", "whoami", "on", "sign", "view", "nomad",
}

// order is a directive's place in coreDNSOrder.
func order(name string) int {
	if i := slices.Index(coreDNSOrder, name); i >= 0 {
		return i
	}
	return len(coreDNSOrder)
}

// directive describes how one of a block's own directives is read (what
// makes the block a server: where it listens, how it caches and forwards,
// its health, metrics and timeouts). Every other directive is read by its
// own package (registry.go). A directive runs in coreDNSOrder's place,
// which Server.Plugins keeps.
type directive struct {
	setup func(*Server, *Directive) error
	// noop: accepted, its job done another way (listed in docs/migration.md).
	noop bool
	// repeatable: may appear more than once in a block (CoreDNS allows it).
	repeatable bool
	// forms is what we support, for errors.
	forms string
}

var directiveTable map[string]directive

func init() {
	directiveTable = map[string]directive{
		"bind":       {setup: setupBind, repeatable: true, forms: "bind ADDRESS|IFACE... [{ except ADDRESS|IFACE... }]"},
		"bufsize":    {setup: setupBufsize, forms: "bufsize [SIZE]"},
		"cache":      {setup: setupCache, forms: "cache [TTL] { success CAP [TTL [MINTTL]]; denial CAP [TTL [MINTTL]]; prefetch AMOUNT [DURATION [PERCENT%]]; serve_stale [DURATION] [immediate [RESPONSE_TTL [FAILURE_RECHECK]] | verify [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]]; serve_stale_policy prefer_positive; servfail DURATION; disable success|denial [ZONE...]; keepttl }"},
		"debug":      {setup: boolDirective(func(s *Server) { s.Debug = true }), noop: true, forms: "debug"},
		"errors":     {setup: setupErrors, noop: true, forms: "errors [{ consolidate DURATION REGEXP [LEVEL]; stacktrace }]"},
		"forward":    {setup: setupForward, repeatable: true, forms: "forward FROM TO... (TO: IP[:PORT], dns://, tls://IP[%NAME], a resolv.conf) { tls [CERT KEY] [CA]; tls_servername NAME; force_tcp; prefer_udp; policy random|round_robin|sequential; max_fails N; expire DURATION; health_check DURATION [no_rec] [domain NAME]; except ZONE...; max_concurrent N; failfast_all_unhealthy_upstreams; failover RCODE...; max_connect_attempts N; next RCODE...; next_on_nodata }"},
		"health":     {setup: setupHealth, forms: "health [ADDRESS] [{ lameduck DURATION }]"},
		"loop":       {setup: boolDirective(func(s *Server) { s.Loop = true }), noop: true, forms: "loop"},
		"pprof":      {setup: setupPProf, forms: "pprof [ADDRESS] [{ block [RATE] }]"},
		"prometheus": {setup: setupPrometheus, forms: "prometheus [ADDRESS]"},
		"reload":     {setup: setupReload, noop: true, forms: "reload [INTERVAL [JITTER]]"},
		"timeouts":   {setup: setupTimeouts, forms: "timeouts { read DURATION; write DURATION; idle DURATION; maxtcpqueries MAXIMUM } (1s to 24h; MAXIMUM > 0 or -1)"},
		"metadata":   {setup: setupMetadata, forms: "metadata [ZONE...]"},
	}
}

// refusedWhy says why a directive the stock node-cache compiles in
// (`node-cache -plugins`) is refused: each would be accepted and ignored
// otherwise, which a Corefile must never be. Empty since dnstap, trace and
// metadata are read: every directive the stock compiles in is.
var refusedWhy = map[string]string{}

// Supported lists the directives we read (the block's own and the
// registered ones), in CoreDNS's order.
func Supported() []string {
	var out []string
	for n := range directiveTable {
		out = append(out, n)
	}
	out = append(out, specs.Names()...)
	sort.Slice(out, func(i, j int) bool { return order(out[i]) < order(out[j]) })
	return out
}

// NoOp reports whether a directive is accepted as a no-op.
func NoOp(name string) bool { return directiveTable[name].noop }

func supportedList() string { return strings.Join(Supported(), ", ") }

// bad, badOpt and noBlock are Bad, BadOpt and NoBlock for this package's
// own directives.
func bad(d *Directive, format string, a ...any) error { return Bad(d, format, a...) }

func badOpt(d, o *Directive, format string, a ...any) error { return BadOpt(d, o, format, a...) }

func noBlock(d *Directive) error { return NoBlock(d) }

func boolDirective(set func(*Server)) func(*Server, *Directive) error {
	return func(s *Server, d *Directive) error {
		if len(d.Args) > 0 {
			return bad(d, "takes no arguments, got %q", d.Args[0].Text)
		}
		if err := noBlock(d); err != nil {
			return err
		}
		set(s)
		return nil
	}
}

func setupBind(s *Server, d *Directive) error {
	if len(d.Args) == 0 {
		return bad(d, "an address or interface name is required")
	}
	b := bindSpec{pos: d.Pos}
	for _, a := range d.Args {
		if err := checkBindArg(a.Text); err != nil {
			return bad(d, "%v", err)
		}
		b.args = append(b.args, a.Text)
	}
	for _, o := range d.Block {
		if o.Name != "except" {
			return badOpt(d, o, "option %s is not supported", o.Name)
		}
		if len(o.Args) == 0 {
			return badOpt(d, o, "except: an address or interface name is required")
		}
		for _, a := range o.Args {
			if err := checkBindArg(a.Text); err != nil {
				return badOpt(d, o, "except: %v", err)
			}
			b.except = append(b.except, a.Text)
		}
	}
	s.binds = append(s.binds, b)
	return nil
}

// checkBindArg refuses what is neither an IP address nor a possible
// interface name (Linux's: 1-15 bytes, no '/', ':' or space). Which
// interfaces exist is Build's question (Options.Interface).
func checkBindArg(a string) error {
	if ip, err := netip.ParseAddr(a); err == nil {
		if ip.Zone() != "" {
			return fmt.Errorf("%q: an address with a zone is not supported (bind the interface by name)", a)
		}
		return nil
	}
	if len(a) > 15 || strings.ContainsAny(a, "/: \t") {
		return fmt.Errorf("%q is not a valid IP address or interface name", a)
	}
	return nil
}

func setupBufsize(s *Server, d *Directive) error {
	if err := noBlock(d); err != nil {
		return err
	}
	switch len(d.Args) {
	case 0:
		s.Bufsize = 1232 // CoreDNS's default: the DNS flag day 2020 size
	case 1:
		n, err := strconv.Atoi(d.Args[0].Text)
		if err != nil || n < 512 || n > 4096 { // CoreDNS's bounds
			return bad(d, "%q is not a size between 512 and 4096", d.Args[0].Text)
		}
		s.Bufsize = n
	default:
		return bad(d, "takes one argument")
	}
	return nil
}

func setupErrors(s *Server, d *Directive) error {
	if len(d.Args) > 0 {
		return bad(d, "takes no arguments, got %q", d.Args[0].Text)
	}
	for _, o := range d.Block {
		switch o.Name {
		case "consolidate", "stacktrace":
			// Log shaping of CoreDNS's error log: ours logs each upstream
			// failure once per state change and counts the rest.
		default:
			return badOpt(d, o, "option %s is not supported", o.Name)
		}
	}
	s.Errors = true
	return nil
}

func setupReload(s *Server, d *Directive) error {
	if len(d.Args) > 2 {
		return bad(d, "takes at most two arguments")
	}
	for _, a := range d.Args {
		if _, err := time.ParseDuration(a.Text); err != nil {
			return bad(d, "%q is not a duration", a.Text)
		}
	}
	if err := noBlock(d); err != nil {
		return err
	}
	s.Reload = true
	return nil
}

// setupMetadata reads `metadata [ZONE...]`. The labels the stock
// node-cache's plugins give a query are set by log (log/type, log/class,
// whatever the zones: CoreDNS's collector makes the labels' map for every
// query of the block, the zones only choose which providers run, and none
// of the stock's plugins is one) and forward (forward/upstream, not
// provided here: a log format showing it is refused in buildServer).
func setupMetadata(s *Server, d *Directive) error {
	if err := noBlock(d); err != nil {
		return err
	}
	zoneList(s, d, d.Args) // checked, as CoreDNS's; the zones choose nothing here
	s.Metadata = true
	return nil
}

// setupTimeouts reads `timeouts` as CoreDNS 1.15's timeouts plugin does:
// a block of read, write and idle, each a duration (a bare number is
// seconds) between 1 s and 24 h, and maxtcpqueries (a positive count or
// -1, unlimited), at least one.
func setupTimeouts(s *Server, d *Directive) error {
	if len(d.Args) > 0 {
		return bad(d, "takes no arguments, got %q", d.Args[0].Text)
	}
	t := &Timeouts{}
	for _, o := range d.Block {
		if len(o.Args) != 1 || o.HasBlock {
			return badOpt(d, o, "%s takes one duration", o.Name)
		}
		v := o.Args[0].Text
		if o.Name == "maxtcpqueries" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return badOpt(d, o, "invalid value for maxtcpqueries '%s'", v)
			}
			if n == 0 || n < -1 {
				return badOpt(d, o, "maxtcpqueries provided '%d' needs to be -1 (unlimited) or a positive integer", n)
			}
			t.MaxTCPQueries = n
			continue
		}
		if _, err := strconv.Atoi(v); err == nil {
			v += "s"
		}
		dur, err := time.ParseDuration(v)
		if err != nil {
			return badOpt(d, o, "%s: %q is not a duration", o.Name, o.Args[0].Text)
		}
		if dur < time.Second || dur > 24*time.Hour {
			return badOpt(d, o, "%s: %v needs to be between 1 second and 24 hours", o.Name, dur)
		}
		switch o.Name {
		case "read":
			t.Read = dur
		case "write":
			t.Write = dur
		case "idle":
			t.Idle = dur
		default:
			return badOpt(d, o, "option %s is not supported", o.Name)
		}
	}
	if len(d.Block) == 0 {
		return bad(d, "a timeouts block with no timeouts")
	}
	s.Timeouts = t
	return nil
}

func setupAddr(d *Directive, def string) (string, error) {
	if err := noBlock(d); err != nil {
		return "", err
	}
	switch len(d.Args) {
	case 0:
		return def, nil
	case 1:
		a := d.Args[0].Text
		if _, err := splitHostPort(a); err != nil {
			return "", bad(d, "%q: %v", a, err)
		}
		return a, nil
	}
	return "", bad(d, "takes one address")
}

func setupPrometheus(s *Server, d *Directive) (err error) {
	s.Prometheus, err = setupAddr(d, DefaultPrometheus)
	return err
}

// setupPProf reads `pprof [ADDRESS] [{ block [RATE] }]` as CoreDNS's
// pprof plugin: block turns the block profile on, one event sampled per
// RATE nanoseconds blocked (default 1: every event).
func setupPProf(s *Server, d *Directive) (err error) {
	blk := d.Block
	d.Block = nil
	defer func() { d.Block = blk }()
	if s.PProf, err = setupAddr(d, DefaultPProf); err != nil {
		return err
	}
	for _, o := range blk {
		if o.Name != "block" {
			return badOpt(d, o, "unknown property '%s'", o.Name)
		}
		switch len(o.Args) {
		case 0:
			s.PProfBlock = 1
		case 1:
			n, err := strconv.Atoi(o.Args[0].Text)
			if err != nil {
				return badOpt(d, o, "property 'block' invalid integer value '%v'", o.Args[0].Text)
			}
			s.PProfBlock = n
		default:
			return badOpt(d, o, "block takes at most one rate")
		}
	}
	return nil
}

func setupHealth(s *Server, d *Directive) error {
	h := &Health{Addr: DefaultHealthAddr}
	switch len(d.Args) {
	case 0:
	case 1:
		if _, err := splitHostPort(d.Args[0].Text); err != nil {
			return bad(d, "%q: %v", d.Args[0].Text, err)
		}
		h.Addr = d.Args[0].Text
	default:
		return bad(d, "takes one address")
	}
	for _, o := range d.Block {
		if o.Name != "lameduck" {
			return badOpt(d, o, "option %s is not supported", o.Name)
		}
		if len(o.Args) != 1 {
			return badOpt(d, o, "lameduck takes one duration")
		}
		t, err := time.ParseDuration(o.Args[0].Text)
		if err != nil || t < 0 {
			return badOpt(d, o, "lameduck: %q is not a duration", o.Args[0].Text)
		}
		h.LameDuck = t
	}
	s.Health = h
	return nil
}

// splitHostPort accepts CoreDNS's listen addresses: HOST:PORT, :PORT,
// [IPv6]:PORT; it returns the port.
func splitHostPort(a string) (int, error) {
	i := strings.LastIndexByte(a, ':')
	if i < 0 {
		return 0, fmt.Errorf("not HOST:PORT or :PORT")
	}
	host := a[:i]
	p, err := strconv.Atoi(a[i+1:])
	if err != nil || p < 0 || p > 65535 {
		return 0, fmt.Errorf("bad port")
	}
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return 0, fmt.Errorf("bad IPv6 address")
		}
		if _, err := netip.ParseAddr(host[1 : len(host)-1]); err != nil {
			return 0, fmt.Errorf("bad IPv6 address")
		}
	} else if strings.Contains(host, ":") {
		return 0, fmt.Errorf("an IPv6 address needs brackets: [ADDR]:PORT")
	}
	return p, nil
}

func sprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }
