package corefile

import (
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/dns64"
	"github.com/nodelocaldns/nodelocaldns/internal/hosts"
	"github.com/nodelocaldns/nodelocaldns/internal/rewrite"
	"github.com/nodelocaldns/nodelocaldns/internal/template"
)

// Directives that answer behind the cache (plugin.cfg puts cache before
// them): their options are read here, their handlers built by their own
// packages.

// zonesOf returns args as lower-case FQDNs, or the block's zones when none.
func zonesOf(s *Server, d, o *Directive, args []Token) ([]string, error) {
	if len(args) == 0 {
		return append([]string(nil), s.Zones...), nil
	}
	return zoneList(s, d, args), nil
}

// fallthroughZones reads `fallthrough [ZONE...]`: "." without zones.
func fallthroughZones(s *Server, d, o *Directive) ([]string, error) {
	if len(o.Args) == 0 {
		return []string{"."}, nil
	}
	return zonesOf(s, d, o, o.Args)
}

func setupTemplate(s *Server, d *Directive) error {
	if len(d.Args) < 2 {
		return bad(d, "CLASS and TYPE are required")
	}
	var c template.Config
	var ok bool
	if c.Class, ok = dns.StringToClass[d.Args[0].Text]; !ok {
		return bad(d, "invalid query class %s", d.Args[0].Text)
	}
	if c.Type, ok = dns.StringToType[d.Args[1].Text]; !ok {
		return bad(d, "invalid query type %s", d.Args[1].Text)
	}
	var err error
	if c.Zones, err = zonesOf(s, d, d, d.Args[2:]); err != nil {
		return err
	}
	for _, o := range d.Block {
		args := o.ArgStrings()
		switch o.Name {
		case "match", "answer", "additional", "authority":
			if len(args) == 0 {
				return badOpt(d, o, "%s needs an argument", o.Name)
			}
			switch o.Name {
			case "match":
				c.Match = append(c.Match, args...)
			case "answer":
				c.Answer = append(c.Answer, args...)
			case "additional":
				c.Additional = append(c.Additional, args...)
			case "authority":
				c.Authority = append(c.Authority, args...)
			}
		case "rcode":
			if len(args) != 1 {
				return badOpt(d, o, "rcode takes one code")
			}
			rc, ok := dns.StringToRcode[args[0]]
			if !ok {
				return badOpt(d, o, "unknown rcode %s", args[0])
			}
			c.Rcode = rc
		case "ederror":
			// CoreDNS 1.15: ederror EDE_CODE [EXTRA_TEXT].
			if len(args) != 1 && len(args) != 2 {
				return badOpt(d, o, "ederror takes an extended error code and an optional text")
			}
			code, err := strconv.ParseUint(args[0], 10, 16)
			if err != nil {
				return badOpt(d, o, "extended DNS error code %s is not a number from 0 to 65535", args[0])
			}
			c.EDE = &template.EDE{Code: uint16(code)}
			if len(args) == 2 {
				if len(args[1]) > template.MaxEDEText {
					return badOpt(d, o, "extended DNS error text of %d bytes: at most %d", len(args[1]), template.MaxEDEText)
				}
				c.EDE.Text = args[1]
			}
		case "fallthrough":
			if c.Fallthrough, err = fallthroughZones(s, d, o); err != nil {
				return err
			}
		case "upstream":
			// Deprecated in CoreDNS and ignored there: CNAME targets are
			// always looked up (so they are here).
		default:
			return badOpt(d, o, "option %s is not supported", o.Name)
		}
	}
	if _, err := template.New([]template.Config{c}, nil); err != nil {
		return bad(d, "%v", err)
	}
	s.Templates = append(s.Templates, c)
	return nil
}

func setupHosts(s *Server, d *Directive) error {
	c := &hosts.Config{Path: hosts.DefaultPath, TTL: hosts.DefaultTTL, Reload: hosts.DefaultReload}
	args := d.Args
	if len(args) > 0 {
		c.Path, args = args[0].Text, args[1:]
		if st, err := os.Stat(c.Path); err != nil && !os.IsNotExist(err) {
			return bad(d, "unable to access hosts file %q: %v", c.Path, err)
		} else if err == nil && st.IsDir() {
			// CoreDNS warns and serves the inline entries (and the file,
			// should it become one): so do we, recorded.
			s.skip(d, d.Args[0].Pos, c.Path, "a directory, not a hosts file: the inline entries are served")
		}
		// A file that does not exist yet is read when it appears (CoreDNS
		// warns likewise); the daemon logs it.
	}
	var err error
	if c.Zones, err = zonesOf(s, d, d, args); err != nil {
		return err
	}
	for _, o := range d.Block {
		a := o.ArgStrings()
		switch o.Name {
		case "fallthrough":
			if c.Fallthrough, err = fallthroughZones(s, d, o); err != nil {
				return err
			}
		case "fallthrough_unsupported":
			if len(a) != 0 {
				return badOpt(d, o, "fallthrough_unsupported takes no arguments")
			}
			c.FallthroughUnsupported = true
		case "no_reverse":
			c.NoReverse = true
		case "ttl":
			n, err := strconv.Atoi(strings.Join(a, ""))
			if len(a) != 1 || err != nil || n <= 0 || n > 65535 {
				return badOpt(d, o, "ttl takes a number of seconds from 1 to 65535")
			}
			c.TTL = uint32(n)
		case "reload":
			if len(a) != 1 {
				return badOpt(d, o, "reload needs a duration (zero seconds to disable)")
			}
			t, err := time.ParseDuration(a[0])
			if err != nil || t < 0 {
				return badOpt(d, o, "invalid duration for reload %q", a[0])
			}
			c.Reload = t
		default:
			if c.Fallthrough != nil {
				return badOpt(d, o, "unknown property %s (entries come before fallthrough)", o.Name)
			}
			// An inline entry: ADDRESS NAME... CoreDNS skips a line whose
			// address does not parse or that names no host, as /etc/hosts
			// parsing does (a misspelt option too): skipped and recorded.
			line := strings.Join(append([]string{o.Name}, a...), " ")
			ip := o.Name
			if i := strings.IndexByte(ip, '%'); i >= 0 {
				ip = ip[:i]
			}
			if _, err := netip.ParseAddr(ip); err != nil {
				s.skip(d, o.Pos, line, "neither an option nor an entry ADDRESS NAME...: "+strconv.Quote(o.Name)+" is no address")
				continue
			}
			if len(a) == 0 {
				s.skip(d, o.Pos, line, "an address without a name")
				continue
			}
			c.Inline = append(c.Inline, line)
		}
	}
	if c.FallthroughUnsupported && c.Fallthrough == nil {
		return bad(d, "fallthrough_unsupported requires fallthrough")
	}
	s.Hosts = c
	return nil
}

func setupRewrite(s *Server, d *Directive) error {
	args := d.ArgStrings()
	if len(args) < 2 {
		// CoreDNS reads a block's tokens as one rule.
		for _, o := range d.Block {
			args = append(append(args, o.Name), o.ArgStrings()...)
		}
	} else if err := noBlock(d); err != nil {
		return err
	}
	r, err := rewrite.ParseRule(args)
	if err != nil {
		return bad(d, "%v", err)
	}
	s.Rewrites = append(s.Rewrites, r)
	return nil
}

func setupDNS64(s *Server, d *Directive) error {
	c := &dns64.Config{Prefix: dns64.DefaultPrefix}
	switch len(d.Args) {
	case 0:
	case 1:
		p, err := dns64.ParsePrefix(d.Args[0].Text)
		if err != nil {
			return bad(d, "%v", err)
		}
		c.Prefix = p
		// CoreDNS reads no block after a prefix argument.
		if err := noBlock(d); err != nil {
			return err
		}
	default:
		return bad(d, "takes at most one prefix")
	}
	for _, o := range d.Block {
		a := o.ArgStrings()
		switch o.Name {
		case "prefix":
			if len(a) != 1 {
				return badOpt(d, o, "prefix takes one prefix")
			}
			p, err := dns64.ParsePrefix(a[0])
			if err != nil {
				return badOpt(d, o, "%v", err)
			}
			c.Prefix = p
		case "translate_all", "allow_ipv4":
			if len(a) != 0 {
				return badOpt(d, o, "%s takes no arguments", o.Name)
			}
			if o.Name == "translate_all" {
				c.TranslateAll = true
			} else {
				c.AllowIPv4 = true
			}
		default:
			return badOpt(d, o, "unknown property %s", o.Name)
		}
	}
	s.DNS64 = c
	return nil
}
