package resolve

import (
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
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
	b := zone.NewBuilder(&def)
	for _, z := range zones {
		pol := z.Policy
		if err := b.SetFirst(z.Name, &pol); err != nil { // a zone listed twice: the first
			return nil, err
		}
	}
	return b.Table().Lookup, nil
}
