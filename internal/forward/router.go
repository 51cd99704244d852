package forward

import (
	"strings"
	"sync/atomic"
)

// Route sends the names at and below Zone to Group.
type Route struct {
	Zone  string // FQDN; lower-cased and given a trailing dot by the Router. "." is the default route.
	Group *Group
}

// Router picks the group for a name by the longest zone suffix on label boundaries. The table is
// replaced atomically by Update, so lookups take no lock and see either the old or the new table.
// The Router does not own the groups: the caller closes a group after routing away from it.
type Router struct {
	table atomic.Pointer[RouteTable]
}

// RouteTable is one version of a Router's routes: Update installs a new one, so a caller that
// holds the table a lookup used can tell later, by comparing pointers, whether the routes
// changed since (without looking the name up again).
type RouteTable struct {
	zones map[string]*Group
}

// NewRouter returns a Router with the given routes. A zone listed twice keeps its last group.
func NewRouter(routes []Route) *Router {
	r := &Router{}
	r.Update(routes)
	return r
}

// Update replaces the routing table.
func (r *Router) Update(routes []Route) {
	t := make(map[string]*Group, len(routes))
	for _, rt := range routes {
		t[canonicalZone(rt.Zone)] = rt.Group
	}
	r.table.Store(&RouteTable{zones: t})
}

// Current returns the routes in force.
func (r *Router) Current() *RouteTable { return r.table.Load() }

// Lookup returns the group of the longest zone that is qname or an ancestor of it, or nil when
// no zone matches and there is no "." route. qname must be a lower-case FQDN (the cache key's
// form). It does not allocate.
func (r *Router) Lookup(qname string) *Group { return r.table.Load().Lookup(qname) }

// Lookup is Router.Lookup in this table; a nil table has no routes.
func (rt *RouteTable) Lookup(qname string) *Group {
	if rt == nil {
		return nil // zero Router: no routes
	}
	t := rt.zones
	name := qname
	if name == "" {
		name = "."
	}
	for {
		if g, ok := t[name]; ok {
			return g
		}
		if name == "." {
			return nil
		}
		if i := nextLabel(name); i < len(name) {
			name = name[i:]
		} else {
			name = "."
		}
	}
}

// nextLabel returns the index just past the first unescaped dot of name, or len(name). An
// escaped dot (`\.`) is part of a label, not a boundary; `\DDD` escapes hold digits only.
func nextLabel(name string) int {
	for i := 0; i < len(name); i++ {
		switch name[i] {
		case '\\':
			i++
		case '.':
			return i + 1
		}
	}
	return len(name)
}

// canonicalZone lower-cases zone and makes it fully qualified.
func canonicalZone(zone string) string {
	zone = strings.ToLower(zone)
	if !strings.HasSuffix(zone, ".") {
		zone += "."
	}
	return zone
}
