package dnslog

import (
	"fmt"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// The log directive: read from the Corefile here (corefile.Register), run
// on every answer the block sends (answer.Register, handler.go).
func init() {
	corefile.Register("log", corefile.Spec{
		Parse:      parse,
		Check:      check,
		Repeatable: true,
		Forms:      "log [NAME...] [FORMAT] [{ class all|success|denial|error... }]",
		Describe: func(_ *corefile.Server, cfg any) []string {
			var rs []string
			for _, r := range cfg.([]Rule) {
				rs = append(rs, r.String())
			}
			return []string{"log: CoreDNS's query log lines on stdout, for the queries this block answers: " + strings.Join(rs, "; ")}
		},
	})
	answer.Register("log", setup)
}

// parse reads one log line as CoreDNS's log plugin does: `log`, `log
// NAME`, `log NAME... FORMAT` (the last argument is the format when there
// are several and it holds a '{'), each name a rule of its own, with an
// optional block of `class CLASS...` lines for all of the line's rules;
// the rules add to the block's ([]Rule).
func parse(_ *corefile.Server, d *corefile.Directive, prev any) (any, error) {
	rules, _ := prev.([]Rule)
	args := d.ArgStrings()
	format := DefaultFormat
	if len(args) > 1 && strings.Contains(args[len(args)-1], "{") {
		format = ExpandFormat(args[len(args)-1])
		args = args[:len(args)-1]
	}
	if len(args) == 0 {
		args = []string{"."}
	}
	var classes Class
	for _, o := range d.Block {
		if o.Name != "class" {
			return nil, corefile.BadOpt(d, o, "unknown property %q", o.Name)
		}
		if o.HasBlock {
			return nil, corefile.BadOpt(d, o, "class takes no block")
		}
		if len(o.Args) == 0 {
			return nil, corefile.BadOpt(d, o, "class takes at least one of all, success, denial, error")
		}
		for _, a := range o.Args {
			c, err := ParseClass(a.Text)
			if err != nil {
				return nil, corefile.BadOpt(d, o, "class: %v", err)
			}
			classes |= c
		}
	}
	if classes == 0 {
		classes = All
	}
	for _, a := range args {
		rules = append(rules, Rule{Scope: dns.Fqdn(a), Classes: classes, Format: format})
	}
	return rules, nil
}

// check gives the rules of a block with metadata its labels (log/type,
// log/class), and refuses a format showing forward/upstream, a label the
// stock node-cache's forward sets and ours does not.
func check(s *corefile.Server, cfg any) (any, error) {
	rules := cfg.([]Rule)
	if !s.Metadata {
		return rules, nil
	}
	for i := range rules {
		if strings.Contains(rules[i].Format, "{/forward/upstream}") {
			return nil, fmt.Errorf("the metadata label forward/upstream (the upstream a forwarded query was sent to) is not provided by nodelocaldns; provided: %s", strings.Join(MetadataLabels, ", "))
		}
		rules[i].Metadata = true
	}
	return rules, nil
}
