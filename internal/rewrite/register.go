package rewrite

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

func init() { directive.Register("rewrite", setup) }

// setup builds a block's rewrite handler from its rules ([]*Rule): one
// handler holds them all, in the order written.
func setup(env directive.Env, cfg any) (directive.Handler, error) {
	rules, ok := cfg.([]*Rule)
	if !ok {
		return nil, fmt.Errorf("rewrite: configuration %T", cfg)
	}
	h := New(rules)
	h.Asker, h.Lookup, h.Log = env.Asker, env.Lookup, env.Log
	return h, nil
}
