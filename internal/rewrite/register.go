package rewrite

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// rewrite acts on both sides of the cache: its rules rewrite the question
// on the fetch side (internal/directive), and its ttl and rcode rules
// every answer the block sends, hits too (internal/answer).
func init() {
	corefile.Register("rewrite", corefile.Spec{
		Parse:      parse,
		Repeatable: true,
		Forms:      "rewrite [continue|stop] name [exact|prefix|suffix|substring|regex] FROM TO [answer auto | answer name FROM TO | answer value FROM TO]..., or the same inside { }; rewrite [continue|stop] type|class FROM TO; rewrite [continue|stop] ttl [exact|prefix|suffix|substring|regex] NAME TTL|MIN-MAX; rewrite [continue|stop] rcode [exact|prefix|suffix|substring|regex] NAME FROM TO; rewrite [continue|stop] edns0 local set|replace|append CODE VALUE|{qname}|{qtype}|{client_ip} [revert], edns0 nsid|subnet set|replace|append ... [revert], edns0 local|nsid|subnet unset ...; rewrite [continue|stop] cname [exact|prefix|suffix|substring|regex] FROM TO",
		UsesClient: func(cfg any) bool { rules, _ := cfg.([]*Rule); return UsesClient(rules) },
		Describe: func(s *corefile.Server, _ any) []string {
			return corefile.FetchSideLines(s, "rewrite", "on the fetch side of the cache, in plugin.cfg order (internal/rewrite); the cache keys the client's name")
		},
	})
	directive.Register("rewrite", setup)
	answer.Register("rewrite", setupAnswers)
}

// parse reads one rewrite line (CoreDNS 1.15's rewrite plugin) and appends
// its rule to the block's ([]*Rule).
func parse(_ *corefile.Server, d *corefile.Directive, prev any) (any, error) {
	rules, _ := prev.([]*Rule)
	args := d.ArgStrings()
	if len(args) < 2 {
		// CoreDNS reads a block's tokens as one rule.
		for _, o := range d.Block {
			args = append(append(args, o.Name), o.ArgStrings()...)
		}
	} else if err := corefile.NoBlock(d); err != nil {
		return nil, err
	}
	r, err := ParseRule(args)
	if err != nil {
		return nil, corefile.Bad(d, "%v", err)
	}
	return append(rules, r), nil
}

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

// setupAnswers builds the answer side of a block's rules: nil when none
// is a ttl or rcode rule.
func setupAnswers(_ answer.Env, cfg any) (answer.Handler, error) {
	rules, _ := cfg.([]*Rule)
	if r := Answers(rules); r != nil {
		return r, nil
	}
	return nil, nil
}
