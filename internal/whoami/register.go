package whoami

import (
	"fmt"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// The whoami directive: read from the Corefile here (corefile.Register),
// answered before the cache (answer.Register, handler.go). Its
// configuration is whether it answers the block's queries.
func init() {
	corefile.Register("whoami", corefile.Spec{
		Parse: func(_ *corefile.Server, d *corefile.Directive, _ any) (any, error) {
			if len(d.Args) > 0 {
				return nil, corefile.Bad(d, "takes no arguments, got %q", d.Args[0].Text)
			}
			if err := corefile.NoBlock(d); err != nil {
				return nil, err
			}
			return true, nil
		},
		Check:    check,
		Forms:    "whoami",
		Describe: describe,
		Notes: func(s *corefile.Server, cfg any) []string {
			if on, _ := cfg.(bool); !on {
				return []string{fmt.Sprintf("%s: whoami is never reached (forward %s answers every name of the block first, as in CoreDNS): it answers nothing", s.Pos, s.Forward.From)}
			}
			return nil
		},
	})
	answer.Register("whoami", setup)
}

// check: CoreDNS runs whoami after forward, so beside a forward that
// answers every name of the block it is never reached (it answers
// nothing: false); whoami comes after template, hosts and forward in
// plugin.cfg (and rewrite, dns64 act on what it answers): with any of
// them it would answer only what they pass on, which we refuse.
func check(s *corefile.Server, cfg any) (any, error) {
	if s.ForwardAnswersAll() {
		// Gardener's documented coredns-custom example puts whoami in
		// the blocks' overrides, beside their forward: CoreDNS never
		// reaches it.
		return false, nil
	}
	var before []string
	if s.Forward != nil {
		before = append(before, "forward")
	}
	for _, d := range []string{"template", "hosts", "rewrite", "dns64"} {
		if s.Has(d) {
			before = append(before, d)
		}
	}
	if len(before) > 0 {
		return nil, corefile.ErrorAt(s.Pos, "whoami with %s in the same block is not supported: CoreDNS runs whoami after them, for the names they pass on only; give whoami a block of its own", strings.Join(before, ", "))
	}
	return cfg, nil
}

// describe says how the block's whoami runs, for -check-config.
func describe(s *corefile.Server, cfg any) []string {
	if on, _ := cfg.(bool); !on {
		return []string{fmt.Sprintf("whoami: never reached, as in CoreDNS: it runs after forward, and forward %s answers every name of this block; no query is answered by whoami", s.Forward.From)}
	}
	note := "whoami: every query of the block answered with the client's own address and port (A or AAAA and SRV in the additional section, TTL 0), per client: never cached, coalesced or forwarded"
	if s.Cache != nil {
		note += "; CoreDNS's cache in the same block would keep one client's answer 5 s and give it to the others, ours does not"
	}
	return []string{note}
}
