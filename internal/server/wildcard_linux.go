package server

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A wildcard socket (a listen address of 0.0.0.0 or ::, the Corefile's
// bind 0.0.0.0) is one socket for every address of the host, now and
// later, as CoreDNS's: IPv6 [::]:PORT with IPV6_V6ONLY off, so it takes
// IPv4 too (`ss -lnu` shows *:53 for the stock node-cache; CoreDNS's Go
// listener opens "udp" 0.0.0.0 that way). A host without IPv6 gets an IPv4
// 0.0.0.0:PORT socket instead. Sockets bound to a specific address on the
// same port live beside it (SO_REUSEPORT on both): the kernel gives a
// datagram to the socket bound to its destination before the wildcard one.
//
// An unconnected UDP socket bound to the wildcard address sends from the
// source the route picks, which is not always the address the query was
// sent to (a query to 127.0.0.2 would be answered from 127.0.0.1, and the
// client drops it). So the wildcard socket asks for each datagram's
// destination (IPV6_RECVPKTINFO: IPv4 ones arrive as v4-mapped addresses;
// IP_PKTINFO on the IPv4 fallback), and every answer, hit or miss, is
// sent with that address as its source in a control message of its own.
// Specific sockets read and send without control messages, as before.

// pktinfoLen is the size of the control message an answer carries, and
// ctlInLen the room given to what recvmmsg returns: one in6_pktinfo (or
// in_pktinfo) message, with room to spare for one more.
const (
	pktinfoLen = 40 // CmsgSpace(SizeofInet6Pktinfo): the larger of the two
	ctlInLen   = 2 * pktinfoLen
)

// isWildcard reports whether a listens on every address.
func isWildcard(a netip.Addr) bool { return a.IsUnspecified() }

// sockKey is the key of a listen socket: the wildcard's is [::]:port
// whichever way it is written (0.0.0.0, ::) and whichever family the
// socket got, so a configured address finds its adopted socket and its
// metrics index.
func sockKey(ap netip.AddrPort) netip.AddrPort {
	if a := ap.Addr(); a.IsUnspecified() {
		return netip.AddrPortFrom(netip.IPv6Unspecified(), ap.Port())
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// sameAddr: two listen addresses are the same socket.
func sameAddr(a, b netip.Addr) bool {
	if a.IsUnspecified() || b.IsUnspecified() {
		return a.IsUnspecified() && b.IsUnspecified()
	}
	return a.Unmap() == b.Unmap()
}

// wildcardSocket opens the unspecified socket of port: dual-stack IPv6,
// or IPv4 where the host has no IPv6. It returns the descriptor and the
// address to bind.
func wildcardSocket(port uint16) (int, unix.Sockaddr, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err == nil {
		if err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err == nil {
			return fd, &unix.SockaddrInet6{Port: int(port)}, nil
		}
		unix.Close(fd)
	}
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, nil, err
	}
	return fd, &unix.SockaddrInet4{Port: int(port)}, nil
}

// setPktinfo asks the kernel for every datagram's destination address.
func setPktinfo(fd int, v6 bool) error {
	if v6 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
}

// pktDst turns the control messages recvmmsg returned for one datagram
// into the one its answer is sent with (out, pktinfoLen bytes): the same
// kind of message, the destination as the source, and the interface only
// for an IPv6 link-local address (which needs it). It returns the length
// of out's message (0 when there was none: the kernel picks the source)
// and the destination address.
func pktDst(ctl []byte, out *[pktinfoLen]byte) (uint32, netip.Addr) {
	for len(ctl) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		if h.Len < unix.SizeofCmsghdr || int(h.Len) > len(ctl) {
			return 0, netip.Addr{}
		}
		data := ctl[unix.CmsgLen(0):h.Len]
		switch {
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			a := netip.AddrFrom16([16]byte(data[:16]))
			ifindex := binary.NativeEndian.Uint32(data[16:20])
			*out = [pktinfoLen]byte{}
			oh := (*unix.Cmsghdr)(unsafe.Pointer(&out[0]))
			oh.Level, oh.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
			oh.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
			od := out[unix.CmsgLen(0):]
			copy(od[:16], data[:16])
			if a.Is6() && !a.Is4In6() && a.IsLinkLocalUnicast() {
				binary.NativeEndian.PutUint32(od[16:20], ifindex)
			}
			return uint32(unix.CmsgSpace(unix.SizeofInet6Pktinfo)), a.Unmap()
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			// struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
			var dst [4]byte
			copy(dst[:], data[8:12])
			*out = [pktinfoLen]byte{}
			oh := (*unix.Cmsghdr)(unsafe.Pointer(&out[0]))
			oh.Level, oh.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
			oh.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
			copy(out[unix.CmsgLen(0)+4:], dst[:]) // spec_dst: the source
			return uint32(unix.CmsgSpace(unix.SizeofInet4Pktinfo)), netip.AddrFrom4(dst)
		}
		ctl = ctl[min(unix.CmsgSpace(int(h.Len)-unix.CmsgLen(0)), len(ctl)):]
	}
	return 0, netip.Addr{}
}

// isV6Sockaddr reports whether a raw sockaddr is an IPv6 client's (not a
// v4-mapped one, as IPv4 clients of a dual-stack socket appear).
func isV6Sockaddr(sa []byte) bool {
	a := sockaddrAddrPort(sa).Addr()
	return a.Is6() && !a.Is4In6()
}
