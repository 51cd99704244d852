package corefile

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/registry"
)

// Directives beyond the block's structure register how they are read:
// each directive's package (template, hosts, rewrite, dns64, log,
// loadbalance, whoami, trace, dnstap, acl, ...) reads its own lines into
// its own configuration, beside the code that runs it, and registers
// that reading here from an init function (internal/plugins lists them
// once); its handler registers with internal/directive or
// internal/answer. The Corefile package itself reads only what makes a
// block a server: where it listens (bind, and the keys), how it caches
// and forwards, its health, metrics and timeouts (directives.go,
// cacheforward.go).

// Spec is how one directive is read.
type Spec struct {
	// Parse reads one line of the directive (d, with its block, if any)
	// into the block's configuration of it: cfg is what the block's
	// earlier lines of it gave (nil for the first), the result replaces
	// it. s is the block as read so far (its zones: a directive whose
	// zones default to the block's). Errors come from Bad and BadOpt.
	Parse func(s *Server, d *Directive, cfg any) (any, error)
	// Check, if set, runs once the whole block is read, with the
	// directive's configuration: it may refuse the directive beside
	// others, or change its configuration (whoami's: it answers nothing
	// when a forward answers every name first).
	Check func(s *Server, cfg any) (any, error)
	// Repeatable: may appear more than once in a block.
	Repeatable bool
	// Forms is what we support, for errors.
	Forms string
	// Distinct, with MaxDistinct, bounds the distinct configurations of
	// the directive in one Corefile (each a resource of its own, what
	// DistinctCost says: a collector's connection, an exporter): the keys
	// of cfg's.
	Distinct     func(cfg any) []string
	MaxDistinct  int
	DistinctCost string
	// Describe says, for -check-config, how the block's configuration of
	// the directive runs (one line each); Notes what an operator should
	// know of it (a line each, said once, as flags that lose to the
	// Corefile are).
	Describe func(s *Server, cfg any) []string
	Notes    func(s *Server, cfg any) []string
	// UsesClient reports whether cfg needs each query's client address on
	// the fetch side (a template's .Remote, a rewrite of the client's
	// subnet): the server then records it.
	UsesClient func(cfg any) bool
	// Dials lists the network addresses cfg sends to (a dnstap
	// collector's): the daemon refuses one that is its own DNS listen
	// socket, where what it sends would come back as queries.
	Dials func(cfg any) []Dial
}

// Dial is an address a directive's configuration sends to (Spec.Dials).
type Dial struct {
	Addr netip.AddrPort
	// What is the destination as written ("dnstap tcp://10.0.0.1:6000");
	// Why what sending there would do were it one of our DNS sockets.
	What, Why string
}

var specs = registry.New[Spec]("corefile")

// Register makes spec how the directive name is read. It panics when name
// is registered twice, or is one of the block's own directives (a
// programming error, found at start).
func Register(name string, spec Spec) {
	if _, own := directiveTable[name]; own {
		panic(fmt.Sprintf("corefile: %q is a block's own directive", name))
	}
	if spec.Parse == nil {
		panic(fmt.Sprintf("corefile: %q registered without Parse", name))
	}
	specs.Register(name, spec)
}

// registered returns the spec of the directive name.
func registered(name string) (Spec, bool) { return specs.Get(name) }

// forms is what we support of the directive name, for errors.
func forms(name string) string {
	if s, ok := registered(name); ok {
		return s.Forms
	}
	return directiveTable[name].forms
}

// ErrorAt is an error at p (file:line first).
func ErrorAt(p Pos, format string, a ...any) error { return errAt(p, format, a...) }

// Bad is a directive's error: file:line, directive, problem, what we
// support.
func Bad(d *Directive, format string, a ...any) error {
	return errAt(d.Pos, "%s: %s; supported: %s", d.Name, fmt.Sprintf(format, a...), forms(d.Name))
}

// BadOpt is the error of option o of directive d, at o's line.
func BadOpt(d, o *Directive, format string, a ...any) error {
	return errAt(o.Pos, "%s: %s; supported: %s", d.Name, fmt.Sprintf(format, a...), forms(d.Name))
}

// NoBlock refuses a block after a directive that takes none.
func NoBlock(d *Directive) error {
	if d.HasBlock && len(d.Block) > 0 {
		return BadOpt(d, d.Block[0], "option %s is not supported", d.Block[0].Name)
	}
	return nil
}

// NormalizeZone is a zone as written (any case, with or without the final
// dot) as a lower-case FQDN, "." for the root; an error for what is not a
// domain name.
func NormalizeZone(z string) (string, error) { return normalizeZone(z) }

// ZonesOf returns args (option o's of directive d) as lower-case FQDNs,
// or the block's zones when there are none; a zone that is no domain
// name is skipped and recorded (zoneList).
func ZonesOf(s *Server, d, o *Directive, args []Token) ([]string, error) {
	if len(args) == 0 {
		return append([]string(nil), s.Zones...), nil
	}
	return zoneList(s, d, args), nil
}

// FallthroughZones reads `fallthrough [ZONE...]`: "." without zones.
func FallthroughZones(s *Server, d, o *Directive) ([]string, error) {
	if len(o.Args) == 0 {
		return []string{"."}, nil
	}
	return ZonesOf(s, d, o, o.Args)
}

// Config is the configuration of the registered directive name in s (what
// its Parse and Check gave, what its handler's setup reads); nil when the
// block does not have it.
func (s *Server) Config(name string) any { return s.Directives[name] }

// Has reports whether the block has the directive name (as loaded).
func (s *Server) Has(name string) bool {
	for _, p := range s.Plugins {
		if p.Name == name {
			return true
		}
	}
	return false
}

// UsesClient reports whether a directive of one of servers needs each
// query's client address on the fetch side (Spec.UsesClient).
func UsesClient(servers []*Server) bool {
	for _, s := range servers {
		for name, cfg := range s.Directives {
			if sp, ok := registered(name); ok && sp.UsesClient != nil && sp.UsesClient(cfg) {
				return true
			}
		}
	}
	return false
}

// Describe says how the registered directives of s run, for -check-config
// (Spec.Describe), in plugin.cfg order.
func (s *Server) Describe() []string {
	var out []string
	s.eachSpec(func(sp Spec, cfg any) {
		if sp.Describe != nil {
			out = append(out, sp.Describe(s, cfg)...)
		}
	})
	return out
}

// eachSpec calls f with the Spec and configuration of each registered
// directive of s, once, in plugin.cfg order.
func (s *Server) eachSpec(f func(sp Spec, cfg any)) {
	seen := map[string]bool{}
	for _, p := range s.Plugins {
		sp, ok := registered(p.Name)
		if !ok || seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		f(sp, s.Directives[p.Name])
	}
}

// Dials are the addresses the block's registered directives send to
// (Spec.Dials).
func (s *Server) Dials() []Dial {
	var out []Dial
	s.eachSpec(func(sp Spec, cfg any) {
		if sp.Dials != nil {
			out = append(out, sp.Dials(cfg)...)
		}
	})
	return out
}

// FetchSideLines are -check-config's lines of a fetch-side directive:
// each of s's lines of name, as written, and how it runs (why).
func FetchSideLines(s *Server, name, why string) []string {
	var out []string
	for _, p := range s.Plugins {
		if p.Name == name {
			out = append(out, strings.TrimSpace(p.Name+" "+strings.Join(p.Args, " "))+": "+why)
		}
	}
	return out
}

// Notes are what the registered directives of s say an operator should
// know (Spec.Notes), in plugin.cfg order.
func (s *Server) Notes() []string {
	var out []string
	s.eachSpec(func(sp Spec, cfg any) {
		if sp.Notes != nil {
			out = append(out, sp.Notes(s, cfg)...)
		}
	})
	return out
}

// checkDistinct refuses a Corefile with more distinct configurations of a
// directive than it allows (Spec.MaxDistinct).
func checkDistinct(servers []*Server) error {
	keys := map[string]map[string]bool{}
	for _, s := range servers {
		for name, cfg := range s.Directives {
			sp, ok := registered(name)
			if !ok || sp.Distinct == nil {
				continue
			}
			if keys[name] == nil {
				keys[name] = map[string]bool{}
			}
			for _, k := range sp.Distinct(cfg) {
				keys[name][k] = true
			}
			if len(keys[name]) > sp.MaxDistinct {
				return errAt(s.Pos, "%s: more than %d distinct %s directives in the Corefile (each %s)", name, sp.MaxDistinct, name, sp.DistinctCost)
			}
		}
	}
	return nil
}
