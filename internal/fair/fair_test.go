package fair

import (
	"net/netip"
	"testing"
)

func addr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }

// takeAll takes units for c until it is refused and returns how many it
// got and the verdict that stopped it.
func takeAll(s *Shares, c netip.Addr) (int, Verdict) {
	n := 0
	for {
		v := s.Take(c)
		if v != Taken {
			return n, v
		}
		n++
	}
}

func TestOneClientLeavesTheReserve(t *testing.T) {
	s := New(1024)
	if s.NodeMax() != 128 || s.Reserve() != 224 || s.Share() != 28 || s.Fresh() != 112 {
		t.Fatalf("node %d reserve %d share %d fresh %d, want 128, 224, 28 and 112", s.NodeMax(), s.Reserve(), s.Share(), s.Fresh())
	}
	hog := addr(1)
	if n, v := takeAll(s, hog); n != 896-224 || v != OverShare {
		t.Fatalf("a lone client took %d (%v), want %d (all of the pods' pool but the reserve)", n, v, 896-224)
	}
	// Four light newcomers take their whole share at once, from the
	// reserve above the newcomers' part.
	for c := 2; c < 6; c++ {
		for i := range s.Share() {
			if v := s.Take(addr(c)); v != Taken {
				t.Fatalf("newcomer %d unit %d: %v", c, i, v)
			}
		}
	}
	if v := s.Take(addr(2)); v != OverShare {
		t.Fatalf("past its share with only the reserve free: %v", v)
	}
	if s.Used() != 672+4*28 || s.Clients() != 5 {
		t.Fatalf("used %d by %d clients", s.Used(), s.Clients())
	}
	if c, n := s.Heaviest(); c != hog || n != 672 {
		t.Fatalf("heaviest %v with %d", c, n)
	}
}

// TestLightClientsCannotTakeTheNewcomersPart: issue 37's first row. Light
// clients, each under its share, hold together at most the pods' pool
// less the newcomers' part, and one unit of that part each at most (the
// first they took); a client holding nothing still gets in, one unit per
// newcomer, until as many clients as the part has units took one each
// (the worst case with N identities: docs/design.md).
func TestLightClientsCannotTakeTheNewcomersPart(t *testing.T) {
	s := New(1024)
	light := 0
	for c := 1; c <= 60; c++ { // 60 pods, each asking 17 (under its share of 28)
		for range 17 {
			if s.Take(addr(c)) == Taken {
				light++
			}
		}
	}
	if max := 896 - s.Fresh() + 60; light > max || light < 896-s.Fresh() {
		t.Fatalf("60 light clients hold %d, want %d to %d", light, 896-s.Fresh(), max)
	}
	for c := 1; c <= 60; c++ {
		if v := s.Take(addr(c)); v != OverShare {
			t.Fatalf("client %d, holding some, takes from the newcomers' part: %v", c, v)
		}
	}
	left := 896 - s.Used()
	if left < s.Fresh()-60 {
		t.Fatalf("%d units left for newcomers", left)
	}
	for i := range left {
		nc := addr(1000 + i)
		if v := s.Take(nc); v != Taken {
			t.Fatalf("newcomer %d: %v", i, v)
		}
		if v := s.Take(nc); v == Taken {
			t.Fatalf("newcomer %d took a second unit of the newcomers' part", i)
		}
	}
	if v := s.Take(addr(5000)); v != Full {
		t.Fatalf("the newcomers' part taken: %v, want full", v)
	}
	// A unit given back goes to the next newcomer.
	s.Put(addr(7))
	if v := s.Take(addr(5000)); v != Taken {
		t.Fatalf("a unit freed: %v", v)
	}
}

// TestTheNodeHasItsOwnPool: the node's keys take from the node's pool,
// shared by port with the same rule, and never from the pods'; pods never
// take from the node's.
func TestTheNodeHasItsOwnPool(t *testing.T) {
	s := New(1024)
	if n, v := takeAll(s, addr(1)); n != 672 || v != OverShare {
		t.Fatalf("a pod took %d (%v)", n, v)
	}
	for c := 2; ; c++ {
		if s.Take(addr(c)) == Full {
			break
		}
	}
	if s.Used() != 896 {
		t.Fatalf("pods hold %d, want the pods' pool, 896", s.Used())
	}
	flood := NodeKey(4000)
	if n, v := takeAll(s, flood); n != 96 || v != OverShare {
		t.Fatalf("one hostNetwork socket took %d of the node's 128 (%v), want 96", n, v)
	}
	if v := s.Take(NodeKey(5353)); v != Taken {
		t.Fatalf("another hostNetwork socket: %v", v)
	}
	if s.Held(NodeKey(5353)) != 1 || s.Held(flood) != 96 {
		t.Fatalf("held %d and %d", s.Held(NodeKey(5353)), s.Held(flood))
	}
	s.PutN(flood, 96)
	s.Put(NodeKey(5353))
	if s.Used() != 896 {
		t.Fatalf("used %d after the node gave back its units", s.Used())
	}
}

// TestPrefetchesHoldAShareNeverTheReserve: the daemon's prefetches take
// at most a share, and none of the reserve.
func TestPrefetchesHoldAShareNeverTheReserve(t *testing.T) {
	s := New(1024)
	if n, v := takeAll(s, Prefetch); n != s.Share() || v != OverShare {
		t.Fatalf("prefetches took %d (%v), want a share, %d", n, v, s.Share())
	}
	s.PutN(Prefetch, s.Share())
	for c := 1; s.Used() < 896-224; c++ {
		s.Take(addr(c))
	}
	if v := s.Take(Prefetch); v != OverShare {
		t.Fatalf("a prefetch with only the reserve free: %v", v)
	}
}

func TestUnattributedWorkIsBoundOnlyByTheTotal(t *testing.T) {
	s := New(8)
	var zero netip.Addr
	for i := range 8 {
		if v := s.Take(zero); v != Taken {
			t.Fatalf("unit %d: %v", i, v)
		}
	}
	if v := s.Take(zero); v != Full {
		t.Fatal(v)
	}
	for range 8 {
		s.Put(zero)
	}
	if s.Used() != 0 || s.Clients() != 0 {
		t.Fatalf("used %d clients %d after giving all back", s.Used(), s.Clients())
	}
}

func TestSmallBounds(t *testing.T) {
	s := New(1)
	if s.Take(addr(1)) != Taken || s.Take(addr(2)) != Full {
		t.Fatal("a bound of 1 holds one unit")
	}
	s = New(0)
	if s.Max() != 1 {
		t.Fatalf("a bound of 0 is %d", s.Max())
	}
	// Under 32 units there is no node pool: the node is one client.
	s = New(16)
	if s.NodeMax() != 0 || s.Max() != 16 {
		t.Fatalf("node %d max %d", s.NodeMax(), s.Max())
	}
	s.Take(NodeKey(1))
	s.Take(NodeKey(2))
	if s.Held(Node) != 2 || s.Held(NodeKey(9)) != 2 || s.Clients() != 1 {
		t.Fatalf("the node's ports are one client: held %d, clients %d", s.Held(Node), s.Clients())
	}
	s.Put(NodeKey(1))
	s.Put(NodeKey(2))
	if s.Used() != 0 {
		t.Fatal(s.Used())
	}
}

func TestPutOfUnheldPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	New(4).Put(addr(1))
}

// TestMakeRoom: a client at its share makes room from its own units; one
// under it from the heaviest client's of its pool, or anyone's; Replace
// keeps the counts right either way.
func TestMakeRoom(t *testing.T) {
	s := New(8) // no node pool; reserve 2, share 1, newcomers' part 1
	hog, newcomer := addr(1), addr(3)
	for s.Take(hog) == Taken {
	}
	s.Take(addr(2)) // two newcomers take the reserve
	s.Take(addr(4))
	if s.Used() != 8 {
		t.Fatalf("used %d", s.Used())
	}
	v := s.Take(hog)
	if prefer, anyone := s.MakeRoom(hog, v); prefer != hog || anyone {
		t.Fatalf("the hog makes room from %v (anyone %v), want its own", prefer, anyone)
	}
	s.Replace(hog, hog)
	if s.Held(hog) != 6 || s.Used() != 8 {
		t.Fatalf("after its own replace: hog %d used %d", s.Held(hog), s.Used())
	}
	v = s.Take(newcomer)
	if v != Full {
		t.Fatalf("newcomer: %v", v)
	}
	prefer, anyone := s.MakeRoom(newcomer, v)
	if prefer != hog || !anyone {
		t.Fatalf("the newcomer makes room from %v (anyone %v), want the heaviest", prefer, anyone)
	}
	s.Replace(hog, newcomer)
	if s.Held(hog) != 5 || s.Held(newcomer) != 1 || s.Used() != 8 {
		t.Fatalf("after replace: hog %d newcomer %d used %d", s.Held(hog), s.Held(newcomer), s.Used())
	}
	if !s.SamePool(hog, Node) || !s.SamePool(hog, newcomer) {
		t.Fatal("SamePool: one pool under 32 units")
	}
	if s = New(1024); s.SamePool(hog, Node) || !s.SamePool(NodeKey(3), Node) {
		t.Fatal("SamePool: the node's pool")
	}
}
