package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	_ "github.com/nodelocaldns/nodelocaldns/internal/plugins" // the directives, read and run by their own packages
)

// CorefileConfig is the Corefile the daemon runs (Corefile mode).
type CorefileConfig struct {
	Path string // -conf
	Base string // -basecorefile when it was rendered from; "" when -conf is used as it is
	// Text is what was parsed: the rendering without the kube-dns
	// ConfigMap (whose stub domains and upstreams the daemon applies and
	// watches itself), or -conf's content.
	Text []byte
	// Written is the full rendering (with the ConfigMap) written to Path,
	// as node-cache writes it; nil when Base is "".
	Written []byte
	Servers []*corefile.Server
	// Mapping says, block by block, how each directive was mapped.
	Mapping []string
	// ZonePolicies are the resolver's per-zone cache policies built from
	// the blocks (corefilepolicy.go).
	ZonePolicies []ZonePolicy
	// Views are the sets of blocks seen from the listen addresses, each
	// with its own policies and routes (views.go); nil when one view
	// answers like every other (ZonePolicies and the shared routes then
	// serve every address).
	Views []View
	// RootLiteral: the "." block forwards to literal addresses, so the
	// kube-dns ConfigMap's upstreamNameservers do not replace them (in
	// node-cache they only fill __PILLAR__UPSTREAM__SERVERS__).
	RootLiteral bool
	// Skipped are the Corefile's entries skipped as the stock skips them
	// (corefile.Skip): listed by -check-config, logged once and counted
	// by the daemon.
	Skipped []corefile.Skip
	// Links are the further forwards of the blocks that have several
	// (corefile.Server.MoreForwards), by block, in order: the groups the
	// blocks' chains hand names and answers on to (internal/blocks).
	Links map[*corefile.Server][]ForwardLink

	base   []byte                // the template, when rendered
	params corefile.RenderParams // its substitutions without the ConfigMap

	// What Reload needs to do it again: the Config before the Corefile was
	// applied, the flags, the environment.
	before  Config
	stock   stockFlags
	set     map[string]bool
	localIP string
	env     Env
}

// Source is the file a change of the Corefile shows in: the template when
// the Corefile is rendered, else the Corefile.
func (cc *CorefileConfig) Source() string {
	if cc.Base != "" {
		return cc.Base
	}
	return cc.Path
}

// Reload renders (when from a template), parses and maps the Corefile
// again over the same flags and environment, for the daemon's watch. The
// kube-dns ConfigMap is read as it is now.
func (cc *CorefileConfig) Reload() (*Config, error) {
	n := cc.before
	if err := n.applyCorefile(&cc.stock, cc.set, cc.localIP, cc.env); err != nil {
		return nil, err
	}
	if n.ResolvConf != "" {
		var err error
		if n.Nameservers, err = LoadResolvConf(n.ResolvConf, n.LocalIPs, n.Port); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	return &n, nil
}

// applyCorefile switches to Corefile mode when -conf (or an explicit
// -corefile) is given: renders the template as node-cache does, parses the
// Corefile, and maps it onto c. Flags given explicitly win where they say
// something else; each such case becomes a note.
func (c *Config) applyCorefile(s *stockFlags, set map[string]bool, localIP string, env Env) error {
	path := s.conf
	if path == "" {
		if !set["corefile"] {
			return nil
		}
		path = s.corefile
	}
	cc := &CorefileConfig{Path: path, before: *c, stock: *s, set: set, localIP: localIP, env: env}
	if st, err := os.Stat(s.basecorefile); err == nil && !st.IsDir() {
		base, err := corefile.ReadFile(s.basecorefile)
		if err != nil {
			return usage("-basecorefile: %v", err)
		}
		p := corefile.RenderParams{LocalIP: localIP, Port: c.Port, PrometheusListen: s.promListen}
		if c.KubeDNS.IsValid() {
			p.ClusterDNS = c.KubeDNS.Addr().String()
		}
		cc.Base, cc.Text = s.basecorefile, corefile.Render(base, p)
		cc.base, cc.params = base, p
		if stubs, ups, ok := c.rawConfigMap(); ok {
			p.StubDomains, p.UpstreamNameservers = stubs, ups
		}
		cc.Written = corefile.Render(base, p)
		if err := os.WriteFile(path, cc.Written, 0o644); err != nil {
			c.note("the rendered Corefile was not written to %s (%v); it runs from memory (node-cache logs the same and goes on)", path, err)
		}
	} else {
		data, err := corefile.ReadFile(path)
		if err != nil {
			return usage("-conf: %v (and no -basecorefile %s to render it from)", err, s.basecorefile)
		}
		cc.Text = data
	}
	bs, err := corefile.Parse(path, cc.Text, corefile.Env(env))
	if err != nil {
		return usage("%v", err)
	}
	if cc.Servers, err = corefile.Build(path, bs, corefile.Options{DefaultPort: c.Port, Interface: c.bindInterface}); err != nil {
		return usage("%v", err)
	}
	cc.Skipped = corefile.Skips(cc.Servers)
	c.DropIn.Corefile = cc
	return c.mapCorefile(cc, set)
}

// Rewrite renders the template again with the kube-dns ConfigMap as it is
// now and writes -conf when the result differs from what was written (as
// node-cache does on a ConfigMap change). It does nothing when -conf is
// used as it is, or the ConfigMap is invalid; an unwritable -conf is an
// error the caller logs (the daemon runs from memory either way).
func (cc *CorefileConfig) Rewrite(c *Config) (bool, error) {
	if cc.Base == "" {
		return false, nil
	}
	stubs, ups, ok := c.rawConfigMap()
	if !ok {
		return false, nil
	}
	p := cc.params
	p.StubDomains, p.UpstreamNameservers = stubs, ups
	out := corefile.Render(cc.base, p)
	if bytes.Equal(out, cc.Written) {
		return false, nil
	}
	if err := os.WriteFile(cc.Path, out, 0o644); err != nil {
		return false, err
	}
	cc.Written = out
	return true, nil
}

// StubConflict names the Corefile block serving zone, "" when none: a stub
// domain that duplicates a block makes the rendered Corefile invalid in
// CoreDNS (the same zone and port twice), so stock's reload fails.
func (cc *CorefileConfig) StubConflict(zone string) string {
	for _, s := range cc.Servers {
		for _, z := range s.Zones {
			if z == zone {
				return s.Pos.String()
			}
		}
	}
	return ""
}

// rawConfigMap reads the kube-dns ConfigMap's keys as written, when valid.
func (c *Config) rawConfigMap() (map[string][]string, []string, bool) {
	if c.KubeDNSConfigMap == "" {
		return nil, nil, false
	}
	data, err := ReadConfigMapDir(c.KubeDNSConfigMap)
	if err != nil {
		return nil, nil, false
	}
	if _, err := c.ParseKubeDNSConfigMap(data); err != nil {
		return nil, nil, false
	}
	var stubs map[string][]string
	var ups []string
	if data.StubDomains != nil && json.Unmarshal(data.StubDomains, &stubs) != nil {
		return nil, nil, false
	}
	if data.UpstreamNameservers != nil && json.Unmarshal(data.UpstreamNameservers, &ups) != nil {
		return nil, nil, false
	}
	return stubs, ups, true
}

func (c *Config) note(format string, a ...any) {
	c.DropIn.Notes = append(c.DropIn.Notes, fmt.Sprintf(format, a...))
}
