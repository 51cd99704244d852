package autopath_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// Autopath's memory bound (docs/autopath.md, "Cost"): peak RSS, MiB, of
// the daemon with the manifest's memory settings while a hostile pod floods
// it: GOMEMLIMIT (168 MiB, which the cache's 64 MiB and the collector's
// room fit under) and 16 MiB the runtime keeps outside it.
const autopathHostileBudget = 176

// wildcard answers every name under wild.example. with records A records
// (a domain the pod controls, with large answers), truncated over UDP;
// everything else NXDOMAIN.
type wildcard struct {
	records int
	queries atomic.Int64
}

func (w *wildcard) ServeDNS(rw dns.ResponseWriter, r *dns.Msg) {
	w.queries.Add(1)
	q := r.Question[0]
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	if !strings.HasSuffix(strings.ToLower(q.Name), ".wild.example.") {
		m.Rcode = dns.RcodeNameError
		soa, _ := dns.NewRR("example. 30 IN SOA ns.example. hostmaster.example. 1 7200 1800 86400 30")
		m.Ns = []dns.RR{soa}
		_ = rw.WriteMsg(m)
		return
	}
	for i := range w.records {
		switch q.Qtype {
		case dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
				A: net.IPv4(10, byte(i>>16), byte(i>>8), byte(i))})
		case dns.TypeAAAA:
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 300},
				AAAA: net.ParseIP(fmt.Sprintf("2001:db8::%x", i))})
		}
	}
	m.Compress = true
	if _, udp := rw.RemoteAddr().(*net.UDPAddr); udp {
		size := 512
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	_ = rw.WriteMsg(m)
}

// A hostile pod asks unique names under a wildcard domain with large
// answers, as search queries autopath answers, 256 at a time: 70 records
// (about 1.2 KB: autopath answers them) and 2,000 records (about 32 KB:
// autopath declines them, the cache keeps them as any client's): the
// daemon's peak RSS stays within autopathHostileBudget. The pod is a
// loopback address the API server gives a pod of this node (no network
// namespace needed). NLD_HOSTILE_BINARY runs another build (an earlier
// commit's), NLD_HOSTILE_NO_AUTOPATH=1 the daemon without -autopath.
func TestAutopathHostilePodMemory(t *testing.T) {
	for _, records := range []int{70, 2000} {
		t.Run(fmt.Sprintf("%d records", records), func(t *testing.T) { hostilePod(t, records) })
	}
}

func hostilePod(t *testing.T, records int) {
	need(t, "needs root (port 53)", os.Geteuid() == 0)
	need(t, "needs unshare (util-linux)", lookPath("unshare"))
	dur := 10 * time.Second
	if v := os.Getenv("NLD_HOSTILE_DURATION"); v != "" {
		var err error
		if dur, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	podIP, localIP, upIP := testhost.Loopback(), testhost.Loopback(), testhost.Loopback()
	api := apiWithPod(t, "evil", podIP)

	dir := t.TempDir()
	bin := os.Getenv("NLD_HOSTILE_BINARY") // another build, for before-and-after figures
	if bin == "" {
		bin = filepath.Join(dir, "nodelocaldns")
		if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/nodelocaldns").CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
	}
	up := &wildcard{records: records}
	startUpstreamHandler(t, upIP+":53", up)
	nodeResolv := filepath.Join(dir, "node.resolv.conf")
	if err := os.WriteFile(nodeResolv, []byte("nameserver "+upIP+"\nsearch corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The manifest's memory settings (deploy/daemonset.yaml).
	t.Setenv("GOMEMLIMIT", "168MiB")
	args := []string{"-localip", localIP, "-kube-dns", upIP, "-resolv-conf", nodeResolv, "-kubednscm", "",
		"-cache-max-bytes", "64Mi", "-udp-sockets", "4"}
	if os.Getenv("NLD_HOSTILE_NO_AUTOPATH") == "" {
		args = append(args, "-autopath", "-node-name", "node1")
	}
	d := startDaemon(t, bin, credentials(t, api, dir), args...)
	if os.Getenv("NLD_HOSTILE_NO_AUTOPATH") == "" {
		d.waitFor(`^nodelocaldns_autopath_pod_watch_synced 1`, "synced")
		d.waitFor(`^nodelocaldns_autopath_pods 1`, "knowing the pod")
	}
	rss := func(field string) int64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(d.pid) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb
			}
		}
		t.Fatalf("no %s", field)
		return 0
	}
	ready := rss("VmRSS")

	// The flood: 256 queries outstanding at a time over UDP from the pod's
	// address, each a new name (A and AAAA alike), with EDNS 4096.
	var sent, answered, autopathAnswers atomic.Int64
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	var n atomic.Int64
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			laddr := &net.UDPAddr{IP: net.ParseIP(podIP)}
			c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: laddr}, UDPSize: 4096}
			for time.Now().Before(stop) {
				i := n.Add(1)
				m := new(dns.Msg)
				qt := dns.TypeA
				if i%2 == 1 {
					qt = dns.TypeAAAA
				}
				m.SetQuestion(fmt.Sprintf("u%d.wild.example.shop.svc.cluster.local.", i/2), qt)
				m.SetEdns0(4096, false)
				sent.Add(1)
				r, _, err := c.Exchange(m, net.JoinHostPort(localIP, "53"))
				if err != nil {
					continue
				}
				answered.Add(1)
				if len(r.Answer) > 0 && r.Answer[0].Header().Rrtype == dns.TypeCNAME {
					autopathAnswers.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	hwm, now := rss("VmHWM"), rss("VmRSS")
	t.Logf("%v: %d queries sent, %d answered, %d by autopath (CNAME); upstream %d queries", dur, sent.Load(), answered.Load(),
		autopathAnswers.Load(), up.queries.Load())
	t.Logf("RSS when ready %.1f MiB; peak RSS (VmHWM) %.1f MiB; RSS now %.1f MiB; budget %d MiB",
		float64(ready)/1024, float64(hwm)/1024, float64(now)/1024, autopathHostileBudget)
	for _, l := range strings.Split(d.scrape(), "\n") {
		if strings.HasPrefix(l, "nodelocaldns_autopath_memo") || strings.HasPrefix(l, "nodelocaldns_cache_bytes") ||
			strings.HasPrefix(l, "nodelocaldns_autopath_declined_total") && !strings.HasSuffix(l, " 0") {
			t.Log(l)
		}
	}
	if records < 100 && autopathAnswers.Load() == 0 && os.Getenv("NLD_HOSTILE_NO_AUTOPATH") == "" {
		t.Error("autopath answered none of the flood: the test measured nothing")
	}
	if hwm > autopathHostileBudget<<10 {
		t.Errorf("peak RSS %.1f MiB, over the %d MiB budget", float64(hwm)/1024, autopathHostileBudget)
	}
}
