package forward

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// startUnbound runs unbound on 127.0.0.1 and a free port, authoritative for cluster.local with
// the given local-data lines, and returns its address. It skips the test without unbound.
func startUnbound(t *testing.T, localData []string) netip.AddrPort {
	t.Helper()
	bin, err := exec.LookPath("unbound")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/unbound"); serr != nil {
			t.Skip("unbound not installed (apt-get install -y unbound): integration test skipped")
		}
		bin = "/usr/sbin/unbound"
	}
	dir := t.TempDir()
	port := freePort(t)
	var conf strings.Builder
	fmt.Fprintf(&conf, `server:
	interface: 127.0.0.1
	port: %d
	do-ip6: no
	do-daemonize: no
	chroot: ""
	username: ""
	directory: "%s"
	pidfile: "%s"
	use-syslog: no
	logfile: ""
	verbosity: 0
	num-threads: 1
	incoming-num-tcp: 64
	module-config: "iterator"
	access-control: 127.0.0.0/8 allow
	local-zone: "cluster.local." static
`, port, dir, filepath.Join(dir, "unbound.pid"))
	for _, d := range localData {
		fmt.Fprintf(&conf, "\tlocal-data: %q\n", d)
	}
	conf.WriteString("remote-control:\n\tcontrol-enable: no\n")
	confPath := filepath.Join(dir, "unbound.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-d", "-c", confPath)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start unbound: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("unbound exited: %s", stderr.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr.String(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("unbound not listening on %v: %s", addr, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a port free for both TCP and UDP on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", ln.Addr().String())
		ln.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// unbound plays kube-dns over TCP: 200 concurrent distinct queries travel over no more than
// PoolSize connections and every answer holds the address configured for its name.
func TestUnboundKubeDNSOverTCP(t *testing.T) {
	const n = 200
	name := func(i int) string { return fmt.Sprintf("svc-%d.default.svc.cluster.local.", i) }
	ip := func(i int) string { return fmt.Sprintf("10.96.%d.%d", i/256, i%256) }
	var data []string
	for i := range n {
		data = append(data, fmt.Sprintf("%s 30 IN A %s", name(i), ip(i)))
	}
	addr := startUnbound(t, data)

	rec := newRecorder()
	g := newGroup(t, GroupConfig{Name: "kube-dns", Servers: []netip.AddrPort{addr}, Proto: TCP, PoolSize: 2}, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := new(dns.Msg)
			m.SetQuestion(name(i), dns.TypeA)
			m.Id = uint16(1000 + i)
			q, _ := m.Pack()
			ans, err := g.Exchange(ctx, q)
			if err != nil {
				t.Errorf("%s: %v", name(i), err)
				return
			}
			r := new(dns.Msg)
			if err := r.Unpack(ans); err != nil {
				t.Errorf("%s: unpack: %v", name(i), err)
				return
			}
			if r.Id != m.Id || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
				t.Errorf("%s: id %d rcode %d answers %d", name(i), r.Id, r.Rcode, len(r.Answer))
				return
			}
			if a, ok := r.Answer[0].(*dns.A); !ok || a.A.String() != ip(i) {
				t.Errorf("%s: answer %v, want A %s", name(i), r.Answer[0], ip(i))
			}
		}()
	}
	wg.Wait()
	maxOpen, opened := rec.connStats()
	if opened > 2 || maxOpen > 2 {
		t.Errorf("%d connections opened, %d at once; want at most PoolSize 2", opened, maxOpen)
	}
	if n := rec.exchangesAt(addr.String()); n != 200 {
		t.Errorf("%d answers reported, want 200", n)
	}
	t.Logf("200 queries over %d connection(s)", opened)

	// An NXDOMAIN from the static zone passes validation and comes back as is.
	m := new(dns.Msg)
	m.SetQuestion("missing.default.svc.cluster.local.", dns.TypeA)
	q, _ := m.Pack()
	ans, err := g.Exchange(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if wire.Rcode(ans) != dns.RcodeNameError {
		t.Errorf("rcode %d, want NXDOMAIN", wire.Rcode(ans))
	}
}
