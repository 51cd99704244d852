package fallback

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// kubeDNS is the kube-dns pod's server: every A or AAAA question is
// answered (TTL 30), and it records who asked, over which transport: the
// cache asks over TCP; a pod's query that took the fallback arrives over
// UDP from the pod's own address, a host client's over UDP from the node
// (masqueraded).
type kubeDNS struct {
	mu   sync.Mutex
	seen []asked
}

type asked struct {
	at  time.Time
	src netip.Addr
	tcp bool
}

// answerFor is the address kube-dns gives name: the cache relays it, so a
// client cannot tell who answered; the record of who asked can.
func answerFor(qtype uint16) string {
	if qtype == dns.TypeAAAA {
		return "fd00:1::1"
	}
	return "192.0.2.1"
}

func startKubeDNS(t *testing.T, n *node) *kubeDNS {
	t.Helper()
	k := &kubeDNS{}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Authoritative = true
		if len(q.Question) == 1 {
			qq := q.Question[0]
			hdr := dns.RR_Header{Name: qq.Name, Rrtype: qq.Qtype, Class: dns.ClassINET, Ttl: 30}
			switch qq.Qtype {
			case dns.TypeA:
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.ParseIP(answerFor(dns.TypeA))})
			case dns.TypeAAAA:
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.ParseIP(answerFor(dns.TypeAAAA))})
			}
		}
		ap, _ := netip.ParseAddrPort(w.RemoteAddr().String())
		_, tcp := w.RemoteAddr().(*net.TCPAddr)
		k.mu.Lock()
		k.seen = append(k.seen, asked{time.Now(), ap.Addr().Unmap(), tcp})
		k.mu.Unlock()
		_ = w.WriteMsg(m)
	})
	for _, f := range []addrs{v4, v6} {
		ap := netip.AddrPortFrom(f.kubeDNS, 53).String()
		var pc net.PacketConn
		var ln net.Listener
		err := inNetns(n.kubeDNS, func() (err error) {
			if pc, err = net.ListenPacket("udp", ap); err != nil {
				return err
			}
			ln, err = net.Listen("tcp", ap)
			return err
		})
		if err != nil {
			t.Fatalf("kube-dns on %s: %v", ap, err)
		}
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}} {
			go func() { _ = srv.ActivateAndServe() }()
			t.Cleanup(func() { _ = srv.Shutdown() })
		}
	}
	return k
}

// direct returns when kube-dns was asked over UDP from src (a client whose
// query took the fallback) since from.
func (k *kubeDNS) direct(src netip.Addr, from time.Time) []time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []time.Time
	for _, a := range k.seen {
		if !a.tcp && a.src == src && !a.at.Before(from) {
			out = append(out, a.at)
		}
	}
	return out
}

// lookup is one query of a client: sent at, to server, answered or not, and
// how long it took.
type lookup struct {
	at     time.Time
	server netip.Addr
	took   time.Duration
	err    error
}

// client asks its servers every 100 ms, one try with a 1 s timeout each,
// from a new socket each time (a new source port, as dig and glibc's
// lookups use), in network namespace ns ("": the node's own, a
// host-network client).
type client struct {
	name    string
	ns      string
	servers []netip.Addr
	mu      sync.Mutex
	done    []lookup
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func startClient(t *testing.T, name, ns string, servers ...netip.Addr) *client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &client{name: name, ns: ns, servers: servers, stop: cancel}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			for _, s := range servers {
				c.wg.Add(1)
				go func() {
					defer c.wg.Done()
					l := c.ask(s, fmt.Sprintf("svc-%d.default.svc.cluster.local.", i%10))
					c.mu.Lock()
					c.done = append(c.done, l)
					c.mu.Unlock()
				}()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(c.finish)
	return c
}

func (c *client) finish() {
	c.stop()
	c.wg.Wait()
}

// ask sends one A query (AAAA to an IPv6 server) and waits 1 s for its answer.
func (c *client) ask(server netip.Addr, name string) lookup {
	l := lookup{at: time.Now(), server: server}
	qtype := dns.TypeA
	if server.Is6() {
		qtype = dns.TypeAAAA
	}
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	wire, _ := q.Pack()
	var conn net.Conn
	dial := func() (err error) {
		conn, err = net.Dial("udp", netip.AddrPortFrom(server, 53).String())
		return err
	}
	var err error
	if c.ns == "" {
		err = dial()
	} else {
		err = inNetns(c.ns, dial)
	}
	if err != nil {
		l.err = err
		return l
	}
	defer conn.Close()
	// The try's second starts when the query leaves: making the socket in
	// another namespace is the test's own work, slow on a loaded machine.
	sent := time.Now()
	_ = conn.SetDeadline(sent.Add(time.Second))
	if _, err := conn.Write(wire); err != nil {
		l.err, l.took = err, time.Since(sent)
		return l
	}
	buf := make([]byte, 1500)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			l.err, l.took = err, time.Since(sent)
			return l
		}
		var m dns.Msg
		if m.Unpack(buf[:n]) != nil || m.Id != q.Id {
			continue
		}
		l.took = time.Since(sent)
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 || !strings.Contains(m.Answer[0].String(), answerFor(qtype)) {
			l.err = fmt.Errorf("answer %s", strings.ReplaceAll(m.String(), "\n", " "))
		}
		return l
	}
}

// window is the client's lookups sent in [from, to).
func (c *client) window(from, to time.Time) []lookup {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []lookup
	for _, l := range c.done {
		if !l.at.Before(from) && l.at.Before(to) {
			out = append(out, l)
		}
	}
	return out
}

// tally counts a window's lookups: sent, failed, over 1 s, and the first
// and last failure.
type tally struct {
	sent, failed, slow int
	first, last        time.Time
	errs               []string
}

func count(ls []lookup) tally {
	var t tally
	for _, l := range ls {
		t.sent++
		if l.took >= time.Second {
			t.slow++
		}
		if l.err != nil {
			t.failed++
			if t.first.IsZero() || l.at.Before(t.first) {
				t.first = l.at
			}
			if l.at.After(t.last) {
				t.last = l.at
			}
			if len(t.errs) < 3 {
				t.errs = append(t.errs, fmt.Sprintf("%s @%s: %v", l.at.Format("15:04:05.000"), l.server, l.err))
			}
		}
	}
	return t
}

func (t tally) answered() float64 {
	if t.sent == 0 {
		return 0
	}
	return 100 * float64(t.sent-t.failed) / float64(t.sent)
}

func (t tally) String() string {
	return fmt.Sprintf("%d/%d answered (%.2f%%), %d over 1 s", t.sent-t.failed, t.sent, t.answered(), t.slow)
}
