package blocks

import (
	"context"
	"fmt"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Routes is one view's forwarding beyond its chains, when several views
// see the Corefile's blocks differently (config.View).
type Routes struct {
	Zones   []string                  // every zone of the Corefile, longest first
	Groups  map[string]*forward.Group // zones forwarded elsewhere than the shared table
	Refused map[string]bool           // zones no block of the view serves
}

// Fetch forwards qname as the view's block for it would: to the view's own
// group when the block forwards elsewhere than the shared table, REFUSED
// when no block of the view serves it (as CoreDNS answers), else through
// the shared route table (shared).
func (vr *Routes) Fetch(shared resolve.FetchFunc) resolve.FetchFunc {
	return func(ctx context.Context, qname string, query []byte) ([]byte, error) {
		for _, z := range vr.Zones {
			if z != "." && qname != z && !strings.HasSuffix(qname, "."+z) {
				continue
			}
			if vr.Refused[z] {
				return RefusedAnswer(query)
			}
			if g := vr.Groups[z]; g != nil {
				return g.Exchange(ctx, query)
			}
			break
		}
		return shared(ctx, qname, query)
	}
}

// At is what the view's routes do for the names of zone: refuse them, or
// send them to the view's own group (nil: the shared route table).
func (vr *Routes) At(zone string) (refused bool, g *forward.Group) {
	for _, z := range vr.Zones {
		if z != "." && zone != z && !strings.HasSuffix(zone, "."+z) {
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
