package hosts

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

func init() { directive.Register("hosts", setup) }

// setup builds a block's hosts handler from its configuration (*Config).
func setup(env directive.Env, cfg any) (directive.Handler, error) {
	c, ok := cfg.(*Config)
	if !ok || c == nil {
		return nil, fmt.Errorf("hosts: configuration %T", cfg)
	}
	h := New(*c, env.Clock, env.Log)
	if env.Metrics != nil {
		h.Report(env.Metrics.Hosts(c.Path))
	}
	return h, nil
}
