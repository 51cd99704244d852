package daemon

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// With Corefile views, autopath resolves a pod's candidates through the
// view of the address its query arrived on: 127.0.0.1 sees "." forwarded
// to one server, 127.0.0.3 sees example.com forwarded to another and
// refuses every other zone but the cluster domain. The same pod and name
// get each view's target; a name the view refuses is not answered by
// autopath (the client gets its first candidate's own answer), and no
// query reaches the other view's upstream.
func TestAutopathRespectsViews(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("shop")
	kube := startUpstream(t, searchZone) // every cluster name: NXDOMAIN
	one := startUpstream(t, answerA("10.0.0.1"))
	three := startUpstream(t, answerA("10.0.0.3"))
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	corefile := fmt.Sprintf(`cluster.local:53 {
  bind 127.0.0.1 127.0.0.3
  forward . %s
}
.:53 {
  bind 127.0.0.1
  forward . %s
}
example.com:53 {
  bind 127.0.0.3
  forward . %s
}
`, kube.addr, one.addr, three.addr)
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parsed, err := config.Parse([]string{"-conf", conf, "-basecorefile", filepath.Join(dir, "none"), "-kubednscm", "",
		"-localip", "127.0.0.1,127.0.0.3", "-kube-dns", kube.addr.String(), "-resolv-conf", rc}, config.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg := autopathConfig(t, one.addr)
	cfg.LocalMode = false
	cfg.LocalIPs = parsed.LocalIPs
	cfg.KubeDNS, cfg.KubeDNSSource = parsed.KubeDNS, "test"
	cfg.DropIn = parsed.DropIn
	cfg.DropIn.NodeCacheMetricsAddr = "127.0.0.1:0"
	// No node search domain: the pod's search list is the cluster's.
	if err := os.WriteFile(cfg.Autopath.NodeResolvConf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d, logs, _ := startDaemonOpt(t, cfg, Options{KubeConfig: s.Config(s.AdminToken)})
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
	addrs := map[string]string{}
	for _, a := range d.Server.UDPAddrs() {
		addrs[a.Addr().String()] = a.String()
	}
	ask := func(to, name string) *dns.Msg {
		t.Helper()
		if addrs[to] == "" {
			t.Fatalf("not serving on %s: %v", to, addrs)
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(podIP)}}}
		r, _, err := c.Exchange(m, addrs[to])
		if err != nil {
			t.Fatalf("%s to %s: %v", name, to, err)
		}
		return r
	}
	target := func(r *dns.Msg) string {
		var out []string
		for _, rr := range r.Answer {
			out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
		}
		return dns.RcodeToString[r.Rcode] + " " + strings.Join(out, " | ")
	}
	q := "api.example.com.shop.svc.cluster.local."
	n3 := three.count()
	if got := target(ask("127.0.0.1", q)); !strings.Contains(got, "CNAME api.example.com.") || !strings.Contains(got, "10.0.0.1") {
		t.Errorf("view of 127.0.0.1: %s", got)
	}
	if three.count() != n3 {
		t.Errorf("view of 127.0.0.1 asked the other view's upstream")
	}
	n1 := one.count()
	if got := target(ask("127.0.0.3", q)); !strings.Contains(got, "CNAME api.example.com.") || !strings.Contains(got, "10.0.0.3") {
		t.Errorf("view of 127.0.0.3: %s", got)
	}
	if one.count() != n1 {
		t.Errorf("view of 127.0.0.3 asked the other view's upstream")
	}
	// A name 127.0.0.3's view refuses: not answered by autopath there.
	if got := target(ask("127.0.0.3", "api.example.org.shop.svc.cluster.local.")); got != "NXDOMAIN " {
		t.Errorf("a refused zone through the view of 127.0.0.3: %s", got)
	}
	if got := target(ask("127.0.0.1", "api.example.org.shop.svc.cluster.local.")); !strings.Contains(got, "CNAME api.example.org.") {
		t.Errorf("the same name through the view of 127.0.0.1: %s", got)
	}
}
