package podwatch

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet's limits on a pod's search list (k8s.io/kubernetes
// pkg/apis/core/validation MaxDNSSearchPaths, MaxDNSSearchListChars, and
// apimachinery's DNS1123SubdomainMaxLength, applied by
// pkg/kubelet/network/dns formDNSSearchFitsLimits, v1.37).
const (
	// maxSearchPaths: the kubelet keeps the first 32 search domains.
	maxSearchPaths = 32
	// maxSearchListChars: then drops domains from the end until the
	// space-joined list is at most 2048 characters.
	maxSearchListChars = 2048
	// maxSearchDomainLen: a domain longer than 253 characters is left out
	// (glibc 2.28 aborts on longer ones).
	maxSearchDomainLen = 253
	// defaultClusterFirstNdots: the kubelet writes "options ndots:5" for
	// ClusterFirst pods.
	defaultClusterFirstNdots = "ndots:5"
	// resolverDefaultNdots: glibc, musl and Go use ndots 1 when resolv.conf
	// does not set it.
	resolverDefaultNdots = 1
	// resolverMaxNdots: glibc (RES_MAXNDOTS), musl and Go cap ndots at 15.
	resolverMaxNdots = 15
	// muslMaxLine: musl reads resolv.conf lines into a 256-byte buffer and
	// ignores a longer line entirely, so a search line of 256 bytes or more
	// (with its newline) means no search list at all under musl, the full
	// list under glibc: the pod's behaviour then depends on its libc.
	muslMaxLine = 256
)

// NodeResolvConf is what the kubelet takes from the resolv.conf it is
// given (--resolv-conf): the search domains and options it copies into
// pods with dnsPolicy Default, and the search domains it appends for
// ClusterFirst pods.
type NodeResolvConf struct {
	Search  []string
	Options []string
}

// ReadNodeResolvConf reads the node's resolv.conf the way the kubelet does:
// the last "search" line wins, "." and trailing dots are dropped; "options"
// lines accumulate, a later option replacing an earlier one of the same name.
func ReadNodeResolvConf(path string) (NodeResolvConf, error) {
	f, err := os.Open(path)
	if err != nil {
		return NodeResolvConf{}, fmt.Errorf("node resolv.conf: %w", err)
	}
	defer f.Close()
	return parseNodeResolvConf(f)
}

func parseNodeResolvConf(r io.Reader) (NodeResolvConf, error) {
	var nc NodeResolvConf
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "search":
			nc.Search = nc.Search[:0:0]
			for _, s := range f[1:] {
				if s != "." {
					nc.Search = append(nc.Search, strings.TrimSuffix(s, "."))
				}
			}
		case "options":
			nc.Options = mergeOptions(nc.Options, f[1:])
		}
	}
	if err := sc.Err(); err != nil {
		return NodeResolvConf{}, fmt.Errorf("node resolv.conf: %w", err)
	}
	return nc, nil
}

// mergeOptions adds opts to base, an option replacing one of the same name
// (the part before ':'), keeping first-seen order.
func mergeOptions(base, opts []string) []string {
	out := append([]string(nil), base...)
	for _, o := range opts {
		name, _, _ := strings.Cut(o, ":")
		replaced := false
		for i, b := range out {
			if bn, _, _ := strings.Cut(b, ":"); bn == name {
				out[i], replaced = o, true
				break
			}
		}
		if !replaced {
			out = append(out, o)
		}
	}
	return out
}

// PodResolvConf returns the search list and options the kubelet writes into
// pod's resolv.conf (pkg/kubelet/network/dns GetPodDNS, v1.37), given the
// node's resolv.conf and the cluster domain (without trailing dot). It
// assumes the kubelet has a cluster DNS address (it does wherever pods talk
// to nodelocaldns).
func PodResolvConf(pod *corev1.Pod, node NodeResolvConf, clusterDomain string) (search, options []string) {
	switch podDNSType(pod) {
	case dnsNone:
	case dnsCluster:
		search = omitDuplicates(append([]string{
			pod.Namespace + ".svc." + clusterDomain, "svc." + clusterDomain, clusterDomain,
		}, node.Search...))
		options = []string{defaultClusterFirstNdots}
	case dnsHost:
		search = append([]string(nil), node.Search...)
		options = append([]string(nil), node.Options...)
	}
	if c := pod.Spec.DNSConfig; c != nil {
		search = omitDuplicates(append(search, c.Searches...))
		add := make([]string, 0, len(c.Options))
		for _, o := range c.Options {
			if o.Value != nil {
				add = append(add, o.Name+":"+*o.Value)
			} else {
				add = append(add, o.Name)
			}
		}
		options = mergeOptions(options, add)
	}
	return fitSearchLimits(search), options
}

type dnsType int

const (
	dnsCluster dnsType = iota
	dnsHost
	dnsNone
)

// podDNSType is the kubelet's getPodDNSType: ClusterFirst on the host
// network falls back to Default; an unknown policy is treated as
// ClusterFirst (the API server rejects those anyway).
func podDNSType(pod *corev1.Pod) dnsType {
	switch pod.Spec.DNSPolicy {
	case corev1.DNSNone:
		return dnsNone
	case corev1.DNSDefault:
		return dnsHost
	case corev1.DNSClusterFirst, "":
		if pod.Spec.HostNetwork {
			return dnsHost
		}
	}
	return dnsCluster
}

func omitDuplicates(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// fitSearchLimits is the kubelet's formDNSSearchFitsLimits.
func fitSearchLimits(s []string) []string {
	if len(s) > maxSearchPaths {
		s = s[:maxSearchPaths]
	}
	kept := s[:0:0]
	for _, d := range s {
		if len(d) <= maxSearchDomainLen {
			kept = append(kept, d)
		}
	}
	s = kept
	total := len(strings.Join(s, " "))
	for len(s) > 0 && total > maxSearchListChars {
		total -= len(s[len(s)-1]) + 1
		s = s[:len(s)-1]
	}
	return s
}

// ndots is the resolvers' reading of the options: the last ndots:N, 1 when
// absent, capped at 15; ok is false when the value is not a number (glibc
// and Go read that differently).
func ndots(options []string) (n int, ok bool) {
	n = resolverDefaultNdots
	for _, o := range options {
		v, found := strings.CutPrefix(o, "ndots:")
		if !found {
			continue
		}
		x, err := strconv.Atoi(v)
		if err != nil || x < 0 {
			return 0, false
		}
		n = min(x, resolverMaxNdots)
	}
	return n, true
}
