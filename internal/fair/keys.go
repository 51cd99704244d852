package fair

import (
	"net/netip"
	"slices"
	"sync/atomic"
)

// The keys of what is not a pod live in 100::/64, the discard-only prefix
// (RFC 6666): no packet comes from it, so no client's address is one.
var (
	// Node is the node's key where its traffic is not told apart by port:
	// its TCP connections, its entries in the cache, and the node's unit
	// of a bound too small for a node pool.
	Node = NodeKey(0)
	// Prefetch is the daemon's own refreshes of popular entries: a share
	// of the flights, never the reserve.
	Prefetch = netip.AddrFrom16([16]byte{0: 0x01, 11: 1})
)

// NodeKey is the key of the node's traffic from a source port: hostNetwork
// pods share the node's addresses, and a socket's port is all that tells
// one of them from another.
func NodeKey(port uint16) netip.Addr {
	return netip.AddrFrom16([16]byte{0: 0x01, 14: byte(port >> 8), 15: byte(port)})
}

// IsNode reports whether k is one of the node's keys.
func IsNode(k netip.Addr) bool {
	if !k.Is6() {
		return false
	}
	b := k.As16()
	return b[0] == 0x01 && [12]byte(b[1:13]) == [12]byte{} && b[13] == 0
}

// Owner is the client a key belongs to where ports do not matter (the
// cache's owners, popularity): the node for every node key, else the key.
func Owner(k netip.Addr) netip.Addr {
	if IsNode(k) {
		return Node
	}
	return k
}

// Clients maps a client's source address and port to its key: every
// loopback address and every address of the node's own interfaces is the
// node (NodeKey of the port: a hostNetwork pod can send from any of them,
// and so can no longer be a thousand clients), any other address is its
// own key. A nil *Clients maps every address to itself. Safe for
// concurrent use; SetNode replaces the node's addresses.
type Clients struct {
	node atomic.Pointer[[]netip.Addr] // sorted, zones removed
}

// NewClients returns a mapping with the node's addresses (loopback is the
// node in any case).
func NewClients(node []netip.Addr) *Clients {
	c := &Clients{}
	c.SetNode(node)
	return c
}

// SetNode replaces the node's addresses.
func (c *Clients) SetNode(node []netip.Addr) {
	s := make([]netip.Addr, 0, len(node))
	for _, a := range node {
		s = append(s, a.Unmap().WithZone(""))
	}
	slices.SortFunc(s, netip.Addr.Compare)
	s = slices.Compact(s)
	c.node.Store(&s)
}

// Key is the key of a client at a and port.
func (c *Clients) Key(a netip.Addr, port uint16) netip.Addr {
	if c == nil || !c.IsNode(a) {
		return a
	}
	return NodeKey(port)
}

// IsNode reports whether a is loopback or one of the node's addresses.
func (c *Clients) IsNode(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() {
		return true
	}
	s := c.node.Load()
	if s == nil {
		return false
	}
	_, found := slices.BinarySearchFunc(*s, a.WithZone(""), netip.Addr.Compare)
	return found
}
