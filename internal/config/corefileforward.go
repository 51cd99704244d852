package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// ForwardOptions are a Corefile forward's options as our forward groups
// take them (forward.GroupConfig); zero values keep our defaults.
type ForwardOptions struct {
	MaxFails      int           // consecutive failures marking a server down; <0: never (max_fails 0)
	ProbeInterval time.Duration // health_check: first wait before probing a down server
	Spread        bool          // policy random|round_robin: queries start at each server in turn
	MaxInflight   int           // max_concurrent: queries in flight in the group (0: -max-inflight)
	IdleTimeout   time.Duration // expire: a TCP connection idle this long is closed
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

// forwardOptions maps f's options. policy random and round_robin both
// spread queries over the servers in turn (round robin: the same spread,
// deterministic); sequential is our order with failover. force_tcp picks
// TCP (TCP); prefer_udp is our UDP groups' way already (UDP, TCP when an
// answer is truncated).
func forwardOptions(f *corefile.Forward, maxInflight int) ForwardOptions {
	o := ForwardOptions{
		MaxFails:      f.MaxFails,
		ProbeInterval: f.HealthCheck,
		Spread:        f.Policy != "sequential",
		MaxInflight:   f.MaxConcurrent,
		IdleTimeout:   f.Expire,
		TCP:           f.ForceTCP,
		FailFast:      f.FailFast,
		TLS:           f.UsesTLS(),
	}
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
	if o.TLS {
		tcp += fmt.Sprintf(", DNS over TLS (server name %q)", o.TLSServerName)
	}
	return fmt.Sprintf("max_fails %s, probe every %v, %s, at most %d in flight, TCP idle %v%s",
		fails, o.ProbeInterval, map[bool]string{true: "queries spread over the servers in turn", false: "servers asked in order (sequential)"}[o.Spread], o.MaxInflight, o.IdleTimeout, tcp)
}
