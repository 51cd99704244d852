package corefile

import (
	"fmt"
	"slices"
)

// Skip is an entry of the Corefile that the stock node-cache (CoreDNS)
// skips and so do we, where refusing the whole Corefile would stop a node
// the stock starts: a hosts entry whose address does not parse or that
// names no host (CoreDNS's hosts skips such lines, as /etc/hosts parsing
// does), and a zone in a directive's zone list that is no domain name
// (CoreDNS's plugin.Host normalization drops it, so it matches nothing).
// Never silently: -check-config lists each, the daemon logs each once
// with its file and line and counts them
// (nodelocaldns_config_skipped_entries).
type Skip struct {
	Pos       Pos
	Directive string
	Entry     string // as written
	Why       string
}

func (k Skip) String() string {
	return fmt.Sprintf("%s: %s: %q skipped: %s (CoreDNS skips it too)", k.Pos, k.Directive, k.Entry, k.Why)
}

// SkipEntry records that d's entry at pos is skipped (a directive's
// package records what CoreDNS's plugin skips).
func (s *Server) SkipEntry(d *Directive, pos Pos, entry, why string) {
	s.Skipped = append(s.Skipped, Skip{Pos: pos, Directive: d.Name, Entry: entry, Why: why})
}

// Skips lists the skipped entries of servers, each once (a block whose
// keys name several ports is one server per port), in the order written.
func Skips(servers []*Server) []Skip {
	var out []Skip
	for _, s := range servers {
		for _, k := range s.Skipped {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// zoneList reads the zones of a directive's zone list (its ZONE...
// arguments, fallthrough's, except's, disable's) as CoreDNS's plugins read
// them: a zone that is no domain name is skipped, as CoreDNS's
// normalization drops it (it matches no name), and recorded. The result
// is not nil when tokens are given, even when all of them are skipped: a
// list of no zone holds no name (CoreDNS's cache with such a list caches
// nothing, its hosts answers nothing), which is not the block's zones.
func zoneList(s *Server, d *Directive, tokens []Token) []string {
	out := make([]string, 0, len(tokens))
	for _, t := range tokens {
		z, err := normalizeZone(t.Text)
		if err != nil {
			s.SkipEntry(d, t.Pos, t.Text, err.Error())
			continue
		}
		out = append(out, z)
	}
	return out
}
