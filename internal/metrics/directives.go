package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Directives holds the coredns_hosts_*, coredns_template_* and
// coredns_dns64_* series of the Corefile directives that have them. A
// directive's package gets plain counters from Hosts, Template or DNS64
// when it is set up and increments them; the series appear at the next
// scrape, named and labelled as CoreDNS 1.15 names them. Nothing here is
// on a lock per query: matches and translations are atomics; template
// failures (rare: a template that does not execute) take a mutex.
type Directives struct {
	mu        sync.Mutex
	hosts     []*HostsCounters
	templates []*TemplateCounters
	dns64     []*atomic.Uint64
	// corefileSkipped: entries of the running Corefile skipped, by its
	// path (skipped.go).
	corefileSkipped map[string]int
}

// HostsCounters feed coredns_hosts_entries{hostsfile} and
// coredns_hosts_reload_timestamp_seconds.
type HostsCounters struct {
	File       string       // the hostsfile label: the file's path ("" for inline entries only)
	Entries    atomic.Int64 // entries of the file and the inline ones together
	ReloadUnix atomic.Int64 // Unix time of the last (re)load of the file, in seconds
	Skipped    atomic.Int64 // lines of the file as last read skipped, as CoreDNS skips them (skipped.go)
}

// TemplateCounters feed coredns_template_matches_total,
// coredns_template_template_failures_total and
// coredns_template_rr_failures_total for one template directive.
type TemplateCounters struct {
	Zone, Class, Type string // the labels (zone: the template's zone, class and type as written, e.g. "IN", "AAAA")
	Matches           atomic.Uint64

	mu       sync.Mutex
	tmplFail map[[2]string]uint64 // section, template -> count
	rrFail   map[[2]string]uint64
}

// TemplateFailure counts a Go template that failed to execute, with the
// section ("answer", "additional", "authority") and the template text.
func (t *TemplateCounters) TemplateFailure(section, template string) {
	t.mu.Lock()
	t.tmplFail[[2]string{section, template}]++
	t.mu.Unlock()
}

// RRFailure counts an executed template that is no valid RR.
func (t *TemplateCounters) RRFailure(section, template string) {
	t.mu.Lock()
	t.rrFail[[2]string{section, template}]++
	t.mu.Unlock()
}

// Hosts returns the counters of the hosts directive reading file, made on
// first use: a Corefile reload that rebuilds the directive gets the same
// counters again, so no series is registered twice.
func (d *Directives) Hosts(file string) *HostsCounters {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.hosts {
		if h.File == file {
			return h
		}
	}
	h := &HostsCounters{File: file}
	d.hosts = append(d.hosts, h)
	return h
}

// Template returns the counters of the template directives for zone,
// class and type (one series, as CoreDNS's labels), made on first use and
// the same after a Corefile reload.
func (d *Directives) Template(zone, class, typ string) *TemplateCounters {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.templates {
		if t.Zone == zone && t.Class == class && t.Type == typ {
			return t
		}
	}
	t := &TemplateCounters{Zone: zone, Class: class, Type: typ, tmplFail: map[[2]string]uint64{}, rrFail: map[[2]string]uint64{}}
	d.templates = append(d.templates, t)
	return t
}

// DNS64 returns the counter of requests translated by dns64
// (coredns_dns64_requests_translated_total), made on first use and shared
// by every dns64 directive and every Corefile reload.
func (d *Directives) DNS64() *atomic.Uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.dns64) == 0 {
		d.dns64 = append(d.dns64, new(atomic.Uint64))
	}
	return d.dns64[0]
}

var (
	descHostsEntries  = prometheus.NewDesc(cdNS+"_hosts_entries", "The combined number of entries in hosts and Corefile.", []string{"hostsfile"}, nil)
	descHostsReload   = prometheus.NewDesc(cdNS+"_hosts_reload_timestamp_seconds", "The timestamp of the last reload of hosts file.", nil, nil)
	tmplLabels        = []string{"server", "zone", "view", "class", "type"}
	tmplFailLabels    = []string{"server", "zone", "view", "class", "type", "section", "template"}
	descTmplMatches   = prometheus.NewDesc(cdNS+"_template_matches_total", "Counter of template regex matches.", tmplLabels, nil)
	descTmplFailures  = prometheus.NewDesc(cdNS+"_template_template_failures_total", "Counter of go template failures.", tmplFailLabels, nil)
	descTmplRRFailure = prometheus.NewDesc(cdNS+"_template_rr_failures_total", "Counter of mis-templated RRs.", tmplFailLabels, nil)
	descDNS64         = prometheus.NewDesc(cdNS+"_dns64_requests_translated_total", "Counter of DNS requests translated by dns64.", []string{"server"}, nil)
)

func (d *Directives) describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{descHostsEntries, descHostsReload, descTmplMatches, descTmplFailures, descTmplRRFailure, descDNS64} {
		ch <- x
	}
}

// collect emits the directives' series. CoreDNS labels template and dns64
// series with the server that answered; the counters here are per
// directive, so they show under the first server.
func (d *Directives) collect(ch chan<- prometheus.Metric, servers []string) {
	d.mu.Lock()
	hosts, templates, dns64 := d.hosts, d.templates, d.dns64
	d.mu.Unlock()
	// CoreDNS registers the reload timestamp gauge always (promauto): 0
	// until a hosts file is loaded.
	var reload int64
	entries := map[string]int64{}
	for _, h := range hosts {
		entries[h.File] += h.Entries.Load()
		reload = max(reload, h.ReloadUnix.Load())
	}
	ch <- prometheus.MustNewConstMetric(descHostsReload, prometheus.GaugeValue, float64(reload))
	for f, n := range entries {
		ch <- prometheus.MustNewConstMetric(descHostsEntries, prometheus.GaugeValue, float64(n), f)
	}
	srv := ""
	if len(servers) > 0 {
		srv = servers[0]
	}
	// Two template directives with the same zone, class and type are one
	// series, as in CoreDNS.
	type key struct{ zone, class, typ, section, tmpl string }
	matches := map[key]uint64{}
	tfail, rrfail := map[key]uint64{}, map[key]uint64{}
	for _, t := range templates {
		if n := t.Matches.Load(); n > 0 {
			matches[key{t.Zone, t.Class, t.Type, "", ""}] += n
		}
		t.mu.Lock()
		for k, n := range t.tmplFail {
			tfail[key{t.Zone, t.Class, t.Type, k[0], k[1]}] += n
		}
		for k, n := range t.rrFail {
			rrfail[key{t.Zone, t.Class, t.Type, k[0], k[1]}] += n
		}
		t.mu.Unlock()
	}
	for k, n := range matches {
		ch <- prometheus.MustNewConstMetric(descTmplMatches, prometheus.CounterValue, float64(n), srv, k.zone, "", k.class, k.typ)
	}
	for k, n := range tfail {
		ch <- prometheus.MustNewConstMetric(descTmplFailures, prometheus.CounterValue, float64(n), srv, k.zone, "", k.class, k.typ, k.section, k.tmpl)
	}
	for k, n := range rrfail {
		ch <- prometheus.MustNewConstMetric(descTmplRRFailure, prometheus.CounterValue, float64(n), srv, k.zone, "", k.class, k.typ, k.section, k.tmpl)
	}
	var translated uint64
	for _, c := range dns64 {
		translated += c.Load()
	}
	if len(dns64) > 0 {
		ch <- prometheus.MustNewConstMetric(descDNS64, prometheus.CounterValue, float64(translated), srv)
	}
}
