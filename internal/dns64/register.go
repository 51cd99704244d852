package dns64

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

func init() { directive.Register("dns64", setup) }

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
