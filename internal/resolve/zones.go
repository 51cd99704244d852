package resolve

import (
	"fmt"
	"sort"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Zone gives the names at and under Name (an FQDN, "cluster.local.") a
// Policy.
type Zone struct {
	Name   string
	Policy Policy
}

// Zones returns a PolicyFunc that gives a name the policy of the longest
// zone it is in, and def when it is in none. Zone names are compared
// case-insensitively; "." matches every name.
func Zones(def Policy, zones ...Zone) (PolicyFunc, error) {
	type zw struct {
		name []byte
		pol  *Policy
	}
	list := make([]zw, 0, len(zones))
	for _, z := range zones {
		name, ok := wire.AppendNameWire(nil, z.Name)
		if !ok {
			return nil, fmt.Errorf("resolve: invalid zone name %q", z.Name)
		}
		pol := z.Policy
		list = append(list, zw{wire.AppendLower(nil, name), &pol})
	}
	// Longest first, so the first zone that holds a name is its closest.
	sort.SliceStable(list, func(i, j int) bool { return len(list[i].name) > len(list[j].name) })
	dp := &def
	return func(name []byte) *Policy {
		for _, z := range list {
			if wire.InZone(name, z.name) {
				return z.pol
			}
		}
		return dp
	}, nil
}
