package loadbalance

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// The loadbalance directive: read from the Corefile here
// (corefile.Register), run on every answer the block sends
// (answer.Register, handler.go).
func init() {
	corefile.Register("loadbalance", corefile.Spec{
		Parse:    parse,
		Forms:    "loadbalance [round_robin] [{ prefer CIDR... }], loadbalance weighted FILE [{ reload DURATION }]",
		Describe: describe,
		Notes: func(s *corefile.Server, cfg any) []string {
			p := cfg.(*Policy)
			if w := p.Weights; w != nil && w.Names() == 0 {
				if _, err := os.Stat(w.File); err != nil {
					return []string{fmt.Sprintf("%s: loadbalance weighted: %v; read again every %v (CoreDNS warns and retries the same way)", s.Pos, err, w.Reload)}
				}
			}
			return nil
		},
	})
	answer.Register("loadbalance", setup)
}

// parse reads `loadbalance [round_robin | weighted FILE] [{ ... }]` as
// CoreDNS 1.15's loadbalance plugin into a *Policy (round_robin: no
// Weights, no Prefer): round_robin's block takes `prefer CIDR...` lines,
// weighted's `reload DURATION` (default 30 s, 0: never). The weight file
// is read here, so one that does not parse stops the start (and
// -check-config); one that does not open yet is read again every reload,
// as CoreDNS retries it.
func parse(_ *corefile.Server, d *corefile.Directive, _ any) (any, error) {
	p := &Policy{}
	switch {
	case len(d.Args) == 0 || d.Args[0].Text == "round_robin":
		if len(d.Args) > 1 {
			return nil, corefile.Bad(d, "unknown property for %s", d.Args[0].Text)
		}
		for _, o := range d.Block {
			if o.Name != "prefer" {
				return nil, corefile.BadOpt(d, o, "unknown property '%s'", o.Name)
			}
			for _, a := range o.Args {
				_, n, err := net.ParseCIDR(a.Text)
				if err != nil {
					return nil, corefile.BadOpt(d, o, "invalid CIDR %q: %v", a.Text, err)
				}
				p.Prefer = append(p.Prefer, n)
			}
		}
	case d.Args[0].Text == "weighted":
		w, err := parseWeighted(d)
		if err != nil {
			return nil, err
		}
		p.Weights = w
	default:
		return nil, corefile.Bad(d, "unknown policy: %s", d.Args[0].Text)
	}
	return p, nil
}

// parseWeighted reads `loadbalance weighted FILE [{ reload DURATION }]`.
func parseWeighted(d *corefile.Directive) (*Weights, error) {
	if len(d.Args) < 2 {
		return nil, corefile.Bad(d, "missing weight file argument")
	}
	if len(d.Args) > 2 {
		return nil, corefile.Bad(d, "unexpected argument(s)")
	}
	reload := DefaultWeightReload
	for _, o := range d.Block {
		if o.Name != "reload" {
			return nil, corefile.BadOpt(d, o, "unknown property '%s'", o.Name)
		}
		if len(o.Args) != 1 {
			return nil, corefile.BadOpt(d, o, "reload takes one duration")
		}
		r, err := time.ParseDuration(o.Args[0].Text)
		if err != nil || r < 0 {
			return nil, corefile.BadOpt(d, o, "invalid reload duration '%s'", o.Args[0].Text)
		}
		reload = r
	}
	w, err := NewWeights(d.Args[1].Text, reload)
	if w == nil {
		return nil, corefile.Bad(d, "%v", err)
	}
	return w, nil
}

// describe says how the block's loadbalance runs, for -check-config.
func describe(_ *corefile.Server, cfg any) []string {
	switch p := cfg.(*Policy); {
	case p.Weights != nil:
		w := p.Weights
		return []string{fmt.Sprintf("loadbalance weighted %s: one address of each A, AAAA or SRV answer of this block drawn by weight put first (cache hits too); %d names weighed, the file read again every %v when it changed", w.File, w.Names(), w.Reload)}
	case len(p.Prefer) > 0:
		return []string{fmt.Sprintf("loadbalance: the A, AAAA and MX records of every answer of this block shuffled (round_robin), then the addresses in %v first, in that order (prefer), cache hits too", p.Prefer)}
	}
	return []string{"loadbalance: the A, AAAA and MX records of every answer of this block shuffled (round_robin), cache hits too"}
}
