package corefile

import (
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// setupCache reads `cache` as CoreDNS 1.15's cache plugin does.
func setupCache(s *Server, d *Directive) error {
	c := &Cache{
		SuccessCap: DefaultCacheCap, DenialCap: DefaultCacheCap,
		SuccessTTL: DefaultSuccessTTL, DenialTTL: DefaultDenialTTL,
		SuccessMinTTL: DefaultMinTTL, DenialMinTTL: DefaultMinTTL,
		ServFail: DefaultServFailTTL, PrefetchDuration: defaultPrefetchDur, PrefetchPercent: defaultPrefetchPct,
	}
	args := d.Args
	if len(args) > 0 {
		if ttl, err := strconv.Atoi(args[0].Text); err == nil {
			if ttl <= 0 {
				return bad(d, "TTL %d: must be positive", ttl)
			}
			c.SuccessTTL, c.DenialTTL = time.Duration(ttl)*time.Second, time.Duration(ttl)*time.Second
			args = args[1:]
		}
	}
	if len(args) > 0 {
		c.Zones = []string{}
	}
	for _, z := range zoneList(s, d, args) {
		if !slices.Contains(c.Zones, z) {
			c.Zones = append(c.Zones, z)
		}
	}
	staleSet, policySet := false, false
	for _, o := range d.Block {
		if o.HasBlock {
			return badOpt(d, o, "%s takes no block", o.Name)
		}
		switch o.Name {
		case "serve_stale":
			if err := serveStale(c, o.ArgStrings()); err != nil {
				return badOpt(d, o, "serve_stale %v (serve_stale [DURATION] [immediate [RESPONSE_TTL [FAILURE_RECHECK]] | verify [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]])", err)
			}
			staleSet = true
		case "serve_stale_policy":
			if policySet {
				return badOpt(d, o, "serve_stale_policy can only be given once")
			}
			policySet = true
			if a := o.ArgStrings(); len(a) != 1 || !strings.EqualFold(a[0], "prefer_positive") {
				return badOpt(d, o, "serve_stale_policy takes prefer_positive")
			}
			c.PreferPositive = true
		default:
			if err := cacheOption(s, c, d, o); err != nil {
				return err
			}
		}
	}
	if policySet && !staleSet {
		return bad(d, "serve_stale_policy requires serve_stale")
	}
	s.Cache = c
	return nil
}

// cacheOption reads one line of a cache block other than serve_stale and
// serve_stale_policy into c.
func cacheOption(s *Server, c *Cache, d, o *Directive) error {
	a := o.ArgStrings()
	switch o.Name {
	case "success", "denial":
		capacity, ttl, minTTL, err := capTTL(a)
		if err != nil {
			return badOpt(d, o, "%s: %v", o.Name, err)
		}
		if o.Name == "success" {
			c.SuccessCap = capacity
			if ttl > 0 {
				c.SuccessTTL = ttl
			}
			if minTTL >= 0 {
				c.SuccessMinTTL = minTTL
			}
		} else {
			c.DenialCap = capacity
			if ttl > 0 {
				c.DenialTTL = ttl
			}
			if minTTL >= 0 {
				c.DenialMinTTL = minTTL
			}
		}
	case "prefetch":
		if len(a) == 0 || len(a) > 3 {
			return badOpt(d, o, "prefetch takes AMOUNT [DURATION [PERCENT%%]]")
		}
		n, err := strconv.Atoi(a[0])
		if err != nil || n < 0 {
			return badOpt(d, o, "prefetch: %q is not an amount", a[0])
		}
		c.Prefetch = n
		if len(a) > 1 {
			if c.PrefetchDuration, err = time.ParseDuration(a[1]); err != nil || c.PrefetchDuration < 0 {
				return badOpt(d, o, "prefetch: %q is not a duration", a[1])
			}
		}
		if len(a) > 2 {
			p, ok := strings.CutSuffix(a[2], "%")
			n, err := strconv.Atoi(p)
			if !ok || err != nil || n < 10 || n > 90 { // CoreDNS's range
				return badOpt(d, o, "prefetch: %q is not a percentage between 10%% and 90%%", a[2])
			}
			c.PrefetchPercent = n
		}
	case "servfail":
		if len(a) != 1 {
			return badOpt(d, o, "servfail takes one duration")
		}
		t, err := time.ParseDuration(a[0])
		if err != nil || t < 0 || t > maxServFailTTL {
			return badOpt(d, o, "servfail: %q is not a duration between 0 and 5m", a[0])
		}
		c.ServFail = t
	case "disable":
		// CoreDNS: disable success|denial [ZONE...]; without zones the
		// root (every name); a later line of a kind replaces the
		// earlier one.
		if len(a) == 0 {
			return badOpt(d, o, "disable takes success or denial, then zones")
		}
		var zones []string
		all := len(a) == 1
		for _, nz := range zoneList(s, d, o.Args[1:]) {
			all = all || nz == "."
			if !slices.Contains(zones, nz) {
				zones = append(zones, nz)
			}
		}
		if all {
			zones = nil
		}
		switch a[0] {
		case "success":
			c.DisableSuccess, c.DisableSuccessZones = all, zones
		case "denial":
			c.DisableDenial, c.DisableDenialZones = all, zones
		default:
			return badOpt(d, o, "cache type for disable must be \"success\" or \"denial\"")
		}
	case "keepttl":
		if len(a) != 0 {
			return badOpt(d, o, "keepttl takes no arguments")
		}
		c.KeepTTL = true
	default:
		return badOpt(d, o, "option %s is not supported", o.Name)
	}
	return nil
}

// serveStale reads serve_stale's arguments as CoreDNS 1.15 does: a line
// sets every serve-stale setting, those it does not give to their
// defaults.
func serveStale(c *Cache, a []string) error {
	if len(a) > 5 {
		return errf("takes at most 5 arguments")
	}
	c.ServeStale, c.ServeStaleVerify, c.ServeStaleVerifyTimeout = defaultServeStale, false, 0
	c.ServeStaleTTL, c.ServeStaleTTLSet, c.ServeStaleRecheck, c.ServeStaleRecheckSet = 0, false, 0, false
	if len(a) > 0 {
		t, err := time.ParseDuration(a[0])
		if err != nil || t < 0 {
			return errf("%q is not a duration", a[0])
		}
		c.ServeStale = t
	}
	if len(a) < 2 {
		return nil
	}
	switch strings.ToLower(a[1]) {
	case "verify":
		c.ServeStaleVerify = true
	case "immediate":
	default:
		return errf("%q is not verify or immediate", a[1])
	}
	rest := a[2:]
	if c.ServeStaleVerify && len(rest) > 0 {
		t, err := time.ParseDuration(rest[0])
		if err != nil || t < 0 {
			return errf("verify timeout %q is not a duration", rest[0])
		}
		c.ServeStaleVerifyTimeout = t
		rest = rest[1:]
	}
	if len(rest) > 2 {
		return errf("takes at most RESPONSE_TTL and FAILURE_RECHECK after the mode")
	}
	if len(rest) > 0 {
		t, err := time.ParseDuration(rest[0])
		switch {
		case err != nil || t < 0:
			return errf("response TTL %q is not a duration", rest[0])
		case t%time.Second != 0:
			return errf("response TTL %q must be a whole number of seconds", rest[0])
		case t/time.Second > math.MaxUint32:
			return errf("response TTL %q exceeds the DNS TTL range", rest[0])
		}
		c.ServeStaleTTL, c.ServeStaleTTLSet = t, true
	}
	if len(rest) > 1 {
		t, err := time.ParseDuration(rest[1])
		switch {
		case err != nil || t < 0:
			return errf("failure recheck %q is not a duration", rest[1])
		case t > maxStaleRecheck:
			return errf("failure recheck %q cannot exceed 5 minutes", rest[1])
		}
		c.ServeStaleRecheck, c.ServeStaleRecheckSet = t, true
	}
	return nil
}

// capTTL reads `CAP [TTL [MINTTL]]`; ttl 0 and minTTL -1 mean not given.
func capTTL(a []string) (capacity int, ttl, minTTL time.Duration, err error) {
	minTTL = -1
	if len(a) == 0 || len(a) > 3 {
		return 0, 0, 0, errf("takes CAPACITY [TTL [MINTTL]]")
	}
	if capacity, err = strconv.Atoi(a[0]); err != nil || capacity < 0 {
		return 0, 0, 0, errf("%q is not a capacity", a[0])
	}
	if len(a) > 1 {
		n, err := strconv.Atoi(a[1])
		if err != nil || n <= 0 {
			return 0, 0, 0, errf("TTL %q: must be a positive number of seconds", a[1])
		}
		ttl = time.Duration(n) * time.Second
	}
	if len(a) > 2 {
		n, err := strconv.Atoi(a[2])
		if err != nil || n < 0 {
			return 0, 0, 0, errf("min TTL %q: must be a number of seconds", a[2])
		}
		minTTL = time.Duration(n) * time.Second
	}
	return capacity, ttl, minTTL, nil
}

// setupForward reads `forward` as CoreDNS 1.15's forward plugin does.
func setupForward(s *Server, d *Directive) error {
	if len(d.Args) < 2 {
		return bad(d, "FROM and at least one TO are required")
	}
	from, err := normalizeZone(strings.TrimPrefix(d.Args[0].Text, "dns://"))
	if err != nil {
		return bad(d, "FROM %q: %v", d.Args[0].Text, err)
	}
	f := &Forward{From: from, Policy: "random", MaxFails: defaultForwardFails, Expire: defaultForwardExpire, HealthCheck: defaultHealthCheck}
	for _, t := range d.Args[1:] {
		u, err := parseUpstream(t.Text)
		if err != nil {
			return bad(d, "TO %q: %v", t.Text, err)
		}
		f.To = append(f.To, u)
	}
	if len(f.To) > maxForwardUpstreams {
		return bad(d, "more than %d upstreams", maxForwardUpstreams)
	}
	for _, o := range d.Block {
		if o.HasBlock {
			return badOpt(d, o, "%s takes no block", o.Name)
		}
		if err := forwardOption(s, f, d, o); err != nil {
			return err
		}
	}
	for _, u := range f.To {
		if u.ServerName != "" && f.TLS != nil && f.TLS.ServerName != "" {
			return bad(d, "both forward (%q) and proxy level (%q) TLS servernames are set for upstream proxy %q", f.TLS.ServerName, u.ServerName, u.Addr)
		}
	}
	// tls:// and plain targets may mix (each is asked over its own
	// transport, as CoreDNS's); a resolv.conf's nameservers beside tls://
	// targets are not built.
	if f.UsesTLS() && slices.ContainsFunc(f.To, func(u Upstream) bool { return u.ResolvConf != "" }) {
		return bad(d, "a resolv.conf beside tls:// upstreams in one forward is not supported (give its nameservers as addresses)")
	}
	if f.ForceTCP && f.PreferUDP {
		return bad(d, "force_tcp and prefer_udp exclude each other")
	}
	switch {
	case s.Forward == nil:
		s.Forward = f
	case len(s.MoreForwards)+1 >= maxForwards:
		return bad(d, "more than %d forward directives in one block", maxForwards)
	default:
		// CoreDNS runs a block's forwards in the order written, each
		// handing on what it does not take (Server.MoreForwards).
		s.MoreForwards = append(s.MoreForwards, f)
	}
	return nil
}

// forwardOption reads one line of a forward block into f.
func forwardOption(s *Server, f *Forward, d, o *Directive) error {
	a := o.ArgStrings()
	switch o.Name {
	case "tls", "tls_servername":
		return forwardTLSOption(f, d, o, a)
	case "next", "failover":
		return forwardRcodes(f, d, o, a)
	case "next_on_nodata", "failfast_all_unhealthy_upstreams", "force_tcp", "prefer_udp":
		if len(a) != 0 {
			return badOpt(d, o, "%s takes no arguments", o.Name)
		}
		switch o.Name {
		case "next_on_nodata":
			f.NextOnNodata = true
		case "failfast_all_unhealthy_upstreams":
			f.FailFast = true
		case "force_tcp":
			f.ForceTCP = true
		default:
			f.PreferUDP = true
		}
	case "health_check":
		return forwardHealthCheck(f, d, o, a)
	case "except":
		if len(a) == 0 {
			return badOpt(d, o, "except takes at least one zone")
		}
		for _, nz := range zoneList(s, d, o.Args) {
			if !slices.Contains(f.Except, nz) {
				f.Except = append(f.Except, nz)
			}
		}
	case "policy", "max_fails", "max_concurrent", "max_connect_attempts", "expire":
		if len(a) != 1 {
			return badOpt(d, o, "%s takes one argument", o.Name)
		}
		return forwardValue(f, d, o, a[0])
	default:
		return badOpt(d, o, "option %s is not supported", o.Name)
	}
	return nil
}

// forwardTLSOption reads tls (CoreDNS's pkg/tls: none, CA, CERT KEY, or
// CERT KEY CA) and tls_servername NAME.
func forwardTLSOption(f *Forward, d, o *Directive, a []string) error {
	if f.TLS == nil {
		f.TLS = &ForwardTLS{}
	}
	if o.Name == "tls_servername" {
		if len(a) != 1 {
			return badOpt(d, o, "%s takes one argument", o.Name)
		}
		f.TLS.ServerName = a[0]
		return nil
	}
	switch len(a) {
	case 0:
	case 1:
		f.TLS.CA = a[0]
	case 2:
		f.TLS.Cert, f.TLS.Key = a[0], a[1]
	case 3:
		f.TLS.Cert, f.TLS.Key, f.TLS.CA = a[0], a[1], a[2]
	default:
		return badOpt(d, o, "tls takes [CA], [CERT KEY] or [CERT KEY CA]")
	}
	return nil
}

// forwardRcodes reads next RCODE... and failover RCODE....
func forwardRcodes(f *Forward, d, o *Directive, a []string) error {
	if len(a) == 0 {
		return badOpt(d, o, "%s takes at least one rcode", o.Name)
	}
	for _, v := range a {
		rc, ok := dns.StringToRcode[strings.ToUpper(v)]
		if o.Name == "next" {
			if !ok {
				return badOpt(d, o, "next: %s is not a valid rcode", v)
			}
			f.Next = append(f.Next, rc)
			continue
		}
		switch {
		case !ok:
			return badOpt(d, o, "%s is not a valid rcode", v)
		case rc == dns.RcodeSuccess:
			return badOpt(d, o, "NoError cannot be used in failover")
		case rc > 15:
			return badOpt(d, o, "failover: %s is an extended rcode (not supported: the header's rcodes only)", v)
		}
		f.Failover |= 1 << rc
	}
	return nil
}

// forwardValue reads the options that take one value: policy, max_fails,
// max_concurrent, max_connect_attempts, expire.
func forwardValue(f *Forward, d, o *Directive, v string) error {
	switch o.Name {
	case "policy":
		if v != "random" && v != "round_robin" && v != "sequential" {
			return badOpt(d, o, "policy %q is not random, round_robin or sequential", v)
		}
		f.Policy = v
	case "max_connect_attempts":
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return badOpt(d, o, "%s: %q is not a count", o.Name, v)
		}
		f.MaxConnectAttempts, f.MaxConnectAttemptsSet = int(n), true
	case "expire":
		var err error
		if f.Expire, err = time.ParseDuration(v); err != nil || f.Expire < 0 {
			return badOpt(d, o, "expire: %q is not a duration", v)
		}
	default: // max_fails, max_concurrent
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return badOpt(d, o, "%s: %q is not a count", o.Name, v)
		}
		if o.Name == "max_fails" {
			f.MaxFails = n
		} else {
			f.MaxConcurrent = n
		}
	}
	return nil
}

// forwardHealthCheck reads CoreDNS's health_check DURATION [no_rec]
// [domain NAME], in any order after the duration. no_rec: our probe never
// asks for recursion ("NAME IN NS", RD clear), so it is what we do anyway.
func forwardHealthCheck(f *Forward, d, o *Directive, a []string) error {
	if len(a) == 0 {
		return badOpt(d, o, "health_check takes DURATION [no_rec] [domain NAME]")
	}
	var err error
	if f.HealthCheck, err = time.ParseDuration(a[0]); err != nil || f.HealthCheck < 0 {
		return badOpt(d, o, "health_check: %q is not a duration", a[0])
	}
	for i := 1; i < len(a); i++ {
		switch a[i] {
		case "no_rec":
		case "domain":
			if i+1 >= len(a) {
				return badOpt(d, o, "health_check: domain takes a name")
			}
			i++
			if _, ok := dns.IsDomainName(a[i]); !ok || len(a[i]) > 253 {
				return badOpt(d, o, "health_check: invalid domain name %s", a[i])
			}
			f.HealthDomain = strings.ToLower(dns.Fqdn(a[i]))
		default:
			return badOpt(d, o, "health_check: unknown option %s (DURATION [no_rec] [domain NAME])", a[i])
		}
	}
	return nil
}

// parseUpstream reads a forward target: IP, IP:port, [IPv6]:port, with an
// optional dns:// or tls:// scheme, or a path to a resolv.conf.
func parseUpstream(t string) (Upstream, error) {
	if strings.HasPrefix(t, "/") || strings.HasPrefix(t, ".") {
		return Upstream{ResolvConf: t}, nil
	}
	tls := false
	if i := strings.Index(t, "://"); i >= 0 {
		switch scheme := strings.ToLower(t[:i]); scheme {
		case "dns":
		case "tls":
			tls = true
		default:
			return Upstream{}, errf("transport %s:// is not supported (dns:// and tls:// only)", scheme)
		}
		t = t[i+3:]
	}
	// CoreDNS's splitZone: IP%NAME, IP%NAME:PORT, IP:PORT%NAME,
	// [IPv6%NAME]:PORT; NAME is a tls:// target's server name.
	var name string
	if i := strings.LastIndexByte(t, '%'); i >= 0 {
		host, zone := t[:i], t[i+1:]
		if strings.HasPrefix(host, "[") {
			host += "]"
		}
		if j := strings.LastIndexByte(zone, ':'); j >= 0 {
			host += zone[j:]
			zone = strings.TrimSuffix(zone[:j], "]")
		}
		if !tls {
			return Upstream{}, errf("%%%s on a plain target: CoreDNS drops it (a TLS server name for tls:// targets only; an IPv6 zone is not supported)", zone)
		}
		if _, ok := dns.IsDomainName(zone); !ok || zone == "" {
			return Upstream{}, errf("%q is not a TLS server name", zone)
		}
		t, name = host, zone
	}
	if ap, err := netip.ParseAddrPort(t); err == nil {
		if ap.Port() == 0 || ap.Addr().Zone() != "" {
			return Upstream{}, errf("not IP[:port]")
		}
		return Upstream{Addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), TLS: tls, ServerName: name}, nil
	}
	a, err := netip.ParseAddr(t)
	if err != nil || a.Zone() != "" {
		return Upstream{}, errf("not IP[:port], [IPv6]:port or a resolv.conf path")
	}
	port := uint16(53)
	if tls {
		port = 853 // DNS over TLS (RFC 7858)
	}
	return Upstream{Addr: netip.AddrPortFrom(a.Unmap(), port), TLS: tls, ServerName: name}, nil
}

type strErr string

func (e strErr) Error() string { return string(e) }

func errf(format string, a ...any) error {
	return strErr(sprintf(format, a...))
}
