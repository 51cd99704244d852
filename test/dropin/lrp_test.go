package dropin

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// lrpManifest reads deploy/lrp/nodelocaldns-lrp.yaml: the ConfigMap's
// Corefile (the cluster domain token filled) and the container's args.
func lrpManifest(t *testing.T) (corefile string, args []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "lrp", "nodelocaldns-lrp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var tm struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		switch tm.Kind {
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal(doc, &cm); err != nil {
				t.Fatal(err)
			}
			corefile = strings.ReplaceAll(cm.Data["Corefile"], "__PILLAR__DNS__DOMAIN__", "cluster.local")
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal(doc, &ds); err != nil {
				t.Fatal(err)
			}
			args = ds.Spec.Template.Spec.Containers[0].Args
		}
	}
	if corefile == "" || len(args) == 0 {
		t.Fatal("deploy/lrp/nodelocaldns-lrp.yaml: no Corefile or no args")
	}
	return corefile, args
}

// The LRP manifest's own configuration, run as the kubelet runs it in a pod
// network namespace (its Corefile as /etc/coredns/Corefile.base, its args,
// the kubelet's *_SERVICE_HOST environment): it starts, answers on every
// address of the pod (what Cilium redirects to is the pod's IP), and
// serves /health on the pod's IP (the Corefile's health without address).
func TestLRPManifestInPodNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary")
	}
	corefile, args := lrpManifest(t)
	ours := buildNodelocaldns(t)
	ns := podNamespace(t)
	d := startIn(t, ns, ours, map[string]string{"coredns/Corefile.base": corefile}, args)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := askAt(ns, podIPv4, 53, "web.default.svc.cluster.local.", dns.TypeA, 700*time.Millisecond); err == nil {
			break
		}
		select {
		case <-d.done:
			t.Fatalf("exited: %v\n%s", d.err, d.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer on the pod's IP within 20 s:\n%s", d.logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, a := range []string{podIPv4, podIPv6, "127.0.0.1", "::1"} {
		for _, q := range []struct {
			name string
			want string
		}{{"web.default.svc.cluster.local.", "10.96.1.1"}, {"www.example.org.", "93.184.216.34"}} {
			r, err := askAt(ns, a, 53, q.name, dns.TypeA, 3*time.Second)
			if err != nil || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), q.want) {
				t.Errorf("%s at %s: %v %v", q.name, a, r, err)
			}
		}
	}
	for _, a := range []string{oracleLocal, kubeDNSClust} {
		if _, err := askAt(ns, a, 53, "web.default.svc.cluster.local.", dns.TypeA, 500*time.Millisecond); err == nil {
			t.Errorf("answers on %s, which the pod does not have", a)
		}
	}
	for _, url := range []string{"http://" + podIPv4 + ":8080/health", "http://" + podIPv4 + ":9253/metrics"} {
		var code int
		err := inNetns(ns, func() error {
			// The transport dials on goroutines of its own: each dial
			// enters the namespace itself.
			dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
				err = inNetns(ns, func() (err error) {
					c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			}
			c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dial}}
			resp, err := c.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			code = resp.StatusCode
			return nil
		})
		if err != nil || code != http.StatusOK {
			t.Errorf("%s: %d %v", url, code, err)
		}
	}
	if t.Failed() {
		t.Logf("logs:\n%s", d.logs)
	}
}

// Issue 29's report: the stock's reference Corefile (bind 169.254.20.10
// 10.96.0.10) with the LRP mode's arguments in a pod network namespace
// cannot start (cannot assign requested address), and -check-config said
// it was valid. Now it says which addresses are missing and exits 2; the
// LRP Corefile (bind 0.0.0.0) is valid there.
func TestCheckConfigInPodNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary")
	}
	ours := buildNodelocaldns(t)
	ns := podNamespace(t)
	lrp, args := lrpManifest(t)
	for _, tc := range []struct {
		name, corefile string
		code           int
		want           string
	}{
		{"reference Corefile", referenceCorefile(t, false), 2, "cannot listen: not addresses of this host: dns 10.96.0.10 (cannot assign requested address), dns 169.254.20.10"},
		{"LRP Corefile", lrp, 0, "configuration is valid"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "Corefile.base"), []byte(tc.corefile), 0o644); err != nil {
			t.Fatal(err)
		}
		a := []string{"netns", "exec", ns, ours, "-basecorefile", filepath.Join(dir, "Corefile.base"), "-resolv-conf", "/etc/resolv.conf"}
		for _, x := range args {
			if strings.HasPrefix(x, "-conf=") {
				x = "-conf=" + filepath.Join(dir, "Corefile")
			}
			if strings.HasPrefix(x, "-state-dir=") || strings.HasPrefix(x, "-kubednscm=") {
				continue
			}
			a = append(a, x)
		}
		cmd := exec.Command("ip", append(a, "-check-config")...)
		cmd.Env = append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST="+oracleKubeDNS, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", tc.name, code, tc.code, tc.want, out)
		}
	}
}

// bind 0.0.0.0 is one wildcard socket, as the stock's: in the LRP mode's
// pod namespace, addresses added after the start (a pod IP that changes, an
// address added to the node), IPv4 and IPv6, and 127.0.0.2 (on no
// interface, but in lo's 127.0.0.0/8) are answered over UDP and TCP, every
// UDP answer from the address the query was sent to (a raw client reading
// the source, and dig, which ignores an answer from elsewhere); kube-proxy's
// IPVS link with a hundred ClusterIPs changes nothing; -check-config says
// what is listened on.
func TestWildcardServesAddressesAddedLater(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary")
	}
	dig := need(t, "dig")
	corefile, args := lrpManifest(t)
	ours := buildNodelocaldns(t)
	ns := podNamespace(t)
	in := func(a ...string) *exec.Cmd { return exec.Command("ip", append([]string{"netns", "exec", ns}, a...)...) }
	d := startIn(t, ns, ours, map[string]string{"coredns/Corefile.base": corefile}, args)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := askAt(ns, podIPv4, 53, "web.default.svc.cluster.local.", dns.TypeA, 700*time.Millisecond); err == nil {
			break
		}
		select {
		case <-d.done:
			t.Fatalf("exited: %v\n%s", d.err, d.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer on the pod's IP within 20 s:\n%s", d.logs)
		}
	}
	// Added after the start: a second pod IP, IPv4 and IPv6, and an
	// IPVS-style link that stays down with a hundred ClusterIPs.
	mustRun(t, in("ip", "addr", "add", "10.244.0.99/32", "dev", "eth0"))
	mustRun(t, in("ip", "-6", "addr", "add", "fd00::99/128", "dev", "eth0", "nodad"))
	mustRun(t, in("ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "ipvs-peer"))
	for i := range 100 {
		mustRun(t, in("ip", "addr", "add", fmt.Sprintf("10.96.1.%d/32", i+1), "dev", "kube-ipvs0"))
	}
	out := mustRun(t, in("ss", "-lnu", "sport", "= :53"))
	if strings.Count(out, "*:53") == 0 || strings.Contains(out, podIPv4+":53") {
		t.Errorf("want wildcard *:53 sockets only:\n%s", out)
	}
	for _, a := range []string{"10.244.0.99", "fd00::99", "127.0.0.2", podIPv4, "::1"} {
		dst := netip.AddrPortFrom(netip.MustParseAddr(a), 53)
		for i, q := range []struct{ name, want string }{
			{"web.default.svc.cluster.local.", "10.96.1.1"}, {"www.example.org.", "93.184.216.34"}, {"www.example.org.", "93.184.216.34"},
		} {
			m := new(dns.Msg)
			m.SetQuestion(q.name, dns.TypeA)
			m.Id = uint16(1000 + i)
			b, _ := m.Pack()
			var from netip.AddrPort
			var n int
			buf := make([]byte, 1500)
			err := inNetns(ns, func() error {
				c, err := net.ListenUDP("udp", nil) // unconnected: any source is read
				if err != nil {
					return err
				}
				defer c.Close()
				if _, err := c.WriteToUDPAddrPort(b, dst); err != nil {
					return err
				}
				_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
				n, from, err = c.ReadFromUDPAddrPort(buf)
				return err
			})
			r := new(dns.Msg)
			if err == nil {
				err = r.Unpack(buf[:n])
			}
			if err != nil || from.Addr().Unmap() != dst.Addr() || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), q.want) {
				t.Errorf("udp %s %s: from %s: %v %v", a, q.name, from, r, err)
			}
		}
		var r *dns.Msg
		err := inNetns(ns, func() (err error) {
			m := new(dns.Msg)
			m.SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
			r, _, err = (&dns.Client{Net: "tcp", Timeout: 3 * time.Second}).Exchange(m, dst.String())
			return err
		})
		if err != nil || len(r.Answer) != 1 {
			t.Errorf("tcp %s: %v %v", a, r, err)
		}
		for _, tcp := range []string{"+notcp", "+tcp"} {
			o, _ := in(dig, "+tries=1", "+time=3", tcp, "@"+a, "www.example.org", "A").CombinedOutput()
			if !strings.Contains(string(o), "status: NOERROR") || !strings.Contains(string(o), "93.184.216.34") || strings.Contains(string(o), "unexpected source") {
				t.Errorf("dig %s @%s:\n%s", tcp, a, o)
			}
		}
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Corefile.base"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, in("ip", "link", "set", "kube-ipvs0", "up"))
	cmd := in(ours, "-basecorefile", filepath.Join(dir, "Corefile.base"), "-conf", filepath.Join(dir, "Corefile"),
		"-upstreamsvc", "kube-dns-upstream", "-setupinterface=false", "-setupiptables=false", "-resolv-conf", "/etc/resolv.conf", "-check-config")
	cmd.Env = append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST="+oracleKubeDNS, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53")
	o, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(o), "every address of this host, now and later, one wildcard socket") || strings.Contains(string(o), "10.96.1.1") {
		t.Errorf("-check-config with kube-ipvs0 up: %v, want valid, the wildcard socket and no ClusterIP:\n%s", err, o)
	}
}
