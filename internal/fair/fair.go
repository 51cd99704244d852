// Package fair apportions a bounded resource among the clients that use it
// (questions in flight, clients waiting for a miss, TCP and HTTP
// connections, bytes of TCP answers), so that no client, and no number of
// clients, can take what a newcomer needs. It owns the rule and the keys a
// client is known by (keys.go); it knows nothing of what a unit is, and
// must not: its callers hold the units and give them back.
//
// A bound of Max units has two pools. The node's (an eighth: the host's
// own traffic, every loopback and node address, keyed by source port) and
// the pods' (the rest). A key never takes from the other pool. In each
// pool the rule is bounded borrowing with a newcomer's part:
//
//   - a quarter of the pool is its reserve, and half of the reserve is the
//     newcomers' part; a client's share is an eighth of the reserve;
//   - any client takes a free unit while more than the reserve stays free
//     after it (borrowing: a lone busy client uses three quarters);
//   - a client holding less than its share takes one of the reserve while
//     the newcomers' part stays free after it;
//   - a client holding nothing takes any free unit.
//
// So one client, or all heavy clients together, hold at most three
// quarters; light clients together hold at most the reserve less the
// newcomers' part, whatever their number; and a client that holds nothing
// gets in unless as many other clients as the newcomers' part has units
// each took one of it while holding nothing (docs/design.md, "A fair share
// per client", states each bound's figures with N identities).
//
// Unbound's per-address rate limits and dnsdist's per-address rules cap a
// client outright; a cap that low would starve a busy node agent that asks
// much legitimately, which borrowing lets through while nobody else needs
// the room.
//
// The prefetch key (Prefetch) is the daemon's own work: it holds at most a
// share and never takes from the reserve. The zero netip.Addr is work no
// client is known for (tests, callers outside the server): it is held to
// the pods' pool's total only.
package fair

import "net/netip"

// Verdict says whether a unit was taken, and if not why.
type Verdict uint8

const (
	// Taken: the client holds one more unit.
	Taken Verdict = iota
	// Full: every unit is held.
	Full
	// OverShare: the client holds its share or more and only the reserve
	// is free, or it holds some and only the newcomers' part is free: it
	// is left to lighter clients.
	OverShare
)

func (v Verdict) String() string {
	switch v {
	case Taken:
		return "taken"
	case Full:
		return "full"
	}
	return "over_share"
}

// pool is one part of a bound and the units its clients hold.
type pool struct {
	max, reserve, share, fresh int
	used                       int
	held                       map[netip.Addr]int32
}

func newPool(bound int) pool {
	reserve := bound / 4
	return pool{max: bound, reserve: reserve, share: max(1, reserve/8), fresh: reserve / 2, held: make(map[netip.Addr]int32)}
}

// check says what taking n units for c would give, without taking.
func (p *pool) check(c netip.Addr, n int) Verdict {
	free := p.max - p.used - n // free after
	if free < 0 {
		return Full
	}
	h := int(p.held[c])
	switch {
	case c == Prefetch:
		// The daemon's own work: a share, never the reserve.
		if h+n > p.share || free < p.reserve {
			return OverShare
		}
	case !c.IsValid(), h == 0, free >= p.reserve:
	case h < p.share && free >= p.fresh:
	default:
		return OverShare
	}
	return Taken
}

// Shares counts the units each client holds of one bound. It is not safe
// for concurrent use: its owner's lock guards it.
type Shares struct {
	pods, node pool
}

// nodePart is the node's pool's part of a bound: an eighth.
const nodePart = 8

// New returns the shares of a bound of bound units (at least 1). Bounds
// under nodePart*4 units have no node pool: the node is a client of the
// pods' pool under one key (Node).
func New(bound int) *Shares {
	bound = max(bound, 1)
	nodeMax := 0
	if bound >= nodePart*4 {
		nodeMax = bound / nodePart
	}
	return &Shares{pods: newPool(bound - nodeMax), node: newPool(nodeMax)}
}

// NewOnePool returns the shares of a bound with no node pool, for a bound
// whose clients are keyed by address alone (the HTTP listeners: the
// kubelet's probes come from the node's address, which a flood from
// loopback must not share): the node's keys, if any come, are one client
// (Node) of it.
func NewOnePool(bound int) *Shares {
	return &Shares{pods: newPool(max(bound, 1))}
}

// poolOf is the pool a key takes from, and the key it is counted under
// there.
func (s *Shares) poolOf(c netip.Addr) (*pool, netip.Addr) {
	if !IsNode(c) {
		return &s.pods, c
	}
	if s.node.max == 0 {
		return &s.pods, Node
	}
	return &s.node, c
}

// Max is the bound; Reserve the units of the pods' pool kept from clients
// at their share; Share what a pod may hold before it only borrows; Fresh
// the units of the pods' pool only a client holding nothing takes.
func (s *Shares) Max() int     { return s.pods.max + s.node.max }
func (s *Shares) Reserve() int { return s.pods.reserve }
func (s *Shares) Share() int   { return s.pods.share }
func (s *Shares) Fresh() int   { return s.pods.fresh }

// NodeMax is the node's pool (0: none, the node is one client of the
// pods').
func (s *Shares) NodeMax() int { return s.node.max }

// Used is the number of units held by all clients.
func (s *Shares) Used() int { return s.pods.used + s.node.used }

// Held is the number of units c holds.
func (s *Shares) Held(c netip.Addr) int {
	p, k := s.poolOf(c)
	return int(p.held[k])
}

// Clients is the number of clients holding a unit.
func (s *Shares) Clients() int { return len(s.pods.held) + len(s.node.held) }

// Take gives c one unit if it may have one.
func (s *Shares) Take(c netip.Addr) Verdict { return s.TakeN(c, 1) }

// TakeN gives c n units (n >= 1) if it may have them: all, or none (a
// bound counted in bytes takes a buffer's size at once), by the rule of
// the package doc in c's pool.
func (s *Shares) TakeN(c netip.Addr, n int) Verdict {
	p, k := s.poolOf(c)
	if v := p.check(k, n); v != Taken {
		return v
	}
	p.used += n
	p.held[k] += int32(n)
	return Taken
}

// Put gives back one unit of c's.
func (s *Shares) Put(c netip.Addr) { s.PutN(c, 1) }

// PutN gives back n units of c's.
func (s *Shares) PutN(c netip.Addr, n int) {
	p, c := s.poolOf(c)
	k, ok := p.held[c]
	if !ok || int(k) < n {
		panic("fair: Put of units not held")
	}
	p.used -= n
	if int(k) == n {
		delete(p.held, c)
	} else {
		p.held[c] = k - int32(n)
	}
}

// MakeRoom says whose unit may be taken back for c when Take(c) returned
// v (an idle or stuck connection closed, say, to open c's): when c holds
// its share, or holds some while only the newcomers' part is free, its
// own (anyone false), since such a client never takes another's; else the
// heaviest client's of c's pool, or when that one has none to give,
// anyone's in c's pool (anyone true). After the caller frees the unit it
// chose it calls Replace.
func (s *Shares) MakeRoom(c netip.Addr, v Verdict) (prefer netip.Addr, anyone bool) {
	p, k := s.poolOf(c)
	if v == OverShare || int(p.held[k]) >= p.share {
		return c, false
	}
	top, _ := p.heaviest()
	return top, true
}

// SamePool reports whether a and b take from the same pool, so a unit of
// one may make room for the other.
func (s *Shares) SamePool(a, b netip.Addr) bool {
	pa, _ := s.poolOf(a)
	pb, _ := s.poolOf(b)
	return pa == pb
}

// Replace gives c the unit that victim held (a unit MakeRoom chose, in c's
// pool): a client's own passes to it as it is; another's is given back
// and taken, which always succeeds since c is under its share.
func (s *Shares) Replace(victim, c netip.Addr) {
	if victim == c {
		return
	}
	s.Put(victim)
	s.Take(c)
}

// Heaviest is the client holding the most units of the pods' pool (the
// zero address when nobody holds any); a walk over the clients, for the
// rare full table.
func (s *Shares) Heaviest() (netip.Addr, int) { return s.pods.heaviest() }

func (p *pool) heaviest() (netip.Addr, int) {
	var top netip.Addr
	n := int32(0)
	for c, k := range p.held {
		if k > n || (k == n && c.Less(top)) {
			top, n = c, k
		}
	}
	return top, int(n)
}
