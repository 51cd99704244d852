// Package netsetup owns the node's network plumbing for the NodeLocal DNS
// cache: the link that holds the local addresses, the iptables rules that let
// DNS to and from those addresses skip conntrack and pass the host firewall,
// the reconciler that keeps both in place, and the teardown that removes
// exactly what was added.
//
// It must not serve DNS, must not import prometheus or any other internal
// package of this module: it reports through the [Observer] interface and
// logs through the injected [log/slog.Logger].
//
// # Lifecycle
//
//	s, err := netsetup.New(cfg)         // validates, touches nothing
//	err = s.EnsureLink(ctx)             // before the DNS listeners bind
//	... start listeners on cfg.Addrs ...
//	err = s.EnsureRules(ctx)            // after the listeners are up
//	go s.Run(ctx)                       // reconciler, returns when ctx is done
//	... on exit, unless -skipteardown ...
//	err = s.Teardown(deadlineCtx)       // rules first, then the link
//
// # Link
//
// EnsureLink creates a link of type dummy named [Config.InterfaceName], sets
// it up and adds every address as /32 (IPv4) or /128 (IPv6, with IFA_F_NODAD
// so the address is usable at once, without duplicate address detection).
// If a link of that name already exists, of any type, it is adopted: it is
// set up and the missing addresses are added. If the kernel has no dummy
// link type, EnsureLink returns an error wrapping [ErrNoDummy]; the daemon can
// run with -setupinterface=false and a link created by other means.
//
// # Rules
//
// For each local address IP, DNS port P and health port H (IPv4 through
// iptables, IPv6 through ip6tables), inserted at position 1 so they come
// before kube-proxy's rules, each with a comment naming nodelocaldns. With
// FallbackAfter 0, the stock node-cache's set:
//
//	raw    PREROUTING  -d IP -p tcp|udp --dport P  -j NOTRACK
//	filter INPUT       -d IP -p tcp|udp --dport P  -j ACCEPT
//	raw    OUTPUT      -s IP -p tcp|udp --sport P  -j NOTRACK
//	filter OUTPUT      -s IP -p tcp|udp --sport P  -j ACCEPT
//	raw    OUTPUT      -d IP -p tcp|udp --dport P  -j NOTRACK   (host-network clients)
//	raw    OUTPUT      -d IP -p tcp     --dport H  -j NOTRACK   (when H > 0)
//	raw    OUTPUT      -s IP -p tcp     --sport H  -j NOTRACK   (when H > 0)
//
// With FallbackAfter N (fallback.go), the NOTRACK of queries holds only
// while we serve, and what we do not serve goes to kube-dns:
//
//	raw    PREROUTING  -d IP -p tcp|udp --dport P -m socket GATE  -j NOTRACK
//	filter INPUT       -d IP -p tcp|udp --dport P -m socket       -j ACCEPT
//	filter INPUT       -d IP -p tcp|udp --dport P                 -j DROP   (no socket: not refused)
//	raw and filter OUTPUT -s IP --sport P                          (as above)
//	raw    OUTPUT      -d IP -p tcp|udp --dport P GATE            -j NOTRACK
//	filter OUTPUT      -m conntrack --ctstate NEW --ctorigdst IP --ctorigdstport P   (count)
//	filter FORWARD     the same                                                       (count)
//	nat    PREROUTING  -d IP -p tcp|udp --dport P  -j NODELOCALDNS-FB-<hash>  (appended)
//	nat    OUTPUT      the same                                              (appended)
//	nat    POSTROUTING -s IP -m conntrack --ctstate DNAT --ctorigdst IP ...  -j MASQUERADE
//	(health port rules as above)
//
// where GATE is `-m recent --rcheck --seconds N --name nodelocaldns-P --rdest`
// (nodelocaldns6-P for IPv6: a table has one mask, its first rule's):
// the address's entry, written by [Setup.Heartbeat] and removed by
// [Setup.CloseGate], seen within N seconds. [Setup.SetFallback] writes the
// chains' DNATs to kube-dns' pods (empty for a Service's ClusterIP, which
// kube-proxy translates); [Setup.FallbackCounts] reads the counters;
// [Setup.KubeProxy] reads kube-proxy's iptables-mode rules for the pods.
// Rules of ours that are not wanted (an older version's, another N's) are
// deleted by EnsureRules; [Setup.RemoveAll] deletes every rule of ours for
// these addresses and ports.
//
// EnsureRules is idempotent: a rule is inserted only after the exact rule
// was checked (iptables -C) and found missing, and copies beyond the first
// (left by an older daemon or a racing writer) are deleted, so after any
// number of calls each rule exists exactly once. Every iptables call waits
// for the xtables lock for at most [Config.LockWait].
//
// A rule carrying our comment and our exact specification is ours, whoever
// inserted it: Teardown deletes every copy of each of our rules and nothing
// else.
//
// Two instances may keep the same rules at once (a rolling update starts
// the new daemon before the old one exits): both re-assert them, and a
// rule whose surplus copies both deleted at the same moment is re-inserted
// at once. Teardown must then run only in the last instance: the daemon
// skips it while a twin serves the same addresses, and hands its
// [Ownership] on so that the last one removes the link or addresses the
// first one added ([Setup.Inherit]).
//
// # Backend
//
// With Backend "auto" the iptables backend (legacy or nft) is chosen the
// way Kubernetes' iptables-wrappers chooses it: the side whose save output
// holds kubelet's KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain (nft's
// mangle table checked first, then all of legacy), else the side with more
// rules, else nft. The choice is made once, on the first EnsureRules, logged
// in one line and reported through [Observer.Backend].
//
// # Reconciler
//
// Run re-asserts the link, its addresses and (once EnsureRules has been
// called) the rules every [Config.SyncInterval]. It also subscribes to
// netlink link and address updates and repairs a deleted or downed link or a
// removed address within about a second.
//
// # Teardown
//
// Teardown stops the reconciler's work, deletes the rules and the fallback's
// chains, then deletes the link if this process created it, or otherwise
// removes only the addresses this process added. It gives up when the
// context's deadline passes. Whether to tear down at all is the daemon's
// decision (a rollout leaves the fallback for the next instance).
//
// # Errors counted
//
// Setup failures are reported through [Observer.SetupError] with the kinds
// listed in [SetupErrorKinds], the names the stock node-cache uses.
package netsetup
