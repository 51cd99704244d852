package corefile

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
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

// directive describes how one Corefile directive is read. To add one, add
// an entry with its setup; it runs in coreDNSOrder's place, which
// Server.Plugins keeps. template, hosts, rewrite and dns64 are read in
// fetchside.go and run behind the cache (internal/daemon/chain.go).
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
		"bind":        {setup: setupBind, repeatable: true, forms: "bind ADDRESS|IFACE... [{ except ADDRESS|IFACE... }]"},
		"bufsize":     {setup: setupBufsize, forms: "bufsize [SIZE]"},
		"cache":       {setup: setupCache, forms: "cache [TTL] { success CAP [TTL [MINTTL]]; denial CAP [TTL [MINTTL]]; prefetch AMOUNT [DURATION [PERCENT%]]; serve_stale [DURATION] [immediate [RESPONSE_TTL [FAILURE_RECHECK]] | verify [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]]; serve_stale_policy prefer_positive; servfail DURATION; disable success|denial [ZONE...]; keepttl }"},
		"debug":       {setup: boolDirective(func(s *Server) { s.Debug = true }), noop: true, forms: "debug"},
		"dnstap":      {setup: setupDnstap, repeatable: true, forms: "dnstap SOCKET (PATH, unix://PATH, tcp://HOST:PORT, tls://HOST:PORT) [full [WRITEBUFFER_MIB [QUEUE_x10000]]] [{ identity IDENTITY; version VERSION; extra EXTRA; skipverify }]"},
		"dns64":       {setup: setupDNS64, forms: "dns64 [PREFIX] [{ prefix PREFIX; translate_all; allow_ipv4 }]"},
		"errors":      {setup: setupErrors, noop: true, forms: "errors [{ consolidate DURATION REGEXP [LEVEL]; stacktrace }]"},
		"forward":     {setup: setupForward, repeatable: true, forms: "forward FROM TO... (TO: IP[:PORT], dns://, tls://IP[%NAME], a resolv.conf) { tls [CERT KEY] [CA]; tls_servername NAME; force_tcp; prefer_udp; policy random|round_robin|sequential; max_fails N; expire DURATION; health_check DURATION [no_rec] [domain NAME]; except ZONE...; max_concurrent N; failfast_all_unhealthy_upstreams; failover RCODE...; max_connect_attempts N; next RCODE...; next_on_nodata }"},
		"hosts":       {setup: setupHosts, forms: "hosts [FILE [ZONE...]] { ADDRESS NAME...; ttl SECONDS; no_reverse; reload DURATION; fallthrough [ZONE...]; fallthrough_unsupported }"},
		"health":      {setup: setupHealth, forms: "health [ADDRESS] [{ lameduck DURATION }]"},
		"log":         {setup: setupLog, repeatable: true, forms: "log [NAME...] [FORMAT] [{ class all|success|denial|error... }]"},
		"loop":        {setup: boolDirective(func(s *Server) { s.Loop = true }), noop: true, forms: "loop"},
		"pprof":       {setup: setupPProf, forms: "pprof [ADDRESS] [{ block [RATE] }]"},
		"prometheus":  {setup: setupPrometheus, forms: "prometheus [ADDRESS]"},
		"reload":      {setup: setupReload, noop: true, forms: "reload [INTERVAL [JITTER]]"},
		"rewrite":     {setup: setupRewrite, repeatable: true, forms: "rewrite [continue|stop] name [exact|prefix|suffix|substring|regex] FROM TO [answer auto | answer name FROM TO | answer value FROM TO]..., or the same inside { }; rewrite [continue|stop] type|class FROM TO; rewrite [continue|stop] ttl [exact|prefix|suffix|substring|regex] NAME TTL|MIN-MAX; rewrite [continue|stop] rcode [exact|prefix|suffix|substring|regex] NAME FROM TO; rewrite [continue|stop] edns0 local set|replace|append CODE VALUE|{qname}|{qtype}|{client_ip} [revert], edns0 nsid|subnet set|replace|append ... [revert], edns0 local|nsid|subnet unset ...; rewrite [continue|stop] cname [exact|prefix|suffix|substring|regex] FROM TO"},
		"loadbalance": {setup: setupLoadbalance, forms: "loadbalance [round_robin] [{ prefer CIDR... }], loadbalance weighted FILE [{ reload DURATION }]"},
		"timeouts":    {setup: setupTimeouts, forms: "timeouts { read DURATION; write DURATION; idle DURATION; maxtcpqueries MAXIMUM } (1s to 24h; MAXIMUM > 0 or -1)"},
		"trace":       {setup: setupTrace, forms: "trace [zipkin|datadog] [ENDPOINT] { every AMOUNT; service NAME; client_server [BOOL]; datadog_analytics_rate RATE; zipkin_max_backlog_size SIZE; zipkin_max_batch_size SIZE; zipkin_max_batch_interval DURATION }"},
		"whoami":      {setup: boolDirective(func(s *Server) { s.Whoami = true }), forms: "whoami"},
		"metadata":    {setup: setupMetadata, forms: "metadata [ZONE...]"},
		"template":    {setup: setupTemplate, repeatable: true, forms: "template CLASS TYPE [ZONE...] { match REGEX...; answer RR...; additional RR...; authority RR...; rcode CODE; fallthrough [ZONE...] }"},
	}
}

// refusedWhy says why a directive the stock node-cache compiles in
// (`node-cache -plugins`) is refused: each would be accepted and ignored
// otherwise, which a Corefile must never be. Empty since dnstap, trace and
// metadata are read: every directive the stock compiles in is.
var refusedWhy = map[string]string{}

// Supported lists the directives we read, in CoreDNS's order.
func Supported() []string {
	var out []string
	for n := range directiveTable {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return order(out[i]) < order(out[j]) })
	return out
}

// NoOp reports whether a directive is accepted as a no-op.
func NoOp(name string) bool { return directiveTable[name].noop }

func supportedList() string { return strings.Join(Supported(), ", ") }

// bad is a directive's error: file:line, directive, problem, what we support.
func bad(d *Directive, format string, a ...any) error {
	return errAt(d.Pos, "%s: %s; supported: %s", d.Name, fmt.Sprintf(format, a...), directiveTable[d.Name].forms)
}

// badOpt is the error of option o of directive d, at o's line.
func badOpt(d, o *Directive, format string, a ...any) error {
	return errAt(o.Pos, "%s: %s; supported: %s", d.Name, fmt.Sprintf(format, a...), directiveTable[d.Name].forms)
}

func noBlock(d *Directive) error {
	if d.HasBlock && len(d.Block) > 0 {
		return badOpt(d, d.Block[0], "option %s is not supported", d.Block[0].Name)
	}
	return nil
}

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

// setupLoadbalance reads `loadbalance [round_robin | weighted FILE]
// [{ ... }]` as CoreDNS 1.15's loadbalance plugin: round_robin's block
// takes `prefer CIDR...` lines, weighted's `reload DURATION` (default
// 30 s, 0: never). The weight file is read here, so one that does not
// parse stops the start (and -check-config); one that does not open yet
// is read again every reload, as CoreDNS retries it.
func setupLoadbalance(s *Server, d *Directive) error {
	p := &loadbalance.Policy{}
	switch {
	case len(d.Args) == 0 || d.Args[0].Text == "round_robin":
		if len(d.Args) > 1 {
			return bad(d, "unknown property for %s", d.Args[0].Text)
		}
		for _, o := range d.Block {
			if o.Name != "prefer" {
				return badOpt(d, o, "unknown property '%s'", o.Name)
			}
			for _, a := range o.Args {
				_, n, err := net.ParseCIDR(a.Text)
				if err != nil {
					return badOpt(d, o, "invalid CIDR %q: %v", a.Text, err)
				}
				p.Prefer = append(p.Prefer, n)
			}
		}
	case d.Args[0].Text == "weighted":
		if len(d.Args) < 2 {
			return bad(d, "missing weight file argument")
		}
		if len(d.Args) > 2 {
			return bad(d, "unexpected argument(s)")
		}
		reload := loadbalance.DefaultWeightReload
		for _, o := range d.Block {
			if o.Name != "reload" {
				return badOpt(d, o, "unknown property '%s'", o.Name)
			}
			if len(o.Args) != 1 {
				return badOpt(d, o, "reload takes one duration")
			}
			r, err := time.ParseDuration(o.Args[0].Text)
			if err != nil || r < 0 {
				return badOpt(d, o, "invalid reload duration '%s'", o.Args[0].Text)
			}
			reload = r
		}
		w, err := loadbalance.NewWeights(d.Args[1].Text, reload)
		if w == nil {
			return bad(d, "%v", err)
		}
		p.Weights = w
	default:
		return bad(d, "unknown policy: %s", d.Args[0].Text)
	}
	s.Loadbalance = true
	if p.Weights != nil || len(p.Prefer) > 0 {
		s.Balance = p
	}
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

// setupLog reads `log` as CoreDNS's log plugin does: `log`, `log NAME`,
// `log NAME... FORMAT` (the last argument is the format when there are
// several and it holds a '{'), each name a rule of its own, with an
// optional block of `class CLASS...` lines for all of the line's rules.
func setupLog(s *Server, d *Directive) error {
	args := d.ArgStrings()
	format := dnslog.DefaultFormat
	if len(args) > 1 && strings.Contains(args[len(args)-1], "{") {
		format = dnslog.ExpandFormat(args[len(args)-1])
		args = args[:len(args)-1]
	}
	if len(args) == 0 {
		args = []string{"."}
	}
	var classes dnslog.Class
	for _, o := range d.Block {
		if o.Name != "class" {
			return badOpt(d, o, "unknown property %q", o.Name)
		}
		if o.HasBlock {
			return badOpt(d, o, "class takes no block")
		}
		if len(o.Args) == 0 {
			return badOpt(d, o, "class takes at least one of all, success, denial, error")
		}
		for _, a := range o.Args {
			c, err := dnslog.ParseClass(a.Text)
			if err != nil {
				return badOpt(d, o, "class: %v", err)
			}
			classes |= c
		}
	}
	if classes == 0 {
		classes = dnslog.All
	}
	for _, a := range args {
		s.LogRules = append(s.LogRules, dnslog.Rule{Scope: dns.Fqdn(a), Classes: classes, Format: format})
	}
	s.Log = true
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

// setupDnstap reads `dnstap SOCKET [full [WRITEBUFFER [QUEUE]]] { identity
// X; version X; extra X; skipverify }` as CoreDNS 1.13 (the stock's) and
// 1.15 read it. Where CoreDNS ignores a word (a second argument that is
// not `full`, arguments past the fourth, an unknown option, an option's
// second argument) we refuse it: nothing written is dropped silently.
// An extra with {placeholders} is refused: CoreDNS fills them from the
// request and metadata per message, we send extra as written.
func setupDnstap(s *Server, d *Directive) error {
	a := d.ArgStrings()
	if len(a) == 0 || len(a) > 4 {
		return bad(d, "takes a socket and at most three more arguments")
	}
	c := dnstap.Config{WriteBufferMiB: 1, QueueMultiple: 1, Identity: dnstap.Hostname(), Version: dnstap.DefaultVersion()}
	var err error
	if c.Network, c.Address, err = dnstap.ParseEndpoint(a[0]); err != nil {
		return bad(d, "%v", err)
	}
	if len(a) >= 2 {
		if a[1] != "full" {
			return bad(d, "the second argument is full or nothing, not %q (CoreDNS ignores it)", a[1])
		}
		c.Full = true
	}
	num := func(v string, max int, what string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > max {
			return 0, fmt.Errorf("%s %q: want 1 to %d", what, v, max)
		}
		return n, nil
	}
	if len(a) >= 3 {
		if c.WriteBufferMiB, err = num(a[2], dnstap.MaxWriteBufferMiB, "write buffer (MiB)"); err != nil {
			return bad(d, "%v", err)
		}
	}
	if len(a) >= 4 {
		if c.QueueMultiple, err = num(a[3], dnstap.MaxQueueMultiple, "queue (x10000 messages)"); err != nil {
			return bad(d, "%v", err)
		}
	}
	for _, o := range d.Block {
		switch o.Name {
		case "skipverify":
			if len(o.Args) != 0 {
				return badOpt(d, o, "skipverify takes no argument")
			}
			if c.Network != "tls" {
				return badOpt(d, o, "skipverify is for a tls:// socket (CoreDNS ignores it elsewhere)")
			}
			c.SkipVerify = true
		case "identity", "version", "extra":
			if len(o.Args) != 1 {
				return badOpt(d, o, "%s takes one argument", o.Name)
			}
			v := o.Args[0].Text
			switch o.Name {
			case "identity":
				c.Identity = v
			case "version":
				c.Version = v
			case "extra":
				if strings.ContainsAny(v, "{}") {
					return badOpt(d, o, "%v", errors.New("extra with {placeholders} is not supported (we send extra as written; no directive of ours sets metadata)"))
				}
				c.Extra = v
			}
		default:
			return badOpt(d, o, "option %s is not supported", o.Name)
		}
	}
	s.Dnstap = append(s.Dnstap, c)
	return nil
}
