package dnstap

import (
	"bytes"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// collector listens on network/addr and decodes every frame it gets.
type collector struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	got   []Decoded
	err   []error
}

func listen(t *testing.T, network, addr string) *collector {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{ln: ln}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
			go func() {
				defer conn.Close()
				err := Collect(conn, func(p []byte) {
					d, err := Decode(bytes.Clone(p))
					c.mu.Lock()
					defer c.mu.Unlock()
					if err != nil {
						c.err = append(c.err, err)
						return
					}
					c.got = append(c.got, d)
				})
				if err != nil {
					c.mu.Lock()
					c.err = append(c.err, err)
					c.mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return c
}

// stop closes the listener and every connection: the collector is gone.
func (c *collector) stop() {
	c.ln.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
}

func (c *collector) frames() []Decoded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Decoded(nil), c.got...)
}

// waitFor polls until the collector holds n frames.
func (c *collector) waitFor(t *testing.T, n int) []Decoded {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if f := c.frames(); len(f) >= n {
			return f
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("collector has %d frames, want %d", len(c.frames()), n)
	return nil
}

func TestRoundTripUnixAndTCP(t *testing.T) {
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = filepath.Join(t.TempDir(), "tap.sock")
			}
			c := listen(t, network, addr)
			tap := New(Config{Network: network, Address: c.ln.Addr().String(), Full: true, Identity: "node-a", Version: "v1", Extra: "x=1"}, nil, nil)
			q := time.Unix(1700000000, 123456789)
			r := q.Add(time.Millisecond)
			ms := []Message{
				{Type: ClientQuery, Query: netip.MustParseAddrPort("10.0.0.5:40000"), QueryTime: q, QueryMessage: []byte{1, 2, 3}},
				{Type: ForwarderQuery, TCP: true, Query: netip.MustParseAddrPort("[fd00::5]:40001"), Response: netip.MustParseAddrPort("10.96.0.10:53"), QueryTime: q, QueryMessage: []byte{4}},
				{Type: ForwarderResponse, TCP: true, Query: netip.MustParseAddrPort("[fd00::5]:40001"), Response: netip.MustParseAddrPort("10.96.0.10:53"), QueryTime: q, ResponseTime: r, ResponseMessage: []byte{5, 6}},
				{Type: ClientResponse, Query: netip.MustParseAddrPort("10.0.0.5:40000"), QueryTime: q, ResponseTime: r, ResponseMessage: []byte{7}},
			}
			for i := range ms {
				tap.Send(&ms[i])
			}
			got := c.waitFor(t, len(ms))
			tap.Close()
			for i, d := range got {
				w := ms[i]
				if d.Type != w.Type || d.TCP != w.TCP || d.Query != w.Query || d.Response != w.Response ||
					!d.QueryTime.Equal(w.QueryTime) || !d.ResponseTime.Equal(w.ResponseTime) ||
					!bytes.Equal(d.QueryMessage, w.QueryMessage) || !bytes.Equal(d.ResponseMessage, w.ResponseMessage) ||
					string(d.Identity) != "node-a" || string(d.Version) != "v1" || string(d.Extra) != "x=1" {
					t.Errorf("frame %d: got %+v, want %+v", i, d, w)
				}
			}
			if s, dr := tap.Stats(); s != uint64(len(ms)) || dr != 0 {
				t.Errorf("sent %d dropped %d", s, dr)
			}
		})
	}
}

// TestNotFullLeavesMessagesOut: without full, no DNS message is sent.
func TestNotFullLeavesMessagesOut(t *testing.T) {
	c := listen(t, "unix", filepath.Join(t.TempDir(), "tap.sock"))
	tap := New(Config{Network: "unix", Address: c.ln.Addr().String()}, nil, nil)
	defer tap.Close()
	tap.Send(&Message{Type: ClientResponse, QueryMessage: []byte{1}, ResponseMessage: []byte{2}, QueryTime: time.Now()})
	d := c.waitFor(t, 1)[0]
	if d.HasQueryMessage || d.HasResponseMessage || d.Extra != nil {
		t.Errorf("got %+v", d)
	}
}

// TestCollectorThatStopsReadingBlocksNothing: a collector that accepts
// and never reads: Send never blocks, what does not fit is dropped and
// counted.
func TestCollectorThatStopsReadingBlocksNothing(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "tap.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// The handshake, then nothing is read.
			go func() {
				_, _, _ = readControl(c)
				_, _ = c.Write(appendControl(nil, ctrlAccept, ContentType))
				_, _, _ = readControl(c)
			}()
		}
	}()
	tap := New(Config{Network: "unix", Address: ln.Addr().String(), Full: true}, nil, nil)
	defer tap.Close()
	m := &Message{Type: ClientResponse, QueryTime: time.Now(), ResponseMessage: make([]byte, 1000)}
	start := time.Now()
	const n = 100000
	for range n {
		tap.Send(m)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%d sends took %v", n, d)
	}
	_, dropped := tap.Stats()
	if dropped == 0 {
		t.Errorf("nothing dropped with a collector that reads nothing")
	}
}

// TestCollectorComesBack: frames flow again after the collector was
// gone, and what was sent meanwhile is counted dropped.
func TestCollectorComesBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tap.sock")
	c := listen(t, "unix", path)
	tap := New(Config{Network: "unix", Address: path}, nil, nil)
	defer tap.Close()
	m := &Message{Type: ClientQuery, QueryTime: time.Now()}
	tap.Send(m)
	c.waitFor(t, 1)
	c.stop()
	deadline := time.Now().Add(10 * time.Second)
	// The tap notices when a write fails; keep sending until it has.
	for tap.Connected() && time.Now().Before(deadline) {
		tap.Send(m)
		time.Sleep(20 * time.Millisecond)
	}
	c2 := listen(t, "unix", path)
	for len(c2.frames()) == 0 && time.Now().Before(deadline) {
		tap.Send(m)
		time.Sleep(20 * time.Millisecond)
	}
	if len(c2.frames()) == 0 {
		t.Fatal("no frame reached the collector that came back")
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, c := range []struct{ in, net, addr string }{
		{"/tmp/x.sock", "unix", "/tmp/x.sock"},
		{"unix:///tmp/x.sock", "unix", "/tmp/x.sock"},
		{"tcp://127.0.0.1:6000", "tcp", "127.0.0.1:6000"},
		{"tls://collector.example:6000", "tls", "collector.example:6000"},
		{"tcp://[::1]:6000", "tcp", "[::1]:6000"},
	} {
		n, a, err := ParseEndpoint(c.in)
		if err != nil || n != c.net || a != c.addr {
			t.Errorf("%s: %s %s %v", c.in, n, a, err)
		}
	}
	for _, bad := range []string{"tcp://127.0.0.1", "tcp://:53", "tls://h:0", "unix://"} {
		if _, _, err := ParseEndpoint(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func BenchmarkSend(b *testing.B) {
	tap := &Tap{cfg: Config{Full: true}, q: make(chan []byte, 1<<20), identity: []byte("node"), version: []byte("v")}
	m := &Message{Type: ClientResponse, Query: netip.MustParseAddrPort("10.0.0.1:5353"), QueryTime: time.Now(), ResponseTime: time.Now(), QueryMessage: make([]byte, 40), ResponseMessage: make([]byte, 80)}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tap.Send(m)
		if len(tap.q) > 1<<19 || tap.qBytes.Load() > MaxQueueBytes/2 {
			for len(tap.q) > 0 {
				<-tap.q
			}
			tap.qBytes.Store(0)
		}
	}
}
