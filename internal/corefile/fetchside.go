package corefile

import (
	"github.com/miekg/dns"

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
	var out []string
	for _, a := range args {
		z, err := normalizeZone(a.Text)
		if err != nil {
			return nil, badOpt(d, o, "%v", err)
		}
		out = append(out, z)
	}
	return out, nil
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
