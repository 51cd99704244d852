package server

import (
	"errors"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
)

// A view is the set of a Corefile's blocks seen from some listen addresses
// (config.View): its queries are answered by its own resolver, and its
// index is wire.Query.View, part of the cache key. The table is swapped
// whole (SetViews); a receive loop reads the view of its address once per
// batch, a TCP connection once per query: one pointer load.

type viewTable struct {
	res  []*resolve.Resolver // by view index; res[0] answers unknown views
	addr []uint8             // by index in Config.Addrs; nil: all view 0
}

// maxViews: the view index takes 6 bits of the cache key.
const maxViews = 64

// SetViews makes views[addrViews[i]] answer the queries arriving on
// Config.Addrs[i] (addrViews nil: views[0] answers all). The caller drops
// the cache entries of views whose meaning changed.
func (s *Server) SetViews(views []*resolve.Resolver, addrViews []uint8) error {
	if len(views) == 0 || len(views) > maxViews || (addrViews != nil && len(addrViews) != len(s.cfg.Addrs)) {
		return errors.New("server: 1 to 64 views, one view per address")
	}
	for _, r := range views {
		if r == nil {
			return errors.New("server: a view without a resolver")
		}
	}
	for _, v := range addrViews {
		if int(v) >= len(views) {
			return errors.New("server: an address names a view without a resolver")
		}
	}
	s.mu.Lock()
	var cur []*resolve.Resolver
	if t := s.views.Load(); t != nil {
		cur = t.res
	}
	keep := slices.Clone(views)
	for _, r := range s.allRes {
		switch {
		case slices.Contains(keep, r):
		case slices.Contains(cur, r): // replaced now: misses may still finish on it
			keep = append(keep, r)
		default: // replaced one SetViews ago
			addResolverStats(&s.retired, r)
		}
	}
	s.allRes = keep
	s.mu.Unlock()
	s.views.Store(&viewTable{res: slices.Clone(views), addr: slices.Clone(addrViews)})
	return nil
}

// viewFor is the view of the queries arriving on Config.Addrs[i] (i < 0:
// an adopted socket on another address: view 0).
func (s *Server) viewFor(i int) uint8 {
	t := s.views.Load()
	if t.addr == nil || i < 0 || i >= len(t.addr) {
		return 0
	}
	return t.addr[i]
}

// resolver answers view v (the first view when the table changed since v
// was read and has fewer views).
// Resolver is the resolver that answers the queries of view v.
func (s *Server) Resolver(v uint8) *resolve.Resolver { return s.resolver(v) }

func (s *Server) resolver(v uint8) *resolve.Resolver {
	t := s.views.Load()
	if int(v) < len(t.res) {
		return t.res[v]
	}
	return t.res[0]
}
