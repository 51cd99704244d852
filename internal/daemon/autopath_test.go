package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// -autopath with the API server: the pod watch runs in the daemon, its
// metrics are served, and DNS answers whatever the API server does.
func TestAutopathPodWatchInTheDaemon(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("shop")
	up := startUpstream(t, records)
	cfg := autopathConfig(t, up.addr)
	logs := &logBuffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{KubeConfig: s.Config(s.AdminToken)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("start: %v\n%s", err, logs)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = d.shutdown(ctx, 0)
		})
	}
	t.Cleanup(stop)

	s.MustDo(http.MethodPost, "/api/v1/namespaces/shop/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "web"},
		"spec": map[string]any{"nodeName": "node1", "containers": []any{map[string]any{"name": "c", "image": "x.invalid/y"}}},
	}, nil)
	s.SetPodIP("shop", "web", "10.244.1.7")
	url := "http://" + d.MetricsAddr().String() + "/metrics"
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := httpStatus(t, url)
		if strings.Contains(body, "nodelocaldns_autopath_pod_watch_synced 1") && strings.Contains(body, "nodelocaldns_autopath_pods 1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod watch metrics never showed the pod:\n%s\n%s", grepLines(body, "autopath"), logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p, _ := d.PodWatch.Lookup(netip.MustParseAddr("10.244.1.7")); p == nil || p.Search[3] != "corp.example" {
		t.Errorf("pod view: %+v", p)
	}

	// The API server goes away: DNS answers on.
	s.Stop()
	c := &dns.Client{Timeout: 2 * time.Second}
	for i := 0; i < 5; i++ {
		m := new(dns.Msg)
		m.SetQuestion("example.org.", dns.TypeA)
		r, _, err := c.Exchange(m, d.Server.Addr().String())
		if err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("query %d with the API server down: %v %v", i, r, err)
		}
	}
	stop()
}

// Without credentials (-autopath outside a pod, token not mounted) the
// daemon serves and says once that autopath is off.
func TestAutopathWithoutCredentialsServesOn(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	up := startUpstream(t, records)
	cfg := testConfig(up.addr)
	cfg.Autopath.Enabled = true
	cfg.Autopath.NodeName = "node1"
	cfg.Autopath.NodeResolvConf = "/nonexistent"
	d, logs, _ := startDaemon(t, cfg, "")
	if !strings.Contains(logs.String(), "autopath off") || d.PodWatch != nil {
		t.Errorf("logs:\n%s", logs)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// searchZone is the world a pod of namespace shop sees: api.example.com
// with A and AAAA, the search candidates do not exist.
func searchZone(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	switch strings.ToLower(q.Name) {
	case "api.example.com.":
		switch q.Qtype {
		case dns.TypeA:
			rr, _ := dns.NewRR("api.example.com. 300 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		case dns.TypeAAAA:
			rr, _ := dns.NewRR("api.example.com. 300 IN AAAA 2001:db8::1")
			m.Answer = append(m.Answer, rr)
		}
	case "big.example.com.":
		for i := 0; i < 60; i++ {
			rr, _ := dns.NewRR(fmt.Sprintf("big.example.com. 300 IN A 10.1.0.%d", i))
			m.Answer = append(m.Answer, rr)
		}
	default:
		m.Rcode = dns.RcodeNameError
		rr, _ := dns.NewRR("example. 30 IN SOA ns.example. hostmaster.example. 1 7200 1800 86400 30")
		m.Ns = append(m.Ns, rr)
	}
	return m
}

// -autopath in the daemon: a pod's search query is answered with the CNAME
// over UDP and TCP, with the client's ID, flags and EDNS, truncated to its
// size; the answer is the pod's only (another client gets the name's own
// NXDOMAIN) and the CNAME's target is then a cache hit.
func TestAutopathAnswersInTheDaemon(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("shop")
	up := startUpstream(t, searchZone)
	cfg := autopathConfig(t, up.addr)
	d, logs, _ := startDaemonOpt(t, cfg, Options{KubeConfig: s.Config(s.AdminToken)})
	// The pod: its address is one of lo's (127.0.0.0/8 is all local).
	const podIP = "127.0.0.7"
	s.MustDo(http.MethodPost, "/api/v1/namespaces/shop/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "web"},
		"spec": map[string]any{"nodeName": "node1", "containers": []any{map[string]any{"name": "c", "image": "x.invalid/y"}}},
	}, nil)
	s.SetPodIP("shop", "web", podIP)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p, st := d.PodWatch.Lookup(netip.MustParseAddr(podIP)); p != nil && st.String() == "synced" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod never showed in the watch\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ask := func(from, network, name string, qtype uint16, edns uint16) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		m.Id = 0x4242
		if edns > 0 {
			m.SetEdns0(edns, false)
		}
		c := &dns.Client{Net: network, Timeout: 5 * time.Second}
		addr := d.Server.Addr().String()
		if network == "tcp" {
			addr = d.Server.TCPAddr().String()
			c.Dialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		} else {
			c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(from)}}
		}
		r, _, err := c.Exchange(m, addr)
		if err != nil {
			t.Fatalf("%s from %s over %s: %v", name, from, network, err)
		}
		if r.Id != 0x4242 || !r.Response || !r.RecursionDesired || !r.RecursionAvailable {
			t.Errorf("%s: header %+v", name, r.MsgHdr)
		}
		if (edns > 0) != (r.IsEdns0() != nil) {
			t.Errorf("%s: EDNS asked %d, answer's OPT %v", name, edns, r.IsEdns0())
		}
		return r
	}
	q := "Api.Example.COM.shop.svc.cluster.local."
	for _, network := range []string{"udp", "tcp"} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			r := ask(podIP, network, q, qt, 1232)
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 || r.Answer[0].Header().Name != q ||
				r.Answer[0].(*dns.CNAME).Target != "api.example.com." || r.Answer[1].Header().Rrtype != qt {
				t.Errorf("%s %s: %v", network, dns.TypeToString[qt], r)
			}
		}
	}
	sent := up.count()
	// The CNAME's target was resolved through the cache: the client's
	// follow-up is a hit.
	if r := ask(podIP, "udp", "api.example.com.", dns.TypeA, 0); len(r.Answer) != 1 || up.count() != sent {
		t.Errorf("target: %v, %d upstream queries", r, up.count()-sent)
	}
	// Another client (not a pod): the name's own NXDOMAIN, never the pod's
	// answer from a shared cache.
	if r := ask("127.0.0.1", "udp", q, dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Errorf("unknown source: %v", r)
	}
	// Truncated to the client's size like any answer: 60 addresses do not
	// fit in 512 bytes.
	r := ask(podIP, "udp", "big.example.com.shop.svc.cluster.local.", dns.TypeA, 0)
	r.Compress = true // as it came: Len counts the packed size
	if !r.Truncated || len(r.Answer) < 2 || r.Len() > 512 {
		t.Errorf("truncated: TC %v, %d records, %d bytes", r.Truncated, len(r.Answer), r.Len())
	}
	if r := ask(podIP, "tcp", "big.example.com.shop.svc.cluster.local.", dns.TypeA, 0); r.Truncated || len(r.Answer) != 61 {
		t.Errorf("over TCP: TC %v, %d records", r.Truncated, len(r.Answer))
	}
	_, body := httpStatus(t, "http://"+d.MetricsAddr().String()+"/metrics")
	for _, want := range []string{"nodelocaldns_autopath_answers_total 6", "nodelocaldns_autopath_client_queries_saved_total 24",
		"nodelocaldns_autopath_pods 1", "nodelocaldns_autopath_pod_watch_synced 1",
		`nodelocaldns_autopath_declined_total{reason="unknown_source"} 1`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics: no %q in\n%s", want, grepLines(body, "autopath"))
		}
	}
}

// autopathConfig is testConfig with -autopath on for node1, whose kubelet
// gives pods the node search domain corp.example.
func autopathConfig(t *testing.T, upstream netip.AddrPort) *config.Config {
	t.Helper()
	cfg := testConfig(upstream)
	cfg.Autopath.Enabled = true
	cfg.Autopath.NodeName = "node1"
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("search corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Autopath.NodeResolvConf = rc
	return cfg
}
