package blocks

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Routes is one view's forwarding beyond its chains, when several views
// see the Corefile's blocks differently (config.View).
type Routes struct {
	Zones   []string                  // every zone of the Corefile, longest first
	Groups  map[string]*forward.Group // zones forwarded elsewhere than the shared table
	Refused map[string]bool           // zones no block of the view serves
	table   *zone.Table[string]       // Zones by zone, made by At
}

// At is what the view's routes do for the names of zone: refuse them, or
// send them to the view's own group (nil: the shared route table). The
// zones' table is built once, at the first call (compiling is one
// goroutine's).
func (vr *Routes) At(z string) (refused bool, g *forward.Group) {
	if vr.table == nil {
		b := zone.NewBuilder("")
		for _, x := range vr.Zones {
			_ = b.SetFirst(x, x)
		}
		vr.table = b.Table()
	}
	x := vr.table.LookupString(z)
	if x == "" {
		return false, nil
	}
	return vr.Refused[x], vr.Groups[x]
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
