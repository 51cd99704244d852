package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
)

// TestRemovedForgetsTheUpstream: an upstream that left its group (a kube-dns pod no longer
// followed) has every series of ours and CoreDNS's removed; the others stay.
func TestRemovedForgetsTheUpstream(t *testing.T) {
	m := New(nil, nil)
	for _, u := range []string{"10.244.0.2:53", "10.244.0.3:53"} {
		m.Health("kube-dns", u, true)
		m.Conns("kube-dns", u, 1)
		m.Exchange("kube-dns", u, 0, time.Millisecond)
		m.Failure("kube-dns", u, "timeout")
		m.SocketUse("kube-dns", u, "tcp", true)
		m.Health("kube-dns", u, false)
		m.Conns("kube-dns", u, -1)
	}
	m.Removed("kube-dns", "10.244.0.2:53")
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	text := b.String()
	if strings.Contains(text, "10.244.0.2:53") {
		t.Errorf("series of the removed upstream remain:\n%s", grep(text, "10.244.0.2:53"))
	}
	for _, want := range []string{
		`nodelocaldns_upstream_request_duration_seconds_count{group="kube-dns",rcode="NOERROR",upstream="10.244.0.3:53"} 1`,
		`coredns_proxy_request_duration_seconds_count{proxy_name="forward",rcode="NOERROR",to="10.244.0.3:53"} 1`,
		`nodelocaldns_upstream_healthy{group="kube-dns",upstream="10.244.0.3:53"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %s", want)
		}
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
