package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// DefaultKubeDNSConfigMap is where the stock node-cache's DaemonSet mounts
// the kube-dns ConfigMap; -kubednscm defaults to it when it exists.
var DefaultKubeDNSConfigMap = "/etc/kube-dns"

// Keys of the kube-dns ConfigMap that nodelocaldns reads; each is a file in
// the mounted directory. Other keys (federations) are ignored.
const (
	KeyStubDomains         = "stubDomains"
	KeyUpstreamNameservers = "upstreamNameservers"
)

// MaxUpstreamNameservers is kube-dns' limit (and glibc's MAXNS).
const MaxUpstreamNameservers = 3

// maxKeySize bounds what is read of one key: a ConfigMap holds at most 1 MiB.
const maxKeySize = 1 << 20

// ErrConfigMap marks an invalid kube-dns ConfigMap (unreadable, bad JSON,
// bad address, too many upstreams, a stub domain that is not a domain).
var ErrConfigMap = errors.New("invalid kube-dns ConfigMap")

// ConfigMapData is the raw content of the keys at one moment: nil for a key
// that is absent. It is compared to decide whether anything changed, so an
// unchanged invalid ConfigMap is reported once, not on every re-read.
type ConfigMapData struct {
	StubDomains         []byte
	UpstreamNameservers []byte
}

// Equal reports whether d and o hold the same keys with the same content.
func (d ConfigMapData) Equal(o ConfigMapData) bool {
	return (d.StubDomains == nil) == (o.StubDomains == nil) && bytes.Equal(d.StubDomains, o.StubDomains) &&
		(d.UpstreamNameservers == nil) == (o.UpstreamNameservers == nil) && bytes.Equal(d.UpstreamNameservers, o.UpstreamNameservers)
}

// KubeDNSConfigMap is what the kube-dns ConfigMap says about forwarding.
// The zero value sets nothing.
type KubeDNSConfigMap struct {
	// StubDomains maps a zone (lower-case FQDN) to its servers, in order.
	StubDomains map[string][]netip.AddrPort
	// UpstreamNameservers replace the resolv.conf list for "."; nil when
	// not set.
	UpstreamNameservers []netip.AddrPort
}

// Zones returns the stub zones, sorted.
func (k KubeDNSConfigMap) Zones() []string {
	zs := make([]string, 0, len(k.StubDomains))
	for z := range k.StubDomains {
		zs = append(zs, z)
	}
	sort.Strings(zs)
	return zs
}

// String renders k for logs and -check-config.
func (k KubeDNSConfigMap) String() string {
	var b strings.Builder
	b.WriteString("stubDomains {")
	for i, z := range k.Zones() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %v", z, k.StubDomains[z])
	}
	b.WriteString("} upstreamNameservers ")
	if k.UpstreamNameservers == nil {
		b.WriteString("(not set)")
	} else {
		fmt.Fprint(&b, k.UpstreamNameservers)
	}
	return b.String()
}

// ReadConfigMapDir reads the keys from a mounted ConfigMap directory. A
// missing directory or key reads as not set. When the directory has the
// kubelet's layout (key -> ..data/key, ..data -> ..<timestamp>), the keys
// are read from the directory ..data points at, and again if ..data was
// swapped meanwhile, so both keys come from one version of the ConfigMap
// even while the kubelet updates it (and a key added by an update is seen
// before the kubelet creates its top-level symlink).
func ReadConfigMapDir(dir string) (ConfigMapData, error) {
	dataLink := filepath.Join(dir, "..data")
	for range 5 {
		before, errBefore := filepath.EvalSymlinks(dataLink)
		if errBefore != nil && !errors.Is(errBefore, fs.ErrNotExist) {
			return ConfigMapData{}, fmt.Errorf("%w: %v", ErrConfigMap, errBefore)
		}
		from := dir
		if errBefore == nil {
			from = before
		}
		d, err := readKeys(from)
		after, errAfter := filepath.EvalSymlinks(dataLink)
		if before == after && (errBefore == nil) == (errAfter == nil) {
			return d, err
		}
		// The kubelet swapped ..data while we read: read the new version.
	}
	return ConfigMapData{}, fmt.Errorf("%w: %s keeps changing while read", ErrConfigMap, dataLink)
}

func readKeys(dir string) (ConfigMapData, error) {
	var d ConfigMapData
	var err error
	if d.StubDomains, err = readKey(dir, KeyStubDomains); err != nil {
		return ConfigMapData{}, err
	}
	if d.UpstreamNameservers, err = readKey(dir, KeyUpstreamNameservers); err != nil {
		return ConfigMapData{}, err
	}
	return d, nil
}

// readKey returns the content of dir/key, or nil when it does not exist.
func readKey(dir, key string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfigMap, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeySize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfigMap, key, err)
	}
	if len(b) > maxKeySize {
		return nil, fmt.Errorf("%w: %s: larger than a ConfigMap can be", ErrConfigMap, key)
	}
	if b == nil {
		b = []byte{} // present but empty: still "not set", but distinct from absent for Equal
	}
	return b, nil
}

// ParseKubeDNSConfigMap validates the keys as kube-dns does: stubDomains is
// a JSON object of domain -> list of "IP[:port]", upstreamNameservers a JSON
// list of at most 3 "IP[:port]" (port 53 by default). An absent, empty,
// whitespace-only or null key, an empty list or an empty object mean not
// set. Every error wraps ErrConfigMap and says which key and value are
// wrong. c supplies what a stub domain or server must not be: our own
// listen addresses on our port (a forwarding loop) and, outside local mode,
// exactly the zones kube-dns answers (the cluster domain, in-addr.arpa.,
// ip6.arpa.), which a stub domain would take away from it. Zones below
// them are fine.
func (c *Config) ParseKubeDNSConfigMap(d ConfigMapData) (KubeDNSConfigMap, error) {
	var k KubeDNSConfigMap
	if raw, ok := jsonValue(d.StubDomains); ok {
		var m map[string][]string
		if err := json.Unmarshal(raw, &m); err != nil {
			return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: not a JSON object of domain to list of servers: %v", ErrConfigMap, KeyStubDomains, err)
		}
		for domain, list := range m {
			zone, err := stubZone(domain)
			if err != nil {
				return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %v", ErrConfigMap, KeyStubDomains, err)
			}
			if !c.LocalMode && (zone == c.ClusterDomain || zone == "in-addr.arpa." || zone == "ip6.arpa.") {
				return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %q is kube-dns' own zone", ErrConfigMap, KeyStubDomains, domain)
			}
			if _, dup := k.StubDomains[zone]; dup {
				return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %q is listed twice", ErrConfigMap, KeyStubDomains, zone)
			}
			if len(list) == 0 {
				return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %q has no nameservers", ErrConfigMap, KeyStubDomains, domain)
			}
			servers, err := c.configMapServers(list)
			if err != nil {
				return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %q: %v", ErrConfigMap, KeyStubDomains, domain, err)
			}
			if k.StubDomains == nil {
				k.StubDomains = make(map[string][]netip.AddrPort, len(m))
			}
			k.StubDomains[zone] = servers
		}
	}
	if raw, ok := jsonValue(d.UpstreamNameservers); ok {
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: not a JSON list of servers: %v", ErrConfigMap, KeyUpstreamNameservers, err)
		}
		if len(list) > MaxUpstreamNameservers {
			return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %d servers, at most %d", ErrConfigMap, KeyUpstreamNameservers, len(list), MaxUpstreamNameservers)
		}
		if len(list) > 0 {
			servers, err := c.configMapServers(list)
			if err != nil {
				return KubeDNSConfigMap{}, fmt.Errorf("%w: %s: %v", ErrConfigMap, KeyUpstreamNameservers, err)
			}
			k.UpstreamNameservers = servers
		}
	}
	return k, nil
}

// jsonValue returns the trimmed key content and whether it sets anything.
func jsonValue(b []byte) ([]byte, bool) {
	b = bytes.TrimSpace(b)
	return b, len(b) > 0 && string(b) != "null"
}

// configMapServers parses each "IP[:port]", dropping repeats.
func (c *Config) configMapServers(list []string) ([]netip.AddrPort, error) {
	out := make([]netip.AddrPort, 0, len(list))
	for _, s := range list {
		ap, err := ParseServer(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if int(ap.Port()) == c.Port && serves(c.OwnAddrs(), ap.Addr()) {
			return nil, fmt.Errorf("%s is our own listen address: forwarding there would loop", ap)
		}
		if !slices.Contains(out, ap) {
			out = append(out, ap)
		}
	}
	return out, nil
}

// stubZone checks that a stubDomains key is a domain name (letters, digits,
// '-' and '_' in labels of 1-63 bytes, at most 253 bytes, not the root) and
// returns it as a lower-case FQDN.
func stubZone(domain string) (string, error) {
	z, err := normalizeDomain(domain)
	if err != nil || len(z) > 254 {
		return "", fmt.Errorf("%q is not a domain name", domain)
	}
	for _, ch := range strings.TrimSuffix(z, ".") {
		if !('a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '_' || ch == '.') {
			return "", fmt.Errorf("%q is not a domain name", domain)
		}
	}
	return z, nil
}

// LoadKubeDNSConfigMap reads and validates the ConfigMap directory c names
// (-kubednscm); with none it returns the zero value.
func (c *Config) LoadKubeDNSConfigMap() (KubeDNSConfigMap, ConfigMapData, error) {
	if c.KubeDNSConfigMap == "" {
		return KubeDNSConfigMap{}, ConfigMapData{}, nil
	}
	d, err := ReadConfigMapDir(c.KubeDNSConfigMap)
	if err != nil {
		return KubeDNSConfigMap{}, d, err
	}
	k, err := c.ParseKubeDNSConfigMap(d)
	return k, d, err
}
