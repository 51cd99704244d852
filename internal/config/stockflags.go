package config

import (
	"flag"
	"fmt"
	"net/netip"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// DropIn is what the stock image's flags and a Corefile add to Config:
// set by Parse, read by main (Exit, PidFile), the daemon (routes) and
// Describe (the Corefile, the notes).
type DropIn struct {
	// Exit is the output of -version or -plugins: main prints it and exits 0.
	Exit string
	// PidFile is written once serving (CoreDNS's -pidfile).
	PidFile string
	// Quiet is CoreDNS's -quiet (no start-up banner; we print none anyway).
	Quiet bool
	// ReloadWithSignal is node-cache's -reloadwithsignal: accepted; a
	// Corefile or ConfigMap change is applied by the file watch either way.
	ReloadWithSignal bool

	// Corefile mode: set when -conf (or -corefile) names a Corefile.
	Corefile *CorefileConfig
	// KubeDNSZones are the zones forwarded to KubeDNS; nil means
	// ClusterDomain and the reverse zones (the flag-only behaviour).
	KubeDNSZones []string
	// Routes are the Corefile's other forward blocks, routed like stub
	// domains (static for the daemon's life).
	Routes []ZoneRoute
	// KubeForward and NodeForward are the forward options of the blocks
	// that go to kube-dns and of the "." block (corefileforward.go).
	KubeForward, NodeForward *ForwardOptions
	// TCPReadTimeout and TCPWriteTimeout are the Corefile's timeouts read
	// and write for client TCP connections (0: the server's defaults);
	// its idle sets Config.TCPIdleTimeout.
	TCPReadTimeout, TCPWriteTimeout time.Duration
	// TCPMaxQueries is the Corefile's timeouts maxtcpqueries: a client TCP
	// connection is closed after this many queries (0 or -1: unlimited).
	TCPMaxQueries int
	// KubeDNSAlso are the cluster domain forward's other servers, after
	// KubeDNS (kubespray's coredns_dual: two kube-dns Services): the
	// kube-dns group asks them by the block's policy, with failover.
	KubeDNSAlso []netip.AddrPort
	// NodeCacheMetricsAddr is node-cache's own metrics endpoint in Corefile
	// mode (-metrics-listen-address, default 0.0.0.0:9353 as node-cache's),
	// served besides the Corefile's prometheus address; "" when it is the
	// same address or not in Corefile mode.
	NodeCacheMetricsAddr string
	// Notes say where a flag and the Corefile disagree and which won, and
	// what the Corefile says that we do another way. Logged at start and
	// printed by -check-config.
	Notes []string
}

// ZoneRoute sends a zone to its own servers (a Corefile block's forward).
type ZoneRoute struct {
	Zone     string
	Servers  []netip.AddrPort
	ForceTCP bool
	Opts     ForwardOptions // the block's forward options
	From     string         // file:line of the block, for logs
}

// stockFlags holds the stock image's flags that Parse does not define
// itself, before they are applied.
type stockFlags struct {
	conf, corefile, basecorefile string
	promListen                   string
	version, plugins             bool
	sync                         syncInterval
}

// syncInterval is node-cache's -syncinterval: a duration that node-cache
// multiplies by one second, so "1ns" means 1 s and its default (60, that is
// 60ns) means 60 s. A value of a second or more (e.g. "30s", what our
// flag always meant) is taken as it is.
type syncInterval struct{ d *time.Duration }

func (s syncInterval) String() string {
	if s.d == nil {
		return "1m0s"
	}
	return s.d.String()
}

func (s syncInterval) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	if d > 0 && d < time.Second {
		d *= time.Second // node-cache: Interval * time.Second
	}
	*s.d = d
	return nil
}

// registerStock defines the stock image's flags on fs: node-cache's own
// (those Parse lacks) and the CoreDNS ones node-local-dns manifests pass.
func registerStock(fs *flag.FlagSet, c *Config, s *stockFlags) {
	c.SyncInterval = 60 * time.Second
	s.sync = syncInterval{&c.SyncInterval}
	fs.Var(s.sync, "syncinterval", "how often interface and rules are re-asserted; as node-cache, a value below 1s is a count of seconds (1ns = 1s)")
	fs.StringVar(&s.conf, "conf", "", "Corefile to run (CoreDNS's -conf); with it the Corefile is the configuration (docs/migration.md)")
	fs.StringVar(&s.corefile, "corefile", "/etc/Corefile", "node-cache's Corefile path, used when -conf is not given and this is set")
	fs.StringVar(&s.basecorefile, "basecorefile", "/etc/coredns/Corefile.base", "node-cache's template Corefile: rendered into -conf when it exists")
	fs.StringVar(&s.promListen, "prometheus-listen-address", "", "replaces __PROMETHEUS__ENDPOINT__ in the template Corefile")
	fs.StringVar(&c.DropIn.PidFile, "pidfile", "", "write the PID here once serving (CoreDNS's -pidfile)")
	fs.IntVar(&c.Port, "dns.port", 53, "DNS port (CoreDNS's -dns.port; same as -port)")
	fs.IntVar(&c.Port, "p", 53, "DNS port (CoreDNS's -p; same as -port)")
	fs.BoolVar(&c.DropIn.Quiet, "quiet", false, "CoreDNS's -quiet: no start-up output (we print none)")
	fs.BoolVar(&s.version, "version", false, "print the version and exit")
	fs.BoolVar(&s.plugins, "plugins", false, "list the Corefile directives supported and exit")
	fs.BoolVar(&c.DropIn.ReloadWithSignal, "reloadwithsignal", false, "node-cache's: accepted; changes are applied by the file watch")
}

// Version is the module version from the build info.
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func exitText(s *stockFlags) string {
	var b strings.Builder
	if s.version {
		fmt.Fprintf(&b, "nodelocaldns-%s\ndrop-in for k8s-dns-node-cache; Corefile as CoreDNS 1.15 reads it\n", Version())
	}
	if s.plugins {
		b.WriteString("Server types:\n  dns\n\nCaddyfile loaders:\n  flag\n  default\n\nOther plugins:\n")
		for _, n := range corefile.Supported() {
			fmt.Fprintf(&b, "  dns.%s\n", n)
		}
	}
	return b.String()
}

// corefileMode reports whether a Corefile is the configuration.
func (s *stockFlags) corefileMode(set map[string]bool) bool { return s.conf != "" || set["corefile"] }
