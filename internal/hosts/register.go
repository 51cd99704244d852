package hosts

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"
)

// The hosts directive: read from the Corefile here (corefile.Register),
// run on the fetch side of the cache (directive.Register), in plugin.cfg
// order.
func init() {
	corefile.Register("hosts", corefile.Spec{
		Parse: parse,
		Forms: "hosts [FILE [ZONE...]] { ADDRESS NAME...; ttl SECONDS; no_reverse; reload DURATION; fallthrough [ZONE...]; fallthrough_unsupported }",
		Describe: func(s *corefile.Server, _ any) []string {
			return corefile.FetchSideLines(s, "hosts", "answered on the fetch side of the cache, in plugin.cfg order (internal/hosts); the file is checked every reload interval on a miss")
		},
	})
	directive.Register("hosts", setup)
}

// parse reads a block's hosts line (CoreDNS 1.15's hosts plugin) into a
// *Config.
func parse(s *corefile.Server, d *corefile.Directive, _ any) (any, error) {
	c := &Config{Path: DefaultPath, TTL: DefaultTTL, Reload: DefaultReload}
	args := d.Args
	if len(args) > 0 {
		c.Path, args = args[0].Text, args[1:]
		if st, err := os.Stat(c.Path); err != nil && !os.IsNotExist(err) {
			return nil, corefile.Bad(d, "unable to access hosts file %q: %v", c.Path, err)
		} else if err == nil && st.IsDir() {
			// CoreDNS warns and serves the inline entries (and the file,
			// should it become one): so do we, recorded.
			s.SkipEntry(d, d.Args[0].Pos, c.Path, "a directory, not a hosts file: the inline entries are served")
		}
		// A file that does not exist yet is read when it appears (CoreDNS
		// warns likewise); the daemon logs it.
	}
	var err error
	if c.Zones, err = corefile.ZonesOf(s, d, d, args); err != nil {
		return nil, err
	}
	for _, o := range d.Block {
		if err := parseOption(s, d, o, c); err != nil {
			return nil, err
		}
	}
	if c.FallthroughUnsupported && c.Fallthrough == nil {
		return nil, corefile.Bad(d, "fallthrough_unsupported requires fallthrough")
	}
	return c, nil
}

// parseOption reads one line of a hosts block into c: an option, or an
// inline entry.
func parseOption(s *corefile.Server, d, o *corefile.Directive, c *Config) error {
	a := o.ArgStrings()
	var err error
	switch o.Name {
	case "fallthrough":
		if c.Fallthrough, err = corefile.FallthroughZones(s, d, o); err != nil {
			return err
		}
	case "fallthrough_unsupported":
		if len(a) != 0 {
			return corefile.BadOpt(d, o, "fallthrough_unsupported takes no arguments")
		}
		c.FallthroughUnsupported = true
	case "no_reverse":
		c.NoReverse = true
	case "ttl":
		n, err := strconv.Atoi(strings.Join(a, ""))
		if len(a) != 1 || err != nil || n <= 0 || n > 65535 {
			return corefile.BadOpt(d, o, "ttl takes a number of seconds from 1 to 65535")
		}
		c.TTL = uint32(n)
	case "reload":
		if len(a) != 1 {
			return corefile.BadOpt(d, o, "reload needs a duration (zero seconds to disable)")
		}
		t, err := time.ParseDuration(a[0])
		if err != nil || t < 0 {
			return corefile.BadOpt(d, o, "invalid duration for reload %q", a[0])
		}
		c.Reload = t
	default:
		if c.Fallthrough != nil {
			return corefile.BadOpt(d, o, "unknown property %s (entries come before fallthrough)", o.Name)
		}
		// An inline entry: ADDRESS NAME... CoreDNS skips a line whose
		// address does not parse or that names no host, as /etc/hosts
		// parsing does (a misspelt option too): skipped and recorded.
		line := strings.Join(append([]string{o.Name}, a...), " ")
		ip := o.Name
		if i := strings.IndexByte(ip, '%'); i >= 0 {
			ip = ip[:i]
		}
		if _, err := netip.ParseAddr(ip); err != nil {
			s.SkipEntry(d, o.Pos, line, "neither an option nor an entry ADDRESS NAME...: "+strconv.Quote(o.Name)+" is no address")
			return nil
		}
		if len(a) == 0 {
			s.SkipEntry(d, o.Pos, line, "an address without a name")
			return nil
		}
		c.Inline = append(c.Inline, line)
	}
	return nil
}

// setup builds a block's hosts handler from its configuration (*Config).
func setup(env directive.Env, cfg any) (directive.Handler, error) {
	c, ok := cfg.(*Config)
	if !ok || c == nil {
		return nil, fmt.Errorf("hosts: configuration %T", cfg)
	}
	h := New(*c, env.Clock, env.Log)
	if env.Metrics != nil {
		h.Report(env.Metrics.Hosts(c.Path))
	}
	return h, nil
}
