// Package memory holds tests that run the real nodelocaldns binary and
// measure its peak resident memory (VmHWM from /proc/PID/status: the peak,
// not a figure after a GC) with -max-inflight misses outstanding against
// upstreams that never answer, on both miss paths (UDP to the node's
// resolver, pipelined TCP to kube-dns), and with everything hostile at
// once. The budgets they check are the ones docs/design.md and
// deploy/daemonset.yaml state.
package memory
