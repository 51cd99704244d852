package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// descSkipped is nodelocaldns_config_skipped_entries{file}: what the stock
// node-cache (CoreDNS) skips in a configuration we skip too, where
// refusing the whole of it would stop a node the stock starts; each entry
// is logged once with its file and line.
var descSkipped = prometheus.NewDesc(ns+"_config_skipped_entries",
	"Entries of the running configuration skipped as the stock node-cache (CoreDNS) skips them, by file: the Corefile's (a hosts entry with no address or no name, a zone in a directive's zone list that is no domain name) and its hosts files' unparsable lines as last read. Each is logged once with its file and line.",
	[]string{"file"}, nil)

// SetCorefileSkipped records how many entries of the Corefile at path, as
// running, were skipped (at start and at each reload applied); the
// series of a path no longer running stays at its last value.
func (d *Directives) SetCorefileSkipped(path string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.corefileSkipped == nil {
		d.corefileSkipped = map[string]int{}
	}
	d.corefileSkipped[path] = n
}

// skippedCollector emits nodelocaldns_config_skipped_entries: the
// Corefile's count and each hosts file's.
type skippedCollector struct{ d *Directives }

func (c skippedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descSkipped }

func (c skippedCollector) Collect(ch chan<- prometheus.Metric) {
	c.d.mu.Lock()
	byFile := map[string]int64{}
	for f, n := range c.d.corefileSkipped {
		byFile[f] += int64(n)
	}
	for _, h := range c.d.hosts { // one per file (Directives.Hosts)
		if h.File != "" {
			byFile[h.File] += h.Skipped.Load()
		}
	}
	c.d.mu.Unlock()
	for f, n := range byFile {
		ch <- prometheus.MustNewConstMetric(descSkipped, prometheus.GaugeValue, float64(n), f)
	}
}
