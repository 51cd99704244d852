package running

import (
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/metrics"
	"github.com/nodelocaldns/nodelocaldns/internal/server"
)

// CoreDNSBlocks are the server blocks whose metrics are served under
// CoreDNS's names: the Corefile's, or without one the zones the flags
// route (the cluster domain and the reverse zones to kube-dns, the rest to
// the node's resolvers) as the reference Corefile's blocks name them.
func CoreDNSBlocks(cfg *config.Config) []metrics.CDBlock {
	if cc := cfg.DropIn.Corefile; cc != nil {
		var out []metrics.CDBlock
		for _, s := range cc.Servers {
			b := metrics.CDBlock{Zones: s.Zones, Prometheus: s.Prometheus != ""}
			for _, p := range s.Plugins {
				b.Plugins = append(b.Plugins, p.Name)
			}
			out = append(out, b)
		}
		return out
	}
	// The reference Corefile's handlers, in CoreDNS's execution order.
	plugins := []string{"prometheus", "errors", "cache", "loop", "forward"}
	var out []metrics.CDBlock
	for _, z := range []string{cfg.ClusterDomain, "in-addr.arpa.", "ip6.arpa.", "."} {
		out = append(out, metrics.CDBlock{Zones: []string{z}, Plugins: plugins, Prometheus: true})
	}
	return out
}

// CoreDNSZones are the zones of every block, each with its block's plugin
// label; those of blocks without a prometheus directive are not counted.
func CoreDNSZones(blocks []metrics.CDBlock) []server.CDZone {
	var out []server.CDZone
	for _, b := range blocks {
		for _, z := range b.Zones {
			out = append(out, server.CDZone{Name: z, Plugin: metrics.PluginLabel(b.Plugins), Off: !b.Prometheus})
		}
	}
	return out
}

// coreDNSCacheBlocks are the Corefile blocks' caches for the per-block
// cache series (entries carry their block's tag: config.ZonePolicy); nil
// without a Corefile (one series for the one cache, as before).
func coreDNSCacheBlocks(cfg *config.Config) []metrics.CacheBlock {
	cc := cfg.DropIn.Corefile
	if cc == nil {
		return nil
	}
	out := make([]metrics.CacheBlock, len(cc.Servers))
	for i, s := range cc.Servers {
		out[i] = metrics.CacheBlock{Server: -1, Zones: strings.Join(s.Zones, ","), Cache: s.Cache != nil}
	}
	// Each block's server label is the first listen socket that sees it.
	for j, a := range cfg.Sockets() {
		for _, i := range config.BlocksSeenFrom(cc.Servers, a) {
			if out[i].Server < 0 {
				out[i].Server = j
			}
		}
	}
	return out
}

// CacheBlocks are the blocks the cache tags name now (metrics.CoreDNSConfig).
func (d *State) CacheBlocks() []metrics.CacheBlock { return *d.cacheBlocks.Load() }
