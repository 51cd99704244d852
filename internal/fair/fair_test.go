package fair

import (
	"net/netip"
	"testing"
)

func addr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }

func TestOneClientLeavesTheReserve(t *testing.T) {
	s := New(1024)
	if s.Reserve() != 256 || s.Share() != 32 {
		t.Fatalf("reserve %d share %d, want 256 and 32", s.Reserve(), s.Share())
	}
	hog := addr(1)
	n := 0
	for s.Take(hog) == Taken {
		n++
	}
	if n != 1024-256 {
		t.Fatalf("a lone client took %d, want %d (all but the reserve)", n, 1024-256)
	}
	if v := s.Take(hog); v != OverShare {
		t.Fatalf("past its share with only the reserve free: %v, want over_share", v)
	}
	// Eight newcomers each get their whole share at once.
	for c := 2; c < 10; c++ {
		for i := range s.Share() {
			if v := s.Take(addr(c)); v != Taken {
				t.Fatalf("newcomer %d unit %d: %v", c, i, v)
			}
		}
	}
	if v := s.Take(addr(99)); v != Full {
		t.Fatalf("every unit held: %v, want full", v)
	}
	if s.Used() != 1024 || s.Clients() != 9 {
		t.Fatalf("used %d by %d clients", s.Used(), s.Clients())
	}
	if c, n := s.Heaviest(); c != hog || n != 768 {
		t.Fatalf("heaviest %v with %d", c, n)
	}
	s.Put(hog)
	if v := s.Take(addr(99)); v != Taken {
		t.Fatalf("a unit freed: %v", v)
	}
}

func TestHeavyClientsShareWhatIsLeft(t *testing.T) {
	s := New(100) // reserve 25, share 3
	for c := 1; c <= 3; c++ {
		for s.Take(addr(c)) == Taken {
		}
	}
	// The first takes 75 (all but the reserve); the others their shares
	// from the reserve.
	if s.Used() != 75+2*3 {
		t.Fatalf("three greedy clients hold %d, want 81", s.Used())
	}
	// The reserve is there for clients under their share.
	if v := s.Take(addr(7)); v != Taken {
		t.Fatal(v)
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
// under it from the heaviest client's, or anyone's; Replace keeps the
// counts right either way.
func TestMakeRoom(t *testing.T) {
	s := New(8) // reserve 2, share 1
	hog, newcomer := addr(1), addr(3)
	for s.Take(hog) == Taken {
	}
	s.Take(addr(2)) // two light clients take the reserve
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
}
