package memory

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// identityAttacks are issue 37's table: a tenant with more than one
// address (many pods, a hostNetwork pod's loopback addresses), the
// daemon's own work (prefetches) driven by one pod, the cache's space, and
// a TCP client that never reads.
func identityAttacks() []attack {
	loopbacks := make([]string, 1000)
	for i := range loopbacks {
		loopbacks[i] = hostLoopback(i)
	}
	hostSocks := make([]string, 64) // 64 sockets from the kernel's pick
	return []attack{
		{"60 pods, 7 never-answered names a second each", manyPods},
		{"a hostNetwork pod from 1000 loopback addresses, unique never-answered names", func(ctx context.Context, t *testing.T, d *daemon) func() {
			return udpFlood("lb", loopbacks, 1100, true)(ctx, t, d)
		}},
		{"a hostNetwork pod from 1000 loopback addresses, 2100 queries over 3 names", func(ctx context.Context, t *testing.T, d *daemon) func() {
			return udpFlood("lw", loopbacks, 2100, false)(ctx, t, d)
		}},
		{"40 pods x 25 TCP connections, 1 byte of a query each, reopened", partialTCP},
		{"a hostNetwork pod flooding from the node's address, 64 sockets", func(ctx context.Context, t *testing.T, d *daemon) func() {
			return udpFlood("hn", hostSocks, 1100, true)(ctx, t, d)
		}},
		{"prefetch cycle: 1100 cached names hit twice in their last tenth, refreshes stall", prefetchCycle},
		{"cache churn: 2500 new names a second, each asked 1-12 times", cacheChurn},
		{"unread TCP: 100 connections pipelining 2 KB answers (TTL 0), never read", unreadTCP},
	}
}

// manyPods: 60 pods each ask 7 new never-answered names a second (each
// under its share of every bound).
func manyPods(ctx context.Context, t *testing.T, d *daemon) func() {
	dst, _ := net.ResolveUDPAddr("udp", d.addr)
	cs := make([]*net.UDPConn, 60)
	for i := range cs {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(pod(6, i))}, dst)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
		go drain(c)
	}
	tick := time.NewTicker(time.Second / 7)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return func() {
				for _, c := range cs {
					c.Close()
				}
			}
		case <-tick.C:
		}
		for i, c := range cs {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("p%d-%d.silent.example.org.", i, n), dns.TypeA)
			b, _ := m.Pack()
			_, _ = c.Write(b)
		}
	}
}

// partialTCP: 40 pods each keep 25 TCP connections open with one byte of
// a query on each, and reopen each as soon as the daemon closes it.
func partialTCP(ctx context.Context, t *testing.T, d *daemon) func() {
	var wg sync.WaitGroup
	for p := range 40 {
		for range 25 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(pod(9, p))}, Timeout: time.Second}
				for ctx.Err() == nil {
					c, err := dl.DialContext(ctx, "tcp", d.addr)
					if err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					stop := context.AfterFunc(ctx, func() { c.Close() })
					_, _ = c.Write([]byte{0})
					_, _ = c.Read(make([]byte, 1)) // until the daemon closes it
					stop()
					c.Close()
				}
			}()
		}
	}
	return wg.Wait
}

// prefetchCycle: one pod asks 1100 new names every 4 s (answered, TTL 5)
// and asks each twice more 4.6 s later, in the last tenth of its TTL: each
// of those hits starts a prefetch, and the upstream never answers a
// refresh.
func prefetchCycle(ctx context.Context, t *testing.T, d *daemon) func() {
	dst, _ := net.ResolveUDPAddr("udp", d.addr)
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(pod(10, 0))}, dst)
	if err != nil {
		t.Fatal(err)
	}
	go drain(c)
	nonce := time.Now().UnixNano()
	ask := func(round, times int) {
		for i := range 1100 {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("pf%d-%d-%d.stall.example.org.", nonce, round, i), dns.TypeA)
			b, _ := m.Pack()
			for range times {
				_, _ = c.Write(b)
			}
			if i%32 == 31 {
				time.Sleep(time.Millisecond)
			}
		}
	}
	var wg sync.WaitGroup
	for round := 0; ctx.Err() == nil; round++ {
		ask(round, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(4600 * time.Millisecond):
			}
			ask(round, 2)
		}()
		select {
		case <-ctx.Done():
		case <-time.After(4 * time.Second):
		}
	}
	return func() { wg.Wait(); c.Close() }
}

// cacheChurn: one pod asks 2,500 new names a second, name j of each 10 ms
// batch asked 1 + j%12 times, once per 10 ms: names asked often, by that
// one pod alone, in a stream that fills the cache several times over.
func cacheChurn(ctx context.Context, t *testing.T, d *daemon) func() {
	dst, _ := net.ResolveUDPAddr("udp", d.addr)
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(pod(7, 0))}, dst)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetWriteBuffer(1 << 20)
	go drain(c)
	const perTick, times = 25, 12
	nonce := time.Now().UnixNano()
	var ring [times][perTick][]byte
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for b := 0; ; b++ {
		select {
		case <-ctx.Done():
			return func() { c.Close() }
		case <-tick.C:
		}
		batch := &ring[b%times]
		for j := range perTick {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("c%d-%d-%d.churn.example.net.", nonce, b, j), dns.TypeA)
			batch[j], _ = m.Pack()
			_, _ = c.Write(batch[j])
		}
		for k := 1; k < times && k <= b; k++ {
			for j, q := range ring[(b-k)%times] {
				if j%times >= k {
					_, _ = c.Write(q)
				}
			}
		}
	}
}

// unreadTCP: one pod keeps 100 TCP connections, each pipelining questions
// (8 every 250 ms) whose answers are ~2 KB and not cached, and reads none
// of them; a connection the daemon closes is opened again. They are opened
// over the first second.
func unreadTCP(ctx context.Context, t *testing.T, d *daemon) func() {
	var wg sync.WaitGroup
	nonce := time.Now().UnixNano()
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(pod(8, 0))}, Timeout: time.Second}
			select { // opened over the first second, not in one burst
			case <-ctx.Done():
			case <-time.After(time.Duration(i) * 10 * time.Millisecond):
			}
			var c net.Conn
			for n := 0; ctx.Err() == nil; n++ {
				if c == nil {
					var err error
					if c, err = dl.DialContext(ctx, "tcp", d.addr); err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					_ = c.(*net.TCPConn).SetReadBuffer(4096)
				}
				var frames []byte
				for k := range 8 {
					m := new(dns.Msg)
					m.SetQuestion(fmt.Sprintf("big%d-%d-%d-%d.default.svc.cluster.local.", nonce, i, n, k), dns.TypeTXT)
					b, _ := m.Pack()
					frames = append(binary.BigEndian.AppendUint16(frames, uint16(len(b))), b...)
				}
				_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
				if _, err := c.Write(frames); err != nil && !isTimeout(err) {
					c.Close()
					c = nil
					continue
				}
				select {
				case <-ctx.Done():
				case <-time.After(250 * time.Millisecond):
				}
			}
			if c != nil {
				c.Close()
			}
		}()
	}
	return wg.Wait
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
