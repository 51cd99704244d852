package rewrite

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// rewrite acts on both sides of the cache: its rules rewrite the question
// on the fetch side (internal/directive), and its ttl and rcode rules
// every answer the block sends, hits too (internal/answer).
func init() {
	directive.Register("rewrite", setup)
	answer.Register("rewrite", setupAnswers)
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
