// Package fair apportions a bounded resource among the clients that use it
// (questions in flight, clients waiting for a miss, TCP and HTTP
// connections), so that one client cannot take what every other needs.
//
// The rule is bounded borrowing. Of a bound of Max units, a quarter is a
// reserve; each client has a share of Reserve/8 (at least 1). A client
// holding less than its share takes any free unit, the reserve included. A
// client at or past its share may borrow only while more than the reserve
// is free. So one client, or several heavy ones together, can hold at most
// Max-Reserve; a newcomer always finds its share at once (as long as fewer
// than eight newcomers at a time fill the reserve up to their shares), and
// the bound is never exceeded. Borrowing makes it work-conserving above the
// reserve: a lone client uses three quarters of the bound, not one share.
//
// Unbound's per-address rate limits and dnsdist's per-address rules cap a
// client outright; a cap that low would starve a busy node agent that asks
// much legitimately, which borrowing lets through while nobody else needs
// the room.
//
// The zero netip.Addr is work nobody asked for directly (prefetches,
// refreshes the daemon starts itself): it is held to the total bound only.
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
	// is free: it is left to clients under their share.
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

// Shares counts the units each client holds of one bound. It is not safe
// for concurrent use: its owner's lock guards it.
type Shares struct {
	max, reserve, share int
	used                int
	held                map[netip.Addr]int32
}

// New returns the shares of a bound of bound units (at least 1).
func New(bound int) *Shares {
	bound = max(bound, 1)
	reserve := bound / 4
	return &Shares{max: bound, reserve: reserve, share: max(1, reserve/8), held: make(map[netip.Addr]int32)}
}

// Max is the bound; Reserve the units kept for clients under their share;
// Share what each client may hold before it borrows.
func (s *Shares) Max() int     { return s.max }
func (s *Shares) Reserve() int { return s.reserve }
func (s *Shares) Share() int   { return s.share }

// Used is the number of units held by all clients.
func (s *Shares) Used() int { return s.used }

// Held is the number of units c holds.
func (s *Shares) Held(c netip.Addr) int { return int(s.held[c]) }

// Clients is the number of clients holding a unit.
func (s *Shares) Clients() int { return len(s.held) }

// Take gives c one unit if it may have one.
func (s *Shares) Take(c netip.Addr) Verdict { return s.TakeN(c, 1) }

// TakeN gives c n units (n >= 1) if it may have them: all, or none. A
// client under its share takes them while they fit in the bound; one at or
// past it only while the reserve stays free after them. A bound counted in
// bytes takes a buffer's size at once.
func (s *Shares) TakeN(c netip.Addr, n int) Verdict {
	if v := s.check(c, n); v != Taken {
		return v
	}
	s.used += n
	s.held[c] += int32(n)
	return Taken
}

// check says what TakeN would, without taking.
func (s *Shares) check(c netip.Addr, n int) Verdict {
	if s.used+n > s.max {
		return Full
	}
	if c.IsValid() && int(s.held[c]) >= s.share && s.max-s.used-n < s.reserve {
		return OverShare
	}
	return Taken
}

// Put gives back one unit of c's.
func (s *Shares) Put(c netip.Addr) { s.PutN(c, 1) }

// PutN gives back n units of c's.
func (s *Shares) PutN(c netip.Addr, n int) {
	k, ok := s.held[c]
	if !ok || int(k) < n {
		panic("fair: Put of units not held")
	}
	s.used -= n
	if int(k) == n {
		delete(s.held, c)
	} else {
		s.held[c] = k - int32(n)
	}
}

// MakeRoom says whose idle unit may be taken back for c when Take(c)
// returned v (a connection closed, say, to open c's): when c holds its share
// its own (anyone false), since a client past its share never takes
// another's; else the heaviest client's, or when that one has none idle,
// anyone's (anyone true). After the caller frees the unit it chose it calls
// Replace.
func (s *Shares) MakeRoom(c netip.Addr, v Verdict) (prefer netip.Addr, anyone bool) {
	if v == OverShare || int(s.held[c]) >= s.share {
		return c, false
	}
	top, _ := s.Heaviest()
	return top, true
}

// Replace gives c the unit that victim held (a unit MakeRoom chose): a
// client's own passes to it as it is; another's is given back and taken,
// which always succeeds since c is under its share.
func (s *Shares) Replace(victim, c netip.Addr) {
	if victim == c {
		return
	}
	s.Put(victim)
	s.Take(c)
}

// Heaviest is the client holding the most units (the zero address when
// nobody holds any); a walk over the clients, for the rare full table.
func (s *Shares) Heaviest() (netip.Addr, int) {
	var top netip.Addr
	n := int32(0)
	for c, k := range s.held {
		if k > n || (k == n && c.Less(top)) {
			top, n = c, k
		}
	}
	return top, int(n)
}
