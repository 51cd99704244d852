// Package fallback tests that no nodelocaldns process is ever a single point
// of failure (docs/design.md, "No black hole"): the real binary serves a
// node, network namespaces stand in for the node, a pod and a kube-dns pod,
// a kube-proxy stand-in translates the kube-dns Services (iptables mode:
// KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP DNAT, as kube-proxy writes them; or
// nftables mode: a table of its own, as kube-proxy's nftables mode makes
// it), and a pod and a host-network client ask both addresses every 100 ms
// with one 1 s try, while the daemon is killed and kept dead, stopped, or
// rolled out without a twin.
//
// The test binary re-executes itself inside a network namespace of its own
// (the node), so the API server, the daemon and the kube-proxy stand-in
// share it and nothing touches the host's network.
package fallback
