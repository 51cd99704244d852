package corefile

import (
	"sort"
	"strings"
	"time"
)

// Policy is one block's cache policy for the names of one of its zones.
type Policy struct {
	Zone                  string
	Cached                bool // false: the block has no cache directive
	SuccessMax, DenialMax time.Duration
	SuccessMin, DenialMin time.Duration
	ServFail              time.Duration
	ServeStale            time.Duration
	ServeStaleVerify      bool
	// As Cache's: serve_stale's VERIFY_TIMEOUT, RESPONSE_TTL and
	// FAILURE_RECHECK, serve_stale_policy prefer_positive.
	ServeStaleVerifyTimeout time.Duration
	ServeStaleTTL           time.Duration
	ServeStaleTTLSet        bool
	ServeStaleRecheck       time.Duration
	ServeStaleRecheckSet    bool
	PreferPositive          bool
	Prefetch                int
	PrefetchPercent         int
	DisableSuccess          bool
	DisableDenial           bool
	KeepTTL                 bool
	Forward                 *Forward // the block's forward (nil without one)
}

// Policies finds the block CoreDNS would pick for a name: the longest
// matching zone. (Blocks are first chosen by the listen address a query
// arrived on; Lookup assumes the blocks of one address.)
type Policies []Policy

// NewPolicies builds the table from servers (one entry per zone; a zone in
// several blocks on different binds keeps the first).
func NewPolicies(servers []*Server) Policies {
	var out Policies
	seen := map[string]bool{}
	for _, s := range servers {
		for _, z := range s.Zones {
			if seen[z] {
				continue
			}
			seen[z] = true
			p := Policy{Zone: z, Forward: s.Forward}
			if c := s.Cache; c != nil {
				p.Cached = true
				p.SuccessMax, p.DenialMax, p.SuccessMin, p.DenialMin = c.SuccessTTL, c.DenialTTL, c.SuccessMinTTL, c.DenialMinTTL
				p.ServFail, p.ServeStale, p.ServeStaleVerify = c.ServFail, c.ServeStale, c.ServeStaleVerify
				p.ServeStaleVerifyTimeout, p.ServeStaleTTL, p.ServeStaleTTLSet = c.ServeStaleVerifyTimeout, c.ServeStaleTTL, c.ServeStaleTTLSet
				p.ServeStaleRecheck, p.ServeStaleRecheckSet, p.PreferPositive = c.ServeStaleRecheck, c.ServeStaleRecheckSet, c.PreferPositive
				p.Prefetch, p.PrefetchPercent = c.Prefetch, c.PrefetchPercent
				p.DisableSuccess, p.DisableDenial, p.KeepTTL = c.DisableSuccess, c.DisableDenial, c.KeepTTL
			}
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].Zone) > len(out[j].Zone) })
	return out
}

// Lookup returns the policy of the longest zone that is qname or an
// ancestor of it (qname a lower-case FQDN), and false when none matches.
func (ps Policies) Lookup(qname string) (Policy, bool) {
	for _, p := range ps { // longest first
		if p.Zone == "." || qname == p.Zone || strings.HasSuffix(qname, "."+p.Zone) {
			return p, true
		}
	}
	return Policy{}, false
}
