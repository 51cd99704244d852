package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// ForwardOptions are a Corefile forward's options as our forward groups
// take them (forward.GroupConfig); zero values keep our defaults.
type ForwardOptions struct {
	MaxFails      int           // consecutive failures marking a server down; <0: never (max_fails 0)
	ProbeInterval time.Duration // health_check: first wait before probing a down server
	ProbeName     string        // health_check's domain: the name probed ("": the root)
	// TLSServerNames are the tls://IP%NAME targets' own server names, as
	// "ADDR%NAME" separated by spaces (comparable: a reload compares
	// options); ServerNames maps them.
	TLSServerNames string
	// Failover is failover's rcodes (1<<rcode each); MaxTries
	// max_connect_attempts (0: the walk's two passes).
	Failover uint16
	MaxTries int
	// Refuse: max_concurrent was given; past it the client gets REFUSED,
	// as CoreDNS's (past -max-inflight alone, SERVFAIL).
	Refuse      bool
	Spread      bool          // policy random|round_robin: queries start at each server in turn
	MaxInflight int           // max_concurrent: queries in flight in the group (0: -max-inflight)
	IdleTimeout time.Duration // expire: a TCP connection idle this long is closed
	// TCP is force_tcp: the group asks over TCP (read by the node group,
	// which is UDP otherwise; a zone route reads ZoneRoute.ForceTCP, the
	// kube-dns group is always TCP).
	TCP bool
	// FailFast: SERVFAIL at once when every server is down
	// (failfast_all_unhealthy_upstreams).
	FailFast bool
	// TLS: the servers are tls:// ones, asked over DNS over TLS with the
	// tls option's files (TLSCert and TLSKey: a client certificate;
	// TLSCA: the CA verifying the servers, "" the system's) and
	// tls_servername (TLSServerName).
	TLS                                   bool
	TLSCert, TLSKey, TLSCA, TLSServerName string
	// Plain are the plain targets of a TLS forward (tls:// and plain
	// mixed), separated by spaces (comparable); PlainServers maps them.
	Plain string
}

// PlainServers are the plain servers of a TLS group (forward.GroupConfig's
// Plain); nil: none.
func (o *ForwardOptions) PlainServers() map[netip.AddrPort]bool {
	if o.Plain == "" {
		return nil
	}
	m := map[netip.AddrPort]bool{}
	for _, f := range strings.Fields(o.Plain) {
		if ap, err := netip.ParseAddrPort(f); err == nil {
			m[ap] = true
		}
	}
	return m
}

// TLSConfig is the client configuration of a TLS group, as CoreDNS's
// forward builds it from tls and tls_servername; nil when o is not TLS.
func (o *ForwardOptions) TLSConfig() (*tls.Config, error) {
	if o == nil || !o.TLS {
		return nil, nil
	}
	c := &tls.Config{ServerName: o.TLSServerName, MinVersion: tls.VersionTLS12}
	if o.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("forward tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("forward tls: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("forward tls: %s holds no PEM certificate", o.TLSCA)
		}
	}
	return c, nil
}

// ServerNames are the TLS server names of single servers (tls://IP%NAME);
// nil: none.
func (o *ForwardOptions) ServerNames() map[netip.AddrPort]string {
	if o.TLSServerNames == "" {
		return nil
	}
	m := map[netip.AddrPort]string{}
	for _, f := range strings.Fields(o.TLSServerNames) {
		a, n, _ := strings.Cut(f, "%")
		if ap, err := netip.ParseAddrPort(a); err == nil {
			m[ap] = n
		}
	}
	return m
}

// forwardOptions maps f's options. policy random and round_robin both
// spread queries over the servers in turn (round robin: the same spread,
// deterministic); sequential is our order with failover. force_tcp picks
// TCP (TCP); prefer_udp is our UDP groups' way already (UDP, TCP when an
// answer is truncated).
func forwardOptions(f *corefile.Forward, maxInflight int) ForwardOptions {
	o := ForwardOptions{
		MaxFails:      f.MaxFails,
		ProbeInterval: f.HealthCheck,
		ProbeName:     f.HealthDomain,
		Refuse:        f.MaxConcurrent > 0,
		Failover:      f.Failover,
		MaxTries:      f.MaxConnectAttempts,
		Spread:        f.Policy != "sequential",
		MaxInflight:   f.MaxConcurrent,
		IdleTimeout:   f.Expire,
		TCP:           f.ForceTCP,
		FailFast:      f.FailFast,
		TLS:           f.UsesTLS(),
	}
	var names, plain []string
	for _, u := range f.To {
		if u.TLS && u.ServerName != "" {
			names = append(names, u.Addr.String()+"%"+u.ServerName)
		}
		if o.TLS && !u.TLS {
			plain = append(plain, u.Addr.String())
		}
	}
	o.TLSServerNames, o.Plain = strings.Join(names, " "), strings.Join(plain, " ")
	if t := f.TLS; t != nil && o.TLS {
		o.TLSCert, o.TLSKey, o.TLSCA, o.TLSServerName = t.Cert, t.Key, t.CA, t.ServerName
	}
	if o.MaxFails == 0 {
		o.MaxFails = -1 // CoreDNS: 0 never marks a server down
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = maxInflight
	}
	return o
}

func (o ForwardOptions) String() string {
	fails := fmt.Sprint(o.MaxFails)
	if o.MaxFails < 0 {
		fails = "never down"
	}
	tcp := ""
	if o.TCP {
		tcp = ", force_tcp"
	}
	if o.FailFast {
		tcp += ", failfast_all_unhealthy_upstreams"
	}
	if o.Failover != 0 {
		var rcs []string
		for rc := range 16 {
			if o.Failover&(1<<rc) != 0 {
				rcs = append(rcs, dns.RcodeToString[rc])
			}
		}
		tcp += fmt.Sprintf(", failover on %s too", strings.Join(rcs, " "))
	}
	if o.MaxTries > 0 {
		tcp += fmt.Sprintf(", at most %d tries a query", o.MaxTries)
	}
	if o.ProbeName != "" {
		tcp += fmt.Sprintf(", probing %s IN NS", o.ProbeName)
	}
	if o.TLS {
		tcp += fmt.Sprintf(", DNS over TLS (server name %q)", o.TLSServerName)
		if o.TLSServerNames != "" {
			tcp += fmt.Sprintf(", per server %s", o.TLSServerNames)
		}
		if o.Plain != "" {
			how := "UDP"
			if o.TCP {
				how = "TCP"
			}
			tcp += fmt.Sprintf(", plain DNS over %s to %s", how, o.Plain)
		}
	}
	return fmt.Sprintf("max_fails %s, probe every %v, %s, at most %d in flight, TCP idle %v%s",
		fails, o.ProbeInterval, map[bool]string{true: "queries spread over the servers in turn", false: "servers asked in order (sequential)"}[o.Spread], o.MaxInflight, o.IdleTimeout, tcp)
}

// ForwardLink is a further forward of a block (corefile.Server's
// MoreForwards): the group it asks, its own (Route's servers, transport
// and options; a resolv.conf read when the Corefile is loaded), also when
// its targets are kube-dns (Kube: then over TCP, as the kube-dns group).
type ForwardLink struct {
	Route ZoneRoute
	Kube  bool
}

// forwardLinks maps the further forwards of s (kube: is a forward's
// targets all kube-dns).
func (c *Config) forwardLinks(s *corefile.Server, kube func(*corefile.Forward) bool) ([]ForwardLink, error) {
	var out []ForwardLink
	for _, f := range s.MoreForwards {
		ns, err := c.resolve(s, f)
		if err != nil {
			return nil, err
		}
		o := forwardOptions(f, c.MaxInflight)
		if _, err := o.TLSConfig(); err != nil {
			return nil, usage("%s: %v", s.Pos, err)
		}
		l := ForwardLink{Kube: kube(f), Route: ZoneRoute{Zone: f.From, Servers: ns, ForceTCP: f.ForceTCP, Opts: o, From: s.Pos.String()}}
		if l.Kube {
			l.Route.ForceTCP = true
		}
		out = append(out, l)
	}
	return out, nil
}
