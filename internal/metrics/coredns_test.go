package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPluginLabel(t *testing.T) {
	for _, c := range []struct {
		plugins []string
		want    string
	}{
		{[]string{"bind", "health", "prometheus", "errors", "cache", "loop", "forward"}, "errors"},
		{[]string{"prometheus", "reload", "cache", "forward"}, "cache"},
		{[]string{"errors", "cache", "forward"}, ""},
		{[]string{"prometheus"}, ""},
	} {
		if got := PluginLabel(c.plugins); got != c.want {
			t.Errorf("%v: %q, want %q", c.plugins, got, c.want)
		}
	}
}

// TestDirectiveSeries: the hosts, template and dns64 counters show under
// CoreDNS's names and labels; two templates with the same labels are one
// series; the hosts reload timestamp is there before any hosts directive.
func TestDirectiveSeries(t *testing.T) {
	m := New(nil, nil)
	m.CoreDNS(CoreDNSConfig{Servers: func() []string { return []string{"dns://169.254.20.10:53"} }})
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP coredns_hosts_reload_timestamp_seconds The timestamp of the last reload of hosts file.
# TYPE coredns_hosts_reload_timestamp_seconds gauge
coredns_hosts_reload_timestamp_seconds 0
`), "coredns_hosts_reload_timestamp_seconds", "coredns_hosts_entries", "coredns_dns64_requests_translated_total"); err != nil {
		t.Error(err)
	}
	h := m.Directives.Hosts("/etc/hosts")
	h.Entries.Store(3)
	h.ReloadUnix.Store(1700000000)
	t1, t2 := m.Directives.Template("example.org.", "IN", "AAAA"), m.Directives.Template("example.org.", "IN", "AAAA")
	t1.Matches.Add(2)
	t2.Matches.Add(1)
	t1.TemplateFailure("answer", "{{ .Bad }}")
	t2.RRFailure("answer", "x IN A")
	m.Directives.DNS64().Add(5)
	want := `
# HELP coredns_dns64_requests_translated_total Counter of DNS requests translated by dns64.
# TYPE coredns_dns64_requests_translated_total counter
coredns_dns64_requests_translated_total{server="dns://169.254.20.10:53"} 5
# HELP coredns_hosts_entries The combined number of entries in hosts and Corefile.
# TYPE coredns_hosts_entries gauge
coredns_hosts_entries{hostsfile="/etc/hosts"} 3
# HELP coredns_hosts_reload_timestamp_seconds The timestamp of the last reload of hosts file.
# TYPE coredns_hosts_reload_timestamp_seconds gauge
coredns_hosts_reload_timestamp_seconds 1.7e+09
# HELP coredns_template_matches_total Counter of template regex matches.
# TYPE coredns_template_matches_total counter
coredns_template_matches_total{class="IN",server="dns://169.254.20.10:53",type="AAAA",view="",zone="example.org."} 3
# HELP coredns_template_rr_failures_total Counter of mis-templated RRs.
# TYPE coredns_template_rr_failures_total counter
coredns_template_rr_failures_total{class="IN",section="answer",server="dns://169.254.20.10:53",template="x IN A",type="AAAA",view="",zone="example.org."} 1
# HELP coredns_template_template_failures_total Counter of go template failures.
# TYPE coredns_template_template_failures_total counter
coredns_template_template_failures_total{class="IN",section="answer",server="dns://169.254.20.10:53",template="{{ .Bad }}",type="AAAA",view="",zone="example.org."} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "coredns_dns64_requests_translated_total",
		"coredns_hosts_entries", "coredns_hosts_reload_timestamp_seconds", "coredns_template_matches_total",
		"coredns_template_rr_failures_total", "coredns_template_template_failures_total"); err != nil {
		t.Error(err)
	}
}

// TestForwardEventsUnderCoreDNSNames: upstream events feed the proxy and
// forward series; the last healthy upstream of a group going down is a
// broken health check; a failing /health is a health failure.
func TestForwardEventsUnderCoreDNSNames(t *testing.T) {
	m := New(nil, nil)
	m.Health("node", "10.0.0.1:53", true)
	m.Health("node", "10.0.0.2:53", true)
	m.Health("node", "10.0.0.1:53", false)
	m.Health("node", "10.0.0.1:53", false) // no change: not counted again
	if v := testutil.ToFloat64(m.cd.hcBroken); v != 0 {
		t.Errorf("broken %v with one upstream up", v)
	}
	m.Health("node", "10.0.0.2:53", false)
	if v := testutil.ToFloat64(m.cd.hcBroken); v != 1 {
		t.Errorf("broken %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.cd.proxyHCFail.WithLabelValues("forward", "10.0.0.1:53")); v != 1 {
		t.Errorf("healthcheck failures %v, want 1", v)
	}
	m.Failure("kube-dns", "", "overloaded")
	if v := testutil.ToFloat64(m.cd.maxConcurrent); v != 1 {
		t.Errorf("max concurrent rejects %v", v)
	}
	m.Conns("kube-dns", "10.96.0.10:53", 1)
	m.Exchange("kube-dns", "10.96.0.10:53", 3, 1e6)
	if v := testutil.ToFloat64(m.cd.connHits.WithLabelValues("forward", "10.96.0.10:53", "tcp")); v != 1 {
		t.Errorf("conn cache hits %v", v)
	}
	// UDP sockets (issue 14): a query that opened one is a miss, one over an open one a hit;
	// the answer itself adds nothing.
	m.SocketUse("node", "10.0.0.1:53", "udp", false)
	m.SocketUse("node", "10.0.0.1:53", "udp", true)
	m.SocketUse("node", "10.0.0.1:53", "udp", true)
	m.Exchange("node", "10.0.0.1:53", 0, 1e6)
	if h, mi := testutil.ToFloat64(m.cd.connHits.WithLabelValues("forward", "10.0.0.1:53", "udp")), testutil.ToFloat64(m.cd.connMisses.WithLabelValues("forward", "10.0.0.1:53", "udp")); h != 2 || mi != 1 {
		t.Errorf("udp conn cache hits %v, misses %v; want 2 and 1", h, mi)
	}
	if n := testutil.CollectAndCount(m.cd.connHits, "coredns_proxy_conn_cache_hits_total"); n != 2 {
		t.Errorf("%d conn cache hit series, want tcp and udp", n)
	}
	if n := testutil.CollectAndCount(m.cd.proxyDuration, "coredns_proxy_request_duration_seconds"); n != 2 {
		t.Errorf("%d proxy duration series, want one per upstream", n)
	}
	probe := m.cd.timedHealth(func(context.Context) error { return errors.New("wedged") })
	_ = probe(context.Background())
	if v := testutil.ToFloat64(m.cd.healthFailures); v != 1 {
		t.Errorf("health failures %v", v)
	}
	m.SetupError("iptables")
	if v := testutil.ToFloat64(m.cd.setupErrors.WithLabelValues("iptables")); v != 1 {
		t.Errorf("nodecache setup errors %v", v)
	}
}
