// Package config owns the daemon's typed configuration: the command-line
// flags (named as the stock node-cache names them where they mean the same
// thing), the node's resolv.conf, and their validation.
//
// It opens no sockets and touches nothing on the node: Parse is pure over
// its arguments, the environment and the files it is pointed at, so
// -check-config can run it on its own.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
)

// Config is everything the daemon needs to start.
type Config struct {
	// LocalIPs are the DNS listen addresses.
	LocalIPs []netip.Addr
	// InterfaceIPs are the addresses -setupinterface puts on the interface
	// and the rules name; nil: LocalIPs. A Corefile's bind 0.0.0.0 or bind
	// IFACE listens on addresses the host already has, which are not.
	InterfaceIPs []netip.Addr
	// Port is the DNS port: -port, or the Corefile's first block's.
	Port int
	// Listen are the DNS sockets, address and port, when a Corefile's
	// blocks listen on several ports (a server key on another port): the
	// addresses each block listens on, with its port. nil: every LocalIPs
	// on Port (Sockets).
	Listen []netip.AddrPort

	// KubeDNS is the cluster DNS service that answers the cluster domain
	// and the reverse zones; invalid (zero) in local mode.
	KubeDNS netip.AddrPort
	// KubeDNSSource says where KubeDNS came from, for logs.
	KubeDNSSource string
	// KubeDNSService names the Service whose ClusterIP KubeDNS is (-upstreamsvc, when
	// KubeDNS is its $NAME_SERVICE_HOST, as node-cache renders __PILLAR__CLUSTER__DNS__):
	// the daemon follows its EndpointSlices to ask kube-dns' pods directly. "" when
	// kube-dns' address is not known to be that Service's (then the ClusterIP only).
	KubeDNSService string
	LocalMode      bool
	ClusterDomain  string // FQDN with trailing dot, lower case
	ResolvConf     string
	// Nameservers are the node's resolvers read from ResolvConf (after
	// following systemd-resolved's stub and dropping our own addresses).
	Nameservers []netip.AddrPort
	// KubeDNSConfigMap is the mounted kube-dns ConfigMap directory
	// (stubDomains, upstreamNameservers); "" when off. Read and watched
	// by the daemon, not by Parse: a bad ConfigMap must not stop a start.
	KubeDNSConfigMap string

	MetricsAddr string
	HealthPort  int
	// HealthAddr serves /health and /ready ("" when -health-port is 0).
	HealthAddr string

	// Lifecycle: LameDuck is how long the daemon keeps answering after
	// SIGTERM; StateDir is the host directory where instances serving the
	// same addresses find each other ("" turns handover off); QueryLog
	// logs one line per query.
	LameDuck time.Duration
	StateDir string
	QueryLog bool

	SetupInterface bool
	SetupIPTables  bool
	SkipTeardown   bool
	// FallbackAfter: while no instance serves an address the kernel sends
	// its queries to kube-dns; a process that stops passing its loop check
	// (stopped, wedged) is skipped this long after (0: the stock's
	// unconditional rules, no fallback). Teardown: "auto" leaves the
	// fallback on an exit that is not an uninstall, "always" removes all.
	FallbackAfter time.Duration
	Teardown      string
	// SocketUID owns the DNS sockets, so only processes of that UID can
	// join their SO_REUSEPORT group; -1 is the process's own (root).
	SocketUID     int
	InterfaceName string
	SyncInterval  time.Duration
	IPTablesMode  string

	Cache CacheConfig

	// Autopath: server-side search for this node's pods (docs/autopath.md).
	Autopath AutopathConfig

	UDPSockets int
	// UDP sizes (docs/design.md, "UDP sizes"): MaxUDPSize is the EDNS
	// size we advertise, to upstreams (their larger answers come over
	// TCP) and in the OPT of our answers; MaxClientUDPSize caps the
	// answers we send a client over UDP at min(its EDNS size, this),
	// 512 without EDNS.
	MaxUDPSize       int
	MaxClientUDPSize int

	MaxInflight    int
	MaxTCPConns    int
	TCPIdleTimeout time.Duration
	ForwardTimeout time.Duration
	TCPPoolSize    int

	LogFormat   string
	CheckConfig bool
	// Cleanup: remove what earlier instances left on the node and exit.
	Cleanup bool
	// PProf is where /debug/pprof/ is served ("" off): its own listener,
	// loopback unless an address is given explicitly (-pprof, the
	// Corefile's pprof).
	PProf string
	// PProfBlock is the block profile's rate while pprof is served (the
	// Corefile's pprof { block [RATE] }; 0: off).
	PProfBlock int

	// DropIn: the stock image's flags and the Corefile (stockflags.go,
	// corefile.go).
	DropIn DropIn

	// Node: the node listener, where external names go, the node's
	// readiness condition (node.go).
	Node NodeConfig
}

// CacheConfig sizes the cache and caps lifetimes.
type CacheConfig struct {
	SuccessCapacity   int
	DenialCapacity    int
	MaxBytes          int64
	ClusterSuccessTTL time.Duration
	ClusterDenialTTL  time.Duration
	SuccessTTL        time.Duration
	DenialTTL         time.Duration
	MinTTL            time.Duration
	ServFailTTL       time.Duration
	// Serve-stale (RFC 8767) and prefetch.
	StaleWindow        time.Duration
	StaleClientTimeout time.Duration
	StaleRecheck       time.Duration
	PrefetchHits       int
	// LastKnownGood lists the zones (FQDNs; "." for every name) whose
	// answers are kept over a refresh that does not answer the question
	// (-last-known-good; serve_stale_policy prefer_positive).
	LastKnownGood []string
	// SnapshotInterval is how often the cache is written when it
	// changed, for a start after a crash (0: never, and none is loaded);
	// SnapshotMaxBytes bounds that file; SnapshotDir is where it is kept
	// ("": the state directory's group directory).
	SnapshotInterval time.Duration
	SnapshotMaxBytes int64
	SnapshotDir      string
}

// AutopathConfig turns autopath on and says how to find this node's pods.
type AutopathConfig struct {
	Enabled bool
	// NodeName selects the pods to watch (-node-name, default $NODE_NAME).
	NodeName string
	// NodeResolvConf is the resolv.conf the kubelet gives pods (its
	// --resolv-conf): the node's search domains and options.
	NodeResolvConf string
}

// ErrUsage marks a configuration error: the daemon prints it and exits 2.
var ErrUsage = errors.New("invalid configuration")

// DefaultStateDir is -state-dir's default, which the exec probe also uses:
// /run is a tmpfs on the host, so a reboot leaves no stale instance behind.
const DefaultStateDir = "/run/nodelocaldns"

// Env reads an environment variable; os.Getenv in production.
type Env func(string) string

// Parse reads args (without the program name) into a Config, reading the
// environment through env and files from disk. Every error wraps ErrUsage
// and says which flag or file is wrong. Help (-h) returns flag.ErrHelp.
func Parse(args []string, env Env, stderr io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("nodelocaldns", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &Config{}
	r := &rawFlags{}
	c.register(fs, r, env)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, usage("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.DropIn.Exit = exitText(&r.stock); c.DropIn.Exit != "" {
		return c, nil
	}
	kubeErr, err := c.checkFlags(r, set, env)
	if err != nil {
		return nil, err
	}
	if err := c.checkSizes(r); err != nil {
		return nil, err
	}
	if err := c.finish(r, set, env, kubeErr); err != nil {
		return nil, err
	}
	return c, nil
}

// rawFlags are the flags read as written, before Parse checks them.
type rawFlags struct {
	localIP, kubeDNS, upstreamSvc, clusterDomain string
	maxBytes, lastKnownGood                      string
	stock                                        stockFlags
	node                                         *nodeFlags
}

// register defines the flags on fs, into c and r.
func (c *Config) register(fs *flag.FlagSet, r *rawFlags, env Env) {
	fs.StringVar(&r.localIP, "localip", "169.254.20.10", "comma-separated IPv4/IPv6 addresses to serve DNS on (and to put on the interface)")
	fs.IntVar(&c.Port, "port", 53, "DNS port to listen on")
	fs.StringVar(&r.upstreamSvc, "upstreamsvc", "kube-dns", "Service whose NAME_SERVICE_HOST environment variable holds the kube-dns address")
	fs.StringVar(&r.kubeDNS, "kube-dns", "", "kube-dns address IP[:port]; wins over -upstreamsvc")
	fs.BoolVar(&c.LocalMode, "local-mode", false, "no cluster: forward every name to the node's resolvers and do not touch interfaces or iptables")
	fs.StringVar(&r.clusterDomain, "cluster-domain", strings.TrimSuffix(DefaultClusterDomain, "."), "cluster DNS domain, forwarded to kube-dns")
	fs.StringVar(&c.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf listing the node's resolvers")
	fs.StringVar(&c.KubeDNSConfigMap, "kubednscm", "", "kube-dns ConfigMap directory (stubDomains, upstreamNameservers), watched for changes (default "+DefaultKubeDNSConfigMap+" when it exists; \"\" turns it off)")
	fs.StringVar(&c.MetricsAddr, "metrics-listen-address", "", "address for /metrics, /health and /ready (default: first -localip, port 9253)")
	fs.IntVar(&c.HealthPort, "health-port", 8080, "health port, exempted from conntrack next to the DNS port; 0 serves no HTTP health")
	fs.StringVar(&c.HealthAddr, "health-listen-address", "", "address for /health and /ready (default: first -localip, -health-port)")
	fs.DurationVar(&c.LameDuck, "lameduck", 5*time.Second, "after SIGTERM, keep answering (not ready) this long before draining, unless a twin holds our sockets")
	fs.StringVar(&c.StateDir, "state-dir", DefaultStateDir, "host directory where instances on the same addresses find each other and hand sockets over; \"\" turns handover off")
	fs.BoolVar(&c.QueryLog, "querylog", false, "log one line per query: client, name, type, rcode, duration, cache hit or miss")
	fs.BoolVar(&c.SetupInterface, "setupinterface", true, "create the dummy interface holding -localip")
	fs.BoolVar(&c.SetupIPTables, "setupiptables", true, "install NOTRACK/ACCEPT iptables rules for -localip")
	fs.BoolVar(&c.SkipTeardown, "skipteardown", false, "leave interface and rules in place on exit")
	fs.DurationVar(&c.FallbackAfter, "fallback-after", 2*time.Second, "while no instance serves an address, the kernel sends its queries to kube-dns; a hung instance (stopped, a serving loop stuck) is bypassed this long after (whole seconds, at most 1m); 0: no fallback (the stock's rules)")
	fs.StringVar(&c.Teardown, "teardown", "auto", "on an exit no twin takes over: auto (remove link and rules on an uninstall, or outside a pod; else leave them, the fallback serving, for the next instance) or always")
	fs.IntVar(&c.SocketUID, "socket-uid", -1, "UID that owns the DNS sockets: only its processes can join our port group (SO_REUSEPORT); needs CAP_SETUID; -1: the process's own")
	fs.StringVar(&c.InterfaceName, "interfacename", "nodelocaldns", "name of the dummy interface")
	fs.StringVar(&c.IPTablesMode, "iptables-mode", "auto", "iptables backend: auto, legacy or nft")
	fs.IntVar(&c.Cache.SuccessCapacity, "success-capacity", cache.DefaultCapacity, "cache entries for positive answers")
	fs.IntVar(&c.Cache.DenialCapacity, "denial-capacity", cache.DefaultCapacity, "cache entries for NXDOMAIN/NODATA answers")
	fs.StringVar(&r.maxBytes, "cache-max-bytes", "64Mi", "memory bound for cached answers (bytes; suffixes Ki, Mi, Gi)")
	fs.DurationVar(&c.Cache.ClusterSuccessTTL, "cluster-success-ttl", 30*time.Second, "TTL cap for positive answers in the cluster domain")
	fs.DurationVar(&c.Cache.ClusterDenialTTL, "cluster-denial-ttl", 5*time.Second, "TTL cap for denials in the cluster domain")
	fs.DurationVar(&c.Cache.SuccessTTL, "success-ttl", 30*time.Second, "TTL cap for positive answers outside the cluster domain")
	fs.DurationVar(&c.Cache.DenialTTL, "denial-ttl", 30*time.Second, "TTL cap for denials outside the cluster domain")
	fs.DurationVar(&c.Cache.MinTTL, "min-ttl", 0, "TTL floor; 0 honours a TTL of 0 (not cached)")
	fs.DurationVar(&c.Cache.ServFailTTL, "servfail-ttl", 2*time.Second, "how long an upstream SERVFAIL is cached (0 disables, at most 5s)")
	fs.DurationVar(&c.Cache.StaleWindow, "serve-stale", time.Hour, "how long past expiry an answer may be served (TTL 30s) when the upstream fails or is slow; 0 disables")
	fs.DurationVar(&c.Cache.StaleClientTimeout, "stale-client-timeout", resolve.DefaultStaleClientTimeout, "how long a client waits for a refresh before it gets the stale answer")
	fs.StringVar(&r.lastKnownGood, "last-known-good", "", "comma-separated zones (\".\": every name) whose last answer that answers the question is kept, within -serve-stale, when a refresh comes back NXDOMAIN, NODATA, empty or a referral (CoreDNS's serve_stale_policy prefer_positive); \"\": off")
	fs.DurationVar(&c.Cache.StaleRecheck, "stale-recheck", resolve.DefaultStaleRecheck, "after a failed refresh, serve stale without asking the upstream for this long")
	fs.IntVar(&c.Cache.PrefetchHits, "prefetch", 2, "refresh an entry hit this many times before it expires (in the last 10% of its TTL); 0 disables")
	registerSnapshotFlags(fs, &c.Cache)
	fs.IntVar(&c.UDPSockets, "udp-sockets", 0, "SO_REUSEPORT UDP sockets per address (default GOMAXPROCS)")
	fs.IntVar(&c.MaxUDPSize, "max-udp-size", resolve.DefaultUDPSize, "EDNS UDP size we advertise, to upstreams (larger answers come over TCP) and in our answers")
	fs.IntVar(&c.MaxClientUDPSize, "max-client-udp-size", server.DefaultMaxClientUDPSize, "largest UDP answer to a client: its EDNS size up to this (512 without EDNS); larger answers are truncated")
	fs.IntVar(&c.MaxInflight, "max-inflight", resolve.DefaultMaxInflight, "distinct questions resolved upstream at once; past it a new question gets its stale answer or SERVFAIL at once")
	fs.IntVar(&c.MaxTCPConns, "max-tcp-conns", server.DefaultMaxTCPConns, "open client TCP connections")
	fs.DurationVar(&c.TCPIdleTimeout, "tcp-idle-timeout", server.DefaultTCPIdleTimeout, "close client TCP connections idle this long")
	fs.DurationVar(&c.ForwardTimeout, "forward-timeout", resolve.DefaultFetchTimeout, "bound on resolving one miss (glibc retries after 5s)")
	fs.IntVar(&c.TCPPoolSize, "tcp-pool-size", forward.DefaultPoolSize, "pipelined TCP connections per kube-dns server")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.Var(pprofFlag{&c.PProf}, "pprof", "serve /debug/pprof/ on a listener of its own: -pprof on "+DefaultPProfAddr+" (loopback only), -pprof=ADDR:PORT on that address")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "validate the configuration, print it and exit")
	fs.BoolVar(&c.Cleanup, "cleanup", false, "remove what instances with these flags left on this node (rules of any version, the fallback, the link's addresses, the link if they made it) and exit; refused while one serves")
	registerStock(fs, c, &r.stock) // drop-in: the stock image's flags
	// autopath (issue 15)
	fs.BoolVar(&c.Autopath.Enabled, "autopath", false, "answer pods' search-path queries in one round trip (watches this node's pods through the API server; docs/autopath.md)")
	fs.StringVar(&c.Autopath.NodeName, "node-name", env("NODE_NAME"), "this node's name, for -autopath's pod watch and -node-condition (default $NODE_NAME)")
	fs.StringVar(&c.Autopath.NodeResolvConf, "autopath-node-resolv-conf", "", "the resolv.conf the kubelet gives pods (its --resolv-conf), for their search domains (default: -resolv-conf)")
	r.node = registerNode(fs, c) // issue 40: node listener, external names, node status
}

// checkFlags checks the addresses, ports, modes and paths the flags give;
// kubeErr is a kube-dns address that could not be found, which a Corefile
// may still name.
func (c *Config) checkFlags(r *rawFlags, set map[string]bool, env Env) (kubeErr, err error) {
	if c.LocalIPs, err = parseIPs(r.localIP); err != nil {
		return nil, usage("-localip: %v", err)
	}
	// 0 is not a port clients can be given (and the rules would name 53).
	if c.Port < 1 || c.Port > 65535 {
		return nil, usage("-port: %d is not a port", c.Port)
	}
	if c.HealthPort < 0 || c.HealthPort > 65535 {
		return nil, usage("-health-port: %d is not a port", c.HealthPort)
	}
	if c.ClusterDomain, err = normalizeDomain(r.clusterDomain); err != nil {
		return nil, usage("-cluster-domain: %v", err)
	}
	if c.LocalMode {
		if r.kubeDNS != "" {
			return nil, usage("-local-mode and -kube-dns exclude each other")
		}
		if !set["setupinterface"] {
			c.SetupInterface = false
		}
		if !set["setupiptables"] {
			c.SetupIPTables = false
		}
		if !set["state-dir"] {
			c.StateDir = "" // no node to share: no twins
		}
	} else {
		if c.KubeDNS, c.KubeDNSSource, err = kubeDNSAddr(r.kubeDNS, r.upstreamSvc, env); err != nil && !r.stock.corefileMode(set) && !c.Cleanup {
			return nil, err // -cleanup asks kube-dns nothing
		} else if err != nil {
			kubeErr = err // drop-in: the Corefile may name the cluster DNS
		}
		// The classic mistake in iptables mode: serving the kube-dns
		// ClusterIP and forwarding to it. Our NOTRACK rules deliver those
		// packets to us, kube-proxy's DNAT skipped: every cluster query loops.
		if int(c.KubeDNS.Port()) == c.Port && contains(c.LocalIPs, c.KubeDNS.Addr()) {
			return nil, usage("kube-dns %s (from %s) is one of our own listen addresses (-localip): forwarding there loops; "+
				"forward to a second Service in front of the kube-dns pods (-upstreamsvc kube-dns-upstream, deploy/daemonset.yaml)", c.KubeDNS, c.KubeDNSSource)
		}
	}
	if c.HealthAddr == "" && c.HealthPort > 0 {
		c.HealthAddr = netip.AddrPortFrom(c.LocalIPs[0], uint16(c.HealthPort)).String()
	} else if _, _, err := splitHostPort(c.HealthAddr); c.HealthAddr != "" && err != nil {
		return nil, usage("-health-listen-address: %q is not HOST:PORT", c.HealthAddr)
	}
	if c.LameDuck < 0 || c.LameDuck > time.Minute {
		return nil, usage("-lameduck: %v is not between 0 and 1m", c.LameDuck)
	}
	if c.SocketUID < -1 || c.SocketUID > 1<<32-2 {
		return nil, usage("-socket-uid: %d is not a UID (0 to 4294967294, or -1 for the process's own)", c.SocketUID)
	}
	if c.StateDir != "" && !strings.HasPrefix(c.StateDir, "/") {
		return nil, usage("-state-dir: %q is not an absolute path", c.StateDir)
	}
	if c.MetricsAddr == "" {
		c.MetricsAddr = netip.AddrPortFrom(c.LocalIPs[0], 9253).String()
	} else if _, err := netip.ParseAddrPort(c.MetricsAddr); err != nil {
		if _, _, err2 := splitHostPort(c.MetricsAddr); err2 != nil {
			return nil, usage("-metrics-listen-address: %q is not HOST:PORT", c.MetricsAddr)
		}
	}
	if c.SyncInterval <= 0 {
		return nil, usage("-syncinterval: must be positive, got %v", c.SyncInterval)
	}
	switch c.IPTablesMode {
	case "auto", "legacy", "nft":
	default:
		return nil, usage("-iptables-mode: %q is not auto, legacy or nft", c.IPTablesMode)
	}
	if c.FallbackAfter < 0 || c.FallbackAfter > time.Minute || c.FallbackAfter%time.Second != 0 {
		return nil, usage("-fallback-after: %v is not whole seconds between 0 and 1m", c.FallbackAfter)
	}
	if c.Teardown != "auto" && c.Teardown != "always" {
		return nil, usage("-teardown: %q is not auto or always", c.Teardown)
	}
	if c.InterfaceName == "" || len(c.InterfaceName) > 15 || strings.ContainsAny(c.InterfaceName, "/ \t") {
		return nil, usage("-interfacename: %q is not a valid interface name (1-15 characters, no '/' or spaces)", c.InterfaceName)
	}
	return kubeErr, nil
}

// checkSizes checks the cache's, the sockets' and the timeouts' flags.
func (c *Config) checkSizes(r *rawFlags) error {
	var err error
	if err := c.Cache.validate(); err != nil {
		return err
	}
	if c.Cache.LastKnownGood, err = parseZones(r.lastKnownGood); err != nil {
		return usage("-last-known-good: %v", err)
	}
	if len(c.Cache.LastKnownGood) > 0 && c.Cache.StaleWindow == 0 {
		return usage("-last-known-good needs -serve-stale (the window bounds how long a last good answer is kept)")
	}
	if c.Cache.MaxBytes, err = parseBytes(r.maxBytes); err != nil {
		return usage("-cache-max-bytes: %v", err)
	}
	if c.UDPSockets < 0 || c.UDPSockets > 256 {
		return usage("-udp-sockets: %d is not between 0 and 256", c.UDPSockets)
	}
	if c.UDPSockets == 0 {
		c.UDPSockets = runtime.GOMAXPROCS(0)
	}
	if c.MaxUDPSize < 512 || c.MaxUDPSize > 65535 {
		return usage("-max-udp-size: %d is not between 512 and 65535", c.MaxUDPSize)
	}
	if c.MaxClientUDPSize < 512 || c.MaxClientUDPSize > 65535 {
		return usage("-max-client-udp-size: %d is not between 512 and 65535", c.MaxClientUDPSize)
	}
	if c.MaxInflight <= 0 || c.MaxTCPConns <= 0 || c.TCPPoolSize <= 0 {
		return usage("-max-inflight, -max-tcp-conns and -tcp-pool-size must be positive")
	}
	if c.TCPIdleTimeout <= 0 || c.ForwardTimeout <= 0 {
		return usage("-tcp-idle-timeout and -forward-timeout must be positive")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return usage("-log-format: %q is not text or json", c.LogFormat)
	}
	if c.Autopath.NodeResolvConf == "" {
		c.Autopath.NodeResolvConf = c.ResolvConf
	}
	if c.Autopath.Enabled {
		if c.LocalMode {
			return usage("-autopath needs a cluster: it does not work with -local-mode")
		}
		if c.Autopath.NodeName == "" {
			return usage("-autopath: no node name: set -node-name or $NODE_NAME (downward API, spec.nodeName)")
		}
	}
	return nil
}

// finish applies what depends on the rest: the default ConfigMap
// directory, the Corefile (drop-in: -conf), kube-dns' Service, resolv.conf.
func (c *Config) finish(r *rawFlags, set map[string]bool, env Env, kubeErr error) error {
	var err error
	if !set["kubednscm"] {
		if st, err := os.Stat(DefaultKubeDNSConfigMap); err == nil && st.IsDir() {
			c.KubeDNSConfigMap = DefaultKubeDNSConfigMap
		}
	}
	if err := c.applyCorefile(&r.stock, set, r.localIP, env); err != nil { // drop-in: -conf
		return err
	}
	if kubeErr != nil && !c.KubeDNS.IsValid() && !c.Cleanup {
		return kubeErr
	}
	if !c.LocalMode && r.upstreamSvc != "" {
		// The kubelet sets $NAME_SERVICE_HOST to the Service's ClusterIP in the pod's
		// namespace: kube-dns' address is that Service's when they are equal.
		host := env(strings.ToUpper(strings.ReplaceAll(r.upstreamSvc, "-", "_")) + "_SERVICE_HOST")
		if a, err := netip.ParseAddr(host); err == nil && a.Unmap() == c.KubeDNS.Addr() {
			c.KubeDNSService = r.upstreamSvc
		}
	}
	if err := c.finishNode(r.node, set, r.stock.corefileMode(set)); err != nil {
		return err
	}
	if c.ResolvConf != "" {
		if c.Nameservers, err = LoadResolvConf(c.ResolvConf, c.OwnAddrs(), c.Port); err != nil {
			return fmt.Errorf("%w: -resolv-conf: %v", ErrUsage, err)
		}
	}
	return nil
}

func (cc *CacheConfig) validate() error {
	if cc.SuccessCapacity <= 0 || cc.DenialCapacity <= 0 {
		return usage("-success-capacity and -denial-capacity must be positive")
	}
	for name, d := range map[string]time.Duration{
		"-cluster-success-ttl": cc.ClusterSuccessTTL, "-cluster-denial-ttl": cc.ClusterDenialTTL,
		"-success-ttl": cc.SuccessTTL, "-denial-ttl": cc.DenialTTL,
	} {
		if d <= 0 {
			return usage("%s: must be positive, got %v", name, d)
		}
		if d < cc.MinTTL {
			return usage("%s: %v is below -min-ttl %v", name, d, cc.MinTTL)
		}
	}
	if cc.StaleWindow < 0 || cc.StaleClientTimeout <= 0 || cc.StaleRecheck <= 0 {
		return usage("-serve-stale must not be negative; -stale-client-timeout and -stale-recheck must be positive")
	}
	if cc.PrefetchHits < 0 {
		return usage("-prefetch: must not be negative, got %d", cc.PrefetchHits)
	}
	if cc.MinTTL < 0 {
		return usage("-min-ttl: must not be negative")
	}
	// SERVFAIL must never outlive an upstream blip by much.
	if cc.ServFailTTL < 0 || cc.ServFailTTL > 5*time.Second {
		return usage("-servfail-ttl: %v is not between 0 and 5s", cc.ServFailTTL)
	}
	if cc.SnapshotInterval != 0 && (cc.SnapshotInterval < time.Second || cc.SnapshotInterval > time.Hour) {
		return usage("-cache-snapshot-interval: %v is not 0 (off) or between 1s and 1h", cc.SnapshotInterval)
	}
	if cc.SnapshotDir != "" && !strings.HasPrefix(cc.SnapshotDir, "/") {
		return usage("-cache-snapshot-dir: %q is not an absolute path", cc.SnapshotDir)
	}
	return nil
}

// DefaultSnapshotMaxBytes is -cache-snapshot-max-bytes' default: about
// 60,000 answers of one or two records (~125 bytes each), three times the
// default capacities. On the default state directory (a tmpfs) the file is
// memory charged to the pod, twice that while a new one replaces it.
const DefaultSnapshotMaxBytes = 8 << 20

// registerSnapshotFlags adds the cache snapshot's flags (docs/design.md,
// "Warm after a crash").
func registerSnapshotFlags(fs *flag.FlagSet, cc *CacheConfig) {
	fs.DurationVar(&cc.SnapshotInterval, "cache-snapshot-interval", 5*time.Second,
		"how often the cache is written to -state-dir when it changed (and at exit), so a start after a crash loads it; 0 turns it off (nothing written or loaded)")
	cc.SnapshotMaxBytes = DefaultSnapshotMaxBytes
	fs.Var(bytesFlag{&cc.SnapshotMaxBytes}, "cache-snapshot-max-bytes", "bound on the cache snapshot file (bytes; suffixes Ki, Mi, Gi): the most recently used answers of every part of the cache that fit")
	fs.StringVar(&cc.SnapshotDir, "cache-snapshot-dir", "", "directory of the cache snapshot, private to this instance (a pod's emptyDir: a pod that mounts the shared -state-dir must not read every cached name); \"\": -state-dir's directory for these addresses")
}

// bytesFlag is a byte count flag (parseBytes: at least 1Mi).
type bytesFlag struct{ n *int64 }

func (f bytesFlag) String() string {
	if f.n == nil {
		return ""
	}
	switch n := *f.n; {
	case n > 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "Mi"
	default:
		return strconv.FormatInt(n, 10)
	}
}

func (f bytesFlag) Set(v string) error {
	n, err := parseBytes(v)
	if err == nil && n == 0 {
		err = fmt.Errorf("0 holds nothing (-cache-snapshot-interval=0 turns the snapshot off)")
	}
	if err != nil {
		return err
	}
	*f.n = n
	return nil
}

func usage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

func parseIPs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address", f)
		}
		a = a.Unmap()
		if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("%q cannot be a listen address (unspecified, multicast or zoned)", f)
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("at least one address is required")
	}
	return out, nil
}

// kubeDNSAddr resolves the kube-dns address: -kube-dns wins; else the
// Service's NAME_SERVICE_HOST (and NAME_SERVICE_PORT) set by the kubelet.
func kubeDNSAddr(explicit, svc string, env Env) (netip.AddrPort, string, error) {
	if explicit != "" {
		ap, err := ParseServer(explicit)
		if err != nil {
			return netip.AddrPort{}, "", usage("-kube-dns: %v", err)
		}
		return ap, "-kube-dns", nil
	}
	if svc == "" {
		return netip.AddrPort{}, "", usage("no kube-dns address: set -kube-dns IP[:port] or -upstreamsvc NAME, or run with -local-mode")
	}
	name := strings.ToUpper(strings.ReplaceAll(svc, "-", "_")) + "_SERVICE_HOST"
	host := env(name)
	if host == "" {
		return netip.AddrPort{}, "", usage("no kube-dns address: $%s is not set (is -upstreamsvc %q the name of a Service?); set -kube-dns IP[:port] or use -local-mode", name, svc)
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, "", usage("$%s=%q is not an IP address", name, host)
	}
	port := 53
	portVar := strings.TrimSuffix(name, "_HOST") + "_PORT"
	if p := env(portVar); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port <= 0 || port > 65535 {
			return netip.AddrPort{}, "", usage("$%s=%q is not a port", portVar, p)
		}
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), "$" + name, nil
}

// ParseServer parses "IP" or "IP:port" or "[IPv6]:port" with port 53 as
// the default.
func ParseServer(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return netip.AddrPort{}, fmt.Errorf("%q: port 0", s)
		}
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil || a.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q is not IP[:port]", s)
	}
	return netip.AddrPortFrom(a.Unmap(), 53), nil
}

// parseZones reads a comma-separated list of zones ("." for the root) as
// sorted, distinct, lower-case FQDNs.
func parseZones(s string) ([]string, error) {
	var out []string
	for _, z := range strings.Split(s, ",") {
		z = strings.TrimSpace(z)
		if z == "" {
			continue
		}
		if z != "." {
			var err error
			if z, err = normalizeDomain(z); err != nil {
				return nil, err
			}
		}
		if !slices.Contains(out, z) {
			out = append(out, z)
		}
	}
	slices.Sort(out)
	return out, nil
}

func normalizeDomain(d string) (string, error) {
	d = strings.ToLower(strings.TrimSpace(d))
	if d == "" || d == "." {
		return "", errors.New("empty domain")
	}
	if !strings.HasSuffix(d, ".") {
		d += "."
	}
	for _, l := range strings.Split(strings.TrimSuffix(d, "."), ".") {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("%q is not a domain name", d)
		}
	}
	return d, nil
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", 0, errors.New("no port")
	}
	p, err := strconv.Atoi(s[i+1:])
	if err != nil || p < 0 || p > 65535 {
		return "", 0, errors.New("bad port")
	}
	return s[:i], p, nil
}

func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a byte count", s)
	}
	if n > 0 && n*mult < 1<<20 {
		return 0, fmt.Errorf("%d bytes is below the 1Mi minimum", n*mult)
	}
	return n * mult, nil
}

// Getenv is the production Env.
func Getenv(k string) string { return os.Getenv(k) }

// DefaultPProfAddr is where -pprof serves /debug/pprof/ without an address:
// loopback, so no pod on the node can read the daemon's memory or profile
// it (the metrics port is reachable from every pod).
const DefaultPProfAddr = "127.0.0.1:6053"

// pprofFlag is -pprof: a boolean (DefaultPProfAddr, or off) that also
// takes an address.
type pprofFlag struct{ addr *string }

func (f pprofFlag) IsBoolFlag() bool { return true }

func (f pprofFlag) String() string {
	if f.addr == nil {
		return ""
	}
	return *f.addr
}

func (f pprofFlag) Set(v string) error {
	switch v {
	case "true", "1", "t", "T", "TRUE", "True":
		*f.addr = DefaultPProfAddr
	case "false", "0", "f", "F", "FALSE", "False", "":
		*f.addr = ""
	default:
		if _, _, err := net.SplitHostPort(v); err != nil {
			return fmt.Errorf("want true, false or HOST:PORT: %v", err)
		}
		*f.addr = v
	}
	return nil
}

// Sockets are the DNS listen sockets' addresses and ports: Listen, or
// every LocalIPs on Port, then the node listener's addresses on Port.
func (c *Config) Sockets() []netip.AddrPort {
	if c.Listen != nil {
		return c.Listen
	}
	out := make([]netip.AddrPort, len(c.LocalIPs), len(c.LocalIPs)+len(c.Node.Listen))
	for i, a := range c.LocalIPs {
		out[i] = netip.AddrPortFrom(a, uint16(c.Port))
	}
	return append(out, c.NodeListenSockets()...) // the node listener's last (running: its view)
}

// ExtraPorts are the DNS ports besides Port that Sockets listen on, in
// order.
func (c *Config) ExtraPorts() []int {
	var out []int
	for _, ap := range c.Listen {
		if p := int(ap.Port()); p != c.Port && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}
