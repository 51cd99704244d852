package config

import (
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/hosts"
)

// describeDropIn prints, for -check-config, the Corefile block by block:
// each block's keys, its directives in CoreDNS's execution order, and how
// each was mapped; then every place a flag and the Corefile disagree.
func describeDropIn(p func(string, ...any), c *Config) {
	if c.DropIn.PidFile != "" {
		p("pidfile:          %s (written once serving)", c.DropIn.PidFile)
	}
	cc := c.DropIn.Corefile
	if cc == nil {
		p("corefile:         none (no -conf): the flags are the configuration")
	} else {
		if cc.Base != "" {
			p("corefile:         %s rendered from %s as node-cache does (kube-dns ConfigMap stub domains and upstreams applied live by the watch)", cc.Path, cc.Base)
		} else {
			p("corefile:         %s (used as it is)", cc.Path)
		}
		p("kube-dns zones:   %s", strings.Join(c.DropIn.KubeDNSZones, " "))
		for _, r := range c.DropIn.Routes {
			p("zone route:       %s -> %v (tcp %v) from %s; %s", r.Zone, r.Servers, r.ForceTCP, r.From, r.Opts)
		}
		if o := c.DropIn.KubeForward; o != nil {
			p("kube-dns group:   %s", o)
		}
		if len(c.DropIn.KubeDNSAlso) > 0 {
			p("kube-dns also:    %v (after %s)", c.DropIn.KubeDNSAlso, c.KubeDNS)
		}
		if o := c.DropIn.NodeForward; o != nil {
			p("node group:       %s", o)
		}
		for _, s := range cc.Servers {
			for i, l := range cc.Links[s] {
				p("forward %d:        block %s: %s -> %v (tcp %v); %s", i+2, l.Route.From, l.Route.Zone, l.Route.Servers, l.Route.ForceTCP, l.Route.Opts)
			}
		}
		if cc.Views == nil {
			for _, zp := range cc.ZonePolicies {
				p("zone %-12s served by the block at %s: %s", zp.Zone, zp.Block, zp)
			}
			p("views:            one: every listen address %v resolves each zone with the blocks above", c.LocalIPs)
		} else {
			p("views:            %d: a query is answered by the blocks listening on the address it arrived on (bind), then the longest zone, as CoreDNS; each view has its own policies, routes and cache entries", len(cc.Views))
			for i, v := range cc.Views {
				for j, line := range v.Describe(cc.Servers) {
					if j == 0 {
						p("view %d:           %s", i, line)
					} else {
						p("    %s", line)
					}
				}
			}
		}
		describeSkipped(p, cc)
		shown := map[string]bool{}
		mapping := mappingByBlock(cc)
		for _, s := range cc.Servers {
			var names []string
			for _, pl := range s.Plugins {
				names = append(names, pl.Name)
			}
			p("block %s  keys %s  zones %s  port %d  plugins (CoreDNS order) %s", s.Pos, strings.Join(s.Keys, " "), strings.Join(s.Zones, " "), s.Port, strings.Join(names, " "))
			if shown[s.Pos.String()] {
				// A block whose keys name several ports (corefile.splitPorts).
				p("    the block above, its keys on port %d: the same directives", s.Port)
				continue
			}
			pos := s.Pos.String()
			shown[pos] = true
			for _, line := range mapping[pos] {
				p("    %s", line)
			}
		}
	}
	for _, n := range c.DropIn.Notes {
		p("note:             %s", n)
	}
}

// mappingByBlock groups cc.Mapping's lines ("POS  text") by the position
// of their block: one pass, not one per block (5,000 blocks printed in
// 28 s when each scanned every line).
func mappingByBlock(cc *CorefileConfig) map[string][]string {
	pos := map[string]bool{}
	for _, s := range cc.Servers {
		pos[s.Pos.String()] = true
	}
	out := map[string][]string{}
	for _, m := range cc.Mapping {
		for i := strings.Index(m, "  "); i >= 0; {
			if pos[m[:i]] {
				out[m[:i]] = append(out[m[:i]], m[i+2:])
				break
			}
			j := strings.Index(m[i+1:], "  ")
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
	return out
}

// describeSkipped lists the Corefile's entries and its hosts files' lines
// that are skipped as the stock skips them (so it starts, and so do we).
func describeSkipped(p func(string, ...any), cc *CorefileConfig) {
	for _, k := range cc.Skipped {
		p("skipped:          %s", k)
	}
	files := map[string]bool{}
	for _, s := range cc.Servers {
		h, _ := s.Config("hosts").(*hosts.Config)
		if h == nil || h.Path == "" || files[h.Path] {
			continue
		}
		files[h.Path] = true
		first, n, err := hosts.CheckFile(h.Path)
		if err != nil {
			p("hosts file:       %s: %v (the daemon serves the inline entries and reads it when it can)", h.Path, err)
		}
		for _, l := range first {
			p("skipped:          %s:%d: hosts: %q skipped: %s (CoreDNS skips it too)", h.Path, l.Line, l.Text, l.Why)
		}
		if n > len(first) {
			p("skipped:          %s: %d more lines skipped", h.Path, n-len(first))
		}
	}
}
