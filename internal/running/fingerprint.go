package running

import (
	"fmt"
	"hash/fnv"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// PolicyFingerprint identifies the policy of a question in this
// configuration, as the server serves it (after Attach): what makes an
// entry (its TTL policy and block tag, its SERVFAIL lifetime, its stale
// window). Computed once per policy. The cache handover between twins
// keeps only the entries whose fingerprint is the same in both; the tag
// (the block's) an imported entry must have comes with it.
func (d *State) PolicyFingerprint() cache.Fingerprint {
	memo := map[*resolve.Policy]uint64{}
	return func(name []byte, view uint8) (uint64, uint16) {
		p := &d.Server.Resolver(view).Block(name).Policy
		if v, ok := memo[p]; ok {
			return v, p.TTL.Tag
		}
		h := fnv.New64a()
		fmt.Fprintf(h, "%+v|%d|%d", p.TTL, p.ServFailTTL, p.StaleWindow)
		memo[p] = h.Sum64()
		return memo[p], p.TTL.Tag
	}
}
