package netsetup

import (
	"net/netip"
	"slices"
)

// Ownership is what a Setup put on the node beyond the rules and would
// remove at Teardown: the link if it created it, else the addresses it
// added to an adopted link. Two instances serving the same addresses (a
// rolling update) share the node's plumbing; the one that exits first
// leaves it in place and hands its Ownership on, so the last one removes
// everything the first one added.
type Ownership struct {
	LinkCreated bool         `json:"link_created"`
	Addrs       []netip.Addr `json:"addrs,omitempty"`
}

// Ownership returns what this Setup would remove at Teardown besides the
// rules.
func (s *Setup) Ownership() Ownership {
	s.sem <- struct{}{}
	defer s.unlock()
	o := Ownership{LinkCreated: s.linkCreated}
	for _, a := range s.cfg.Addrs {
		if s.addedAddrs[a] {
			o.Addrs = append(o.Addrs, a)
		}
	}
	return o
}

// Inherit adds o (another instance's Ownership) to what this Setup removes
// at Teardown. Addresses that are not ours are ignored.
func (s *Setup) Inherit(o Ownership) {
	s.sem <- struct{}{}
	defer s.unlock()
	if o.LinkCreated {
		s.linkCreated = true
	}
	for _, a := range o.Addrs {
		if slices.Contains(s.cfg.Addrs, a.Unmap()) {
			s.addedAddrs[a.Unmap()] = true
		}
	}
}

// Merge returns the union of two Ownerships.
func (o Ownership) Merge(p Ownership) Ownership {
	out := Ownership{LinkCreated: o.LinkCreated || p.LinkCreated}
	for _, a := range append(slices.Clone(o.Addrs), p.Addrs...) {
		if !slices.Contains(out.Addrs, a) {
			out.Addrs = append(out.Addrs, a)
		}
	}
	return out
}
