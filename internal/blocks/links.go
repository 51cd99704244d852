package blocks

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// A block with several forward directives runs them in the order written,
// as CoreDNS 1.15 chains them (plugin/forward: each forward's next plugin
// is the next forward). A forward whose FROM does not hold the name, or
// whose except does (but never its FROM itself), passes the query on
// untouched; one that asks and gets an answer whose rcode its next lists,
// or NOERROR without answer records with next_on_nodata, passes the query
// on too, unless it is the last forward: that one's answer is returned as
// it is, as CoreDNS hands on only to a further forward. An error (no
// upstream answered) is the fetch's error (SERVFAIL), never handed on. A
// name no forward takes fails as an excepted one does (ErrExcepted: no
// plugin after forward in a node cache's block). The first forward asks
// the block's group (first: the forward routes), the others their own.

// forwardLink is one forward of a block and how it asks.
type forwardLink struct {
	f   *corefile.Forward
	ask directive.Next
}

// forwardLinks is the end of s's chain when s has several forwards:
// first asks the block's own group, gs are the further forwards' groups.
func forwardLinks(s *corefile.Server, first directive.Next, gs []*forward.Group) directive.Next {
	links := []forwardLink{{f: s.Forward, ask: first}}
	for i, f := range s.MoreForwards {
		links = append(links, forwardLink{f: f, ask: groupAsk(gs[i])})
	}
	return func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
		if len(r.Question) != 1 {
			return nil, fmt.Errorf("chain: a query has one question")
		}
		name := strings.ToLower(r.Question[0].Name)
		for i, l := range links {
			if !takes(l.f, name) {
				continue
			}
			m, err := l.ask(ctx, r)
			if err != nil || i == len(links)-1 || !handsOn(l.f, m) {
				return m, err
			}
		}
		return nil, fmt.Errorf("%w: %s: no forward of the block takes it", ErrExcepted, r.Question[0].Name)
	}
}

// takes reports whether f forwards name (lower-case FQDN): under its
// FROM, and not under an except zone unless it is FROM itself (CoreDNS's
// match).
func takes(f *corefile.Forward, name string) bool {
	if !zone.Holds(f.From, name) {
		return false
	}
	return name == f.From || !zone.HoldsAny(f.Except, name)
}

// handsOn reports whether f passes answer m on to the next forward.
func handsOn(f *corefile.Forward, m *dns.Msg) bool {
	return slices.Contains(f.Next, m.Rcode) || f.NextOnNodata && m.Rcode == dns.RcodeSuccess && len(m.Answer) == 0
}

// groupAsk asks g with r.
func groupAsk(g *forward.Group) directive.Next {
	return func(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
		q, err := r.Pack()
		if err != nil {
			return nil, err
		}
		return unpacked(g.Exchange(ctx, q))
	}
}

// linkSig is what of s's forwards decides where its chain hands names
// and answers on (nil with one forward): a reload that changes it drops
// the block's cached answers.
func linkSig(s *corefile.Server) any {
	if len(s.MoreForwards) == 0 {
		return nil
	}
	var out []string
	for _, f := range append([]*corefile.Forward{s.Forward}, s.MoreForwards...) {
		var to []string
		for _, u := range f.To {
			to = append(to, u.String())
		}
		out = append(out, fmt.Sprintf("%s %v except %v next %v nodata %v", f.From, to, f.Except, f.Next, f.NextOnNodata))
	}
	return out
}
