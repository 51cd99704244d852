// Package directive is what the Corefile's fetch-side directives (template,
// hosts, rewrite, dns64: those CoreDNS's plugin.cfg puts behind the cache,
// or that we run there) have in common: one handler interface, and a
// registry of how each is set up from its block's configuration.
//
// A directive's package registers itself (Register, from an init
// function); the daemon builds a block's chain as one loop over the block's
// directives in plugin.cfg order, wrapping each registered one around the
// rest. Adding a directive touches its own package (its parsing registered
// with corefile.Register beside its runtime registered here) and one line
// in internal/plugins. CoreDNS's plugin.Register is the model: a name and
// a setup function, looked up by the name the Corefile uses. The
// answer-side directives (log, dnstap, ...) register with internal/answer
// instead.
package directive

import (
	"context"
	"log/slog"
	"net/netip"
	"sync/atomic"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/registry"
)

// Next is the rest of a block's chain, after a directive: the directives
// behind it, ending in the block's forward.
type Next func(ctx context.Context, r *dns.Msg) (*dns.Msg, error)

// Lookup resolves a name through the block's own chain, as CoreDNS's
// plugins ask their server (a template's CNAME target, dns64's A query).
type Lookup func(ctx context.Context, name string, qtype uint16) (*dns.Msg, error)

// Handler is one directive of one block, set up. Serve answers r, or
// passes it (maybe changed) to next and returns (maybe changed) what next
// answers. It is called concurrently.
type Handler interface {
	Serve(ctx context.Context, r *dns.Msg, next Next) (*dns.Msg, error)
}

// Env is what a setup may use besides the directive's configuration.
type Env struct {
	Clock clock.Clock
	// Log is the block's logger, with the directive's name.
	Log *slog.Logger
	// Lookup resolves names through the block's chain.
	Lookup Lookup
	// Asker returns the client a fetch asks for (resolve.Asker).
	Asker func(ctx context.Context) netip.Addr
	// Metrics feeds CoreDNS's per-directive series; nil: not counted.
	Metrics Metrics
}

// Metrics gives a directive the counters behind CoreDNS's series for it
// (internal/metrics' Directives, adapted by the daemon). Each returns the
// same counters for the same labels, so a rebuilt handler counts on.
type Metrics interface {
	// Hosts: coredns_hosts_entries and
	// coredns_hosts_reload_timestamp_seconds of file, and its lines
	// skipped (nodelocaldns_config_skipped_entries).
	Hosts(file string) (entries, reloadUnix, skipped *atomic.Int64)
	// Template: coredns_template_matches_total,
	// coredns_template_template_failures_total and
	// coredns_template_rr_failures_total of (zone, class, type).
	Template(zone, class, typ string) (match func(), failure, rrFailure func(section, template string))
	// DNS64: coredns_dns64_requests_translated_total.
	DNS64() *atomic.Uint64
}

// Setup builds a block's handler from cfg, the value corefile.Server.Config
// returns for the directive's name.
type Setup func(env Env, cfg any) (Handler, error)

var registered = registry.New[Setup]("directive")

// Register makes setup the fetch-side handler of the directive name. It
// panics when name is registered twice (a programming error, found at
// start).
func Register(name string, setup Setup) { registered.Register(name, setup) }

// Registered returns the setup of the directive name; false: name has no
// fetch-side handler (cache, forward, bind, ... are done elsewhere).
func Registered(name string) (Setup, bool) { return registered.Get(name) }

// Names are the registered directives, sorted.
func Names() []string { return registered.Names() }
