package template

import (
	"fmt"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

func init() { directive.Register("template", setup) }

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
