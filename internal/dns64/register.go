package dns64

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// The dns64 directive: read from the Corefile here (corefile.Register),
// run on the fetch side of the cache (directive.Register): one answer
// serves every client of a question (config refuses a translation that
// would differ by the client's family).
func init() {
	corefile.Register("dns64", corefile.Spec{
		Parse: parse,
		Forms: "dns64 [PREFIX] [{ prefix PREFIX; translate_all; allow_ipv4 }]",
		Describe: func(s *corefile.Server, _ any) []string {
			return corefile.FetchSideLines(s, "dns64", "on the fetch side of the cache, in plugin.cfg order (internal/dns64); one answer serves every client of the question")
		},
	})
	directive.Register("dns64", setup)
}

// parse reads a block's dns64 line (CoreDNS 1.15's dns64 plugin) into a
// *Config.
func parse(_ *corefile.Server, d *corefile.Directive, _ any) (any, error) {
	c := &Config{Prefix: DefaultPrefix}
	switch len(d.Args) {
	case 0:
	case 1:
		p, err := ParsePrefix(d.Args[0].Text)
		if err != nil {
			return nil, corefile.Bad(d, "%v", err)
		}
		c.Prefix = p
		// CoreDNS reads no block after a prefix argument.
		if err := corefile.NoBlock(d); err != nil {
			return nil, err
		}
	default:
		return nil, corefile.Bad(d, "takes at most one prefix")
	}
	for _, o := range d.Block {
		a := o.ArgStrings()
		switch o.Name {
		case "prefix":
			if len(a) != 1 {
				return nil, corefile.BadOpt(d, o, "prefix takes one prefix")
			}
			p, err := ParsePrefix(a[0])
			if err != nil {
				return nil, corefile.BadOpt(d, o, "%v", err)
			}
			c.Prefix = p
		case "translate_all", "allow_ipv4":
			if len(a) != 0 {
				return nil, corefile.BadOpt(d, o, "%s takes no arguments", o.Name)
			}
			if o.Name == "translate_all" {
				c.TranslateAll = true
			} else {
				c.AllowIPv4 = true
			}
		default:
			return nil, corefile.BadOpt(d, o, "unknown property %s", o.Name)
		}
	}
	return c, nil
}

// setup builds a block's dns64 handler from its configuration (*Config).
// Without allow_ipv4 the configuration refused an IPv4 listener
// (config.checkDNS64).
func setup(env directive.Env, cfg any) (directive.Handler, error) {
	c, ok := cfg.(*Config)
	if !ok || c == nil {
		return nil, fmt.Errorf("dns64: configuration %T", cfg)
	}
	h := New(*c, env.Lookup)
	if env.Metrics != nil {
		h.Report(env.Metrics.DNS64())
	}
	return h, nil
}
