package template

import (
	"fmt"
	"strconv"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// The template directive: read from the Corefile here (corefile.Register),
// run on the fetch side of the cache (directive.Register), in plugin.cfg
// order; its answers are cached.
func init() {
	corefile.Register("template", corefile.Spec{
		Parse:      parseLine,
		Repeatable: true,
		Forms:      "template CLASS TYPE [ZONE...] { match REGEX...; answer RR...; additional RR...; authority RR...; rcode CODE; fallthrough [ZONE...] }",
		UsesClient: func(cfg any) bool { cfgs, _ := cfg.([]Config); return ConfigsUseRemote(cfgs) },
		Describe: func(s *corefile.Server, _ any) []string {
			return corefile.FetchSideLines(s, "template", "answered on the fetch side of the cache, in plugin.cfg order (internal/template); its answers are cached")
		},
	})
	directive.Register("template", setup)
}

// parseLine reads one template line (CoreDNS 1.15's template plugin) and
// appends it to the block's ([]Config).
func parseLine(s *corefile.Server, d *corefile.Directive, prev any) (any, error) {
	cfgs, _ := prev.([]Config)
	if len(d.Args) < 2 {
		return nil, corefile.Bad(d, "CLASS and TYPE are required")
	}
	var c Config
	var ok bool
	if c.Class, ok = dns.StringToClass[d.Args[0].Text]; !ok {
		return nil, corefile.Bad(d, "invalid query class %s", d.Args[0].Text)
	}
	if c.Type, ok = dns.StringToType[d.Args[1].Text]; !ok {
		return nil, corefile.Bad(d, "invalid query type %s", d.Args[1].Text)
	}
	var err error
	if c.Zones, err = corefile.ZonesOf(s, d, d, d.Args[2:]); err != nil {
		return nil, err
	}
	for _, o := range d.Block {
		if err := parseOption(s, d, o, &c); err != nil {
			return nil, err
		}
	}
	if _, err := New([]Config{c}, nil); err != nil {
		return nil, corefile.Bad(d, "%v", err)
	}
	return append(cfgs, c), nil
}

// parseOption reads one option line of a template's block into c.
func parseOption(s *corefile.Server, d, o *corefile.Directive, c *Config) error {
	args := o.ArgStrings()
	var err error
	switch o.Name {
	case "match", "answer", "additional", "authority":
		if len(args) == 0 {
			return corefile.BadOpt(d, o, "%s needs an argument", o.Name)
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
			return corefile.BadOpt(d, o, "rcode takes one code")
		}
		rc, ok := dns.StringToRcode[args[0]]
		if !ok {
			return corefile.BadOpt(d, o, "unknown rcode %s", args[0])
		}
		c.Rcode = rc
	case "ederror":
		return parseEDE(d, o, args, c)
	case "fallthrough":
		if c.Fallthrough, err = corefile.FallthroughZones(s, d, o); err != nil {
			return err
		}
	case "upstream":
		// Deprecated in CoreDNS and ignored there: CNAME targets are
		// always looked up (so they are here).
	default:
		return corefile.BadOpt(d, o, "option %s is not supported", o.Name)
	}
	return nil
}

// parseEDE reads CoreDNS 1.15's `ederror EDE_CODE [EXTRA_TEXT]`.
func parseEDE(d, o *corefile.Directive, args []string, c *Config) error {
	if len(args) != 1 && len(args) != 2 {
		return corefile.BadOpt(d, o, "ederror takes an extended error code and an optional text")
	}
	code, err := strconv.ParseUint(args[0], 10, 16)
	if err != nil {
		return corefile.BadOpt(d, o, "extended DNS error code %s is not a number from 0 to 65535", args[0])
	}
	c.EDE = &EDE{Code: uint16(code)}
	if len(args) == 2 {
		if len(args[1]) > MaxEDEText {
			return corefile.BadOpt(d, o, "extended DNS error text of %d bytes: at most %d", len(args[1]), MaxEDEText)
		}
		c.EDE.Text = args[1]
	}
	return nil
}

// setup builds a block's template handler from its template lines
// ([]Config): one handler holds them all.
func setup(env directive.Env, cfg any) (directive.Handler, error) {
	cfgs, ok := cfg.([]Config)
	if !ok {
		return nil, fmt.Errorf("template: configuration %T", cfg)
	}
	h, err := New(cfgs, env.Lookup)
	if err != nil {
		return nil, err
	}
	h.Asker = env.Asker
	if env.Metrics != nil {
		for i, tc := range cfgs {
			match, failure, rrFailure := env.Metrics.Template(tc.Zones[0], dns.ClassToString[tc.Class], dns.TypeToString[tc.Type])
			h.SetHooks(i, Hooks{Match: match, Failure: failure, RRFailure: rrFailure})
		}
	}
	return h, nil
}
