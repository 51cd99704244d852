package blocks

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Routes is one view's forwarding beyond its chains, when several views
// see the Corefile's blocks differently (config.View).
type Routes struct {
	Zones   []string                  // every zone of the Corefile, longest first
	Groups  map[string]*forward.Group // zones forwarded elsewhere than the shared table
	Refused map[string]bool           // zones no block of the view serves
}

// At is what the view's routes do for the names of zone: refuse them, or
// send them to the view's own group (nil: the shared route table).
func (vr *Routes) At(zone string) (refused bool, g *forward.Group) {
	for _, z := range vr.Zones {
		if !holds(z, zone) {
			continue
		}
		return vr.Refused[z], vr.Groups[z]
	}
	return false, nil
}

// RefusedAnswer is the REFUSED response to query (its question and OPT
// echoed), what CoreDNS answers a name no block of the server serves.
func RefusedAnswer(query []byte) ([]byte, error) {
	if len(query) < wire.HeaderLen {
		return nil, fmt.Errorf("views: short query")
	}
	b := append([]byte(nil), query...)
	b[2] |= 0x80                         // QR
	b[3] = b[3]&0x70 | wire.RcodeRefused // no RA, rcode REFUSED
	return b, nil
}
