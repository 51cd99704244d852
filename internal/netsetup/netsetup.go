package netsetup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// Setup error kinds, as the stock node-cache names them.
const (
	KindIPTables       = "iptables"        // an iptables check, insert or delete failed
	KindIPTablesLock   = "iptables_lock"   // the xtables lock was held longer than LockWait
	KindInterfaceAdd   = "interface_add"   // the link could not be created
	KindInterfaceCheck = "interface_check" // the link could not be looked up, set up or given its addresses
	KindConfigMap      = "configmap"       // not reported here; listed so the counter is complete
)

// SetupErrorKinds lists every kind [Observer.SetupError] may be called with
// (plus "configmap", reported elsewhere), so a metric can start each at 0.
var SetupErrorKinds = []string{KindIPTables, KindIPTablesLock, KindInterfaceAdd, KindInterfaceCheck, KindConfigMap}

// Backend names.
const (
	BackendAuto   = "auto"
	BackendLegacy = "legacy"
	BackendNFT    = "nft"
)

// Defaults.
const (
	// defaultInterfaceName is the link name the stock node-cache uses.
	defaultInterfaceName = "nodelocaldns"
	// defaultPort is the DNS port.
	defaultPort = 53
	// defaultSyncInterval is the stock node-cache's check interval: frequent
	// enough that a flushed rule set is back within a minute, rare enough
	// that a node with many DaemonSets does not queue on the xtables lock.
	defaultSyncInterval = 60 * time.Second
	// defaultLockWait bounds each iptables call's wait for the xtables lock.
	// 5 s: kube-proxy's iptables-restore of a large ruleset holds the lock
	// for a few seconds; longer would stall a reconcile pass behind it.
	defaultLockWait = 5 * time.Second
)

// maxIfNameLen is IFNAMSIZ (16) minus the terminating NUL.
const maxIfNameLen = 15

// ErrNoDummy is wrapped by EnsureLink's error when the kernel cannot create
// a link of type dummy.
var ErrNoDummy = errors.New("kernel has no dummy link type (CONFIG_DUMMY not built and module not loadable)")

// ErrClosed is returned by EnsureLink and EnsureRules after Teardown.
var ErrClosed = errors.New("netsetup: torn down")

// Config says what to set up. The zero value of each field means its default.
type Config struct {
	InterfaceName  string        // link name, default "nodelocaldns"
	Addrs          []netip.Addr  // every -localip; IPv4 and/or IPv6
	Port           int           // DNS port, default 53
	ExtraPorts     []int         // other DNS ports (a Corefile's blocks on other ports): the DNS rules cover them too
	HealthPort     int           // health port (NOTRACK to and from it), 0 = none
	SetupInterface bool          // -setupinterface: own the link and its addresses
	SetupIPTables  bool          // -setupiptables: own the rules
	Backend        string        // "auto" (default), "legacy" or "nft"
	SyncInterval   time.Duration // reconcile period, default 60 s
	LockWait       time.Duration // bound on waiting for the xtables lock, default 5 s, at least 1 s
	// FallbackAfter turns the fallback on (fallback.go): queries are
	// NOTRACKed to our sockets only while a socket is bound and the gate
	// was opened (Heartbeat) within this long (whole seconds, 1 s to 1 m).
	// 0: the stock node-cache's rules, which NOTRACK whether anyone
	// listens or not.
	FallbackAfter time.Duration
	// WildcardOnly are addresses served only by a wildcard socket (a
	// Corefile's bind 0.0.0.0): their socket match counts wildcard sockets.
	WildcardOnly []netip.Addr
	Logger       *slog.Logger // default slog.Default()
	Observer     Observer     // may be nil
}

// Observer receives what an operator wants counted. Calls may come from any
// goroutine; implementations must be safe for concurrent use.
type Observer interface {
	// SetupError counts one failure of the given kind (see SetupErrorKinds).
	SetupError(kind string)
	// Backend reports the iptables backend, "legacy" or "nft", once chosen.
	Backend(name string)
}

type nopObserver struct{}

func (nopObserver) SetupError(string) {}
func (nopObserver) Backend(string)    {}

// Setup owns the link and the rules described by a Config. Its methods are
// safe for concurrent use; they are serialised internally.
type Setup struct {
	cfg   Config
	log   *slog.Logger
	obs   Observer
	rules []Rule

	// linkIndex is the index of our link, 0 if unknown; read by the netlink
	// watcher without taking mu.
	linkIndex atomic.Int32

	// sem serialises the methods; a channel rather than a sync.Mutex so
	// that waiting for it honours a context.
	sem          chan struct{}
	closed       bool                // Teardown has run
	linkCreated  bool                // we created the link (else adopted)
	adopted      bool                // the adopted link was logged
	addedAddrs   map[netip.Addr]bool // addresses we added to the link
	rulesWanted  bool                // EnsureRules has been called
	adoptedRules bool                // the first EnsureRules pass is done (its log line written)
	backend      string              // chosen backend, "" until the first EnsureRules
	tables       map[family]*iptables.IPTables
	fbWant       *Fallback // the DNAT chains' wanted targets; nil: leave them as found
}

// New validates cfg, fills in defaults and returns a Setup. It touches
// neither links nor rules.
func New(cfg Config) (*Setup, error) {
	if cfg.InterfaceName == "" {
		cfg.InterfaceName = defaultInterfaceName
	}
	if len(cfg.InterfaceName) > maxIfNameLen {
		return nil, fmt.Errorf("netsetup: interface name %q longer than %d bytes", cfg.InterfaceName, maxIfNameLen)
	}
	if cfg.Port == 0 {
		cfg.Port = defaultPort
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("netsetup: port %d out of range", cfg.Port)
	}
	for _, p := range cfg.ExtraPorts {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("netsetup: port %d out of range", p)
		}
	}
	if cfg.HealthPort < 0 || cfg.HealthPort > 65535 {
		return nil, fmt.Errorf("netsetup: health port %d out of range", cfg.HealthPort)
	}
	switch cfg.Backend {
	case "":
		cfg.Backend = BackendAuto
	case BackendAuto, BackendLegacy, BackendNFT:
	default:
		return nil, fmt.Errorf("netsetup: unknown iptables backend %q (want auto, legacy or nft)", cfg.Backend)
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = defaultSyncInterval
	}
	if cfg.LockWait <= 0 {
		cfg.LockWait = defaultLockWait
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	addrs, err := cleanAddrs(cfg.Addrs)
	if err != nil {
		return nil, err
	}
	if cfg.FallbackAfter < 0 || cfg.FallbackAfter > maxFallbackAfter || cfg.FallbackAfter%time.Second != 0 {
		return nil, fmt.Errorf("netsetup: fallback after %v: want whole seconds, at most %v (0: off)", cfg.FallbackAfter, maxFallbackAfter)
	}
	wild, err := cleanAddrs(cfg.WildcardOnly)
	if err != nil {
		return nil, err
	}
	cfg.WildcardOnly = wild
	if len(addrs) == 0 && (cfg.SetupInterface || cfg.SetupIPTables) {
		return nil, errors.New("netsetup: no local address")
	}
	cfg.Addrs = addrs
	return &Setup{
		cfg:        cfg,
		log:        cfg.Logger.With("component", "netsetup"),
		obs:        cfg.Observer,
		rules:      rulesFor(&cfg),
		addedAddrs: make(map[netip.Addr]bool),
		sem:        make(chan struct{}, 1),
	}, nil
}

// lock takes the Setup's lock or gives up when ctx is done.
func (s *Setup) lock(ctx context.Context) error {
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Setup) unlock() { <-s.sem }

// cleanAddrs unmaps IPv4-in-IPv6 addresses, rejects invalid and zoned ones
// and drops duplicates, keeping the order.
func cleanAddrs(in []netip.Addr) ([]netip.Addr, error) {
	seen := make(map[netip.Addr]bool, len(in))
	out := make([]netip.Addr, 0, len(in))
	for _, a := range in {
		if !a.IsValid() {
			return nil, errors.New("netsetup: invalid local address")
		}
		if a.Zone() != "" {
			return nil, fmt.Errorf("netsetup: local address %s has a zone", a)
		}
		a = a.Unmap()
		if seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, a)
	}
	return out, nil
}

// Addrs are the addresses set up (cleaned: unmapped, without duplicates).
func (s *Setup) Addrs() []netip.Addr { return slices.Clone(s.cfg.Addrs) }

// installedRules returns the rules EnsureRules installs, in the order of
// the package documentation.
func (s *Setup) installedRules() []Rule {
	return append([]Rule(nil), s.rules...)
}

// backendName returns the chosen iptables backend, "" before the first
// EnsureRules.
func (s *Setup) backendName() string {
	s.sem <- struct{}{}
	defer s.unlock()
	return s.backend
}

var _ Observer = nopObserver{}
