package netsetup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// EnsureLink makes sure the link exists, is up and holds every address.
// Call it before the DNS listeners bind: they bind to these addresses. A
// missing link is created with type dummy; an existing one, of any type, is
// adopted. It does nothing when SetupInterface is false.
func (s *Setup) EnsureLink(ctx context.Context) error {
	if !s.cfg.SetupInterface {
		return nil
	}
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("netsetup: ensure link: %w", err)
	}
	defer s.unlock()
	if s.closed {
		return ErrClosed
	}
	return s.ensureLinkLocked()
}

func (s *Setup) ensureLinkLocked() error {
	name := s.cfg.InterfaceName
	link, err := netlink.LinkByName(name)
	created := false
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		if link, err = s.createLinkLocked(); err != nil {
			return err
		}
		created = true
	case err != nil:
		s.obs.SetupError(KindInterfaceCheck)
		return fmt.Errorf("netsetup: look up link %q: %w", name, err)
	case !s.linkCreated && !s.adopted:
		s.adopted = true
		s.log.Info("adopted existing link", "link", name, "type", link.Type())
	}
	s.linkIndex.Store(int32(link.Attrs().Index))

	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			s.obs.SetupError(KindInterfaceCheck)
			return fmt.Errorf("netsetup: set link %q up: %w", name, err)
		}
		if !created {
			s.log.Info("link was down, set it up", "link", name)
		}
	}
	return s.ensureAddrsLocked(link)
}

// createLinkLocked creates the dummy link and returns it.
func (s *Setup) createLinkLocked() (netlink.Link, error) {
	name := s.cfg.InterfaceName
	err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	switch {
	case err == nil:
	case errors.Is(err, unix.EEXIST):
		// Created by someone else since we looked: adopt it below.
	case errors.Is(err, unix.EOPNOTSUPP):
		// The kernel answers EOPNOTSUPP for a link kind it does not know
		// ("Unknown device type" in ip(8)).
		s.obs.SetupError(KindInterfaceAdd)
		return nil, fmt.Errorf("netsetup: create link %q: %w; create the link by other means or run with -setupinterface=false", name, ErrNoDummy)
	default:
		s.obs.SetupError(KindInterfaceAdd)
		return nil, fmt.Errorf("netsetup: create dummy link %q: %w", name, err)
	}
	link, lerr := netlink.LinkByName(name)
	if lerr != nil {
		s.obs.SetupError(KindInterfaceAdd)
		return nil, fmt.Errorf("netsetup: look up new link %q: %w", name, lerr)
	}
	if err == nil {
		s.linkCreated = true
		// Addresses we added to a previous link went with it.
		clear(s.addedAddrs)
		s.log.Info("created link", "link", name, "type", "dummy")
	}
	return link, nil
}

// ensureAddrsLocked adds every configured address the link lacks.
func (s *Setup) ensureAddrsLocked(link netlink.Link) error {
	name := s.cfg.InterfaceName
	have, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		// The address list changed while it was dumped; one retry.
		have, err = netlink.AddrList(link, netlink.FAMILY_ALL)
	}
	if err != nil {
		s.obs.SetupError(KindInterfaceCheck)
		return fmt.Errorf("netsetup: list addresses of %q: %w", name, err)
	}
	present := make(map[netip.Addr]bool, len(have))
	for _, a := range have {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			present[ip.Unmap()] = true
		}
	}
	var errs []error
	for _, a := range s.cfg.Addrs {
		if present[a] {
			continue
		}
		if err := netlink.AddrAdd(link, hostAddr(a)); err != nil && !errors.Is(err, unix.EEXIST) {
			s.obs.SetupError(KindInterfaceCheck)
			errs = append(errs, fmt.Errorf("netsetup: add address %s to %q: %w", a, name, err))
			continue
		}
		s.addedAddrs[a] = true
		s.log.Info("added address", "link", name, "addr", a)
	}
	return errors.Join(errs...)
}

// hostAddr is a as a /32 or /128 netlink address. IPv6 addresses skip
// duplicate address detection so they can be bound at once.
func hostAddr(a netip.Addr) *netlink.Addr {
	bits := a.BitLen()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	return addr
}

// removeLinkLocked deletes the link if we created it, or else removes the
// addresses we added to it.
func (s *Setup) removeLinkLocked() error {
	name := s.cfg.InterfaceName
	link, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil
	case err != nil:
		return fmt.Errorf("netsetup: look up link %q: %w", name, err)
	}
	if s.linkCreated {
		if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("netsetup: delete link %q: %w", name, err)
		}
		s.log.Info("deleted link", "link", name)
		return nil
	}
	var errs []error
	for _, a := range s.cfg.Addrs {
		if !s.addedAddrs[a] {
			continue
		}
		// EADDRNOTAVAIL: someone removed it already.
		if err := netlink.AddrDel(link, hostAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("netsetup: remove address %s from %q: %w", a, name, err))
			continue
		}
		delete(s.addedAddrs, a)
		s.log.Info("removed address", "link", name, "addr", a)
	}
	return errors.Join(errs...)
}
