package dnstap

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults and bounds, CoreDNS 1.13's (plugin/dnstap/setup.go, io.go)
// where it has them.
const (
	// QueueUnit is what the queue multiple multiplies: CoreDNS's queue
	// of 10,000 messages.
	QueueUnit = 10000
	// MaxQueueMultiple and MaxWriteBufferMiB are CoreDNS's bounds of the
	// two optional arguments.
	MaxQueueMultiple  = 4096
	MaxWriteBufferMiB = 1024
	// MaxQueueBytes bounds the bytes waiting in the queues of every tap
	// of one owner together (Totals.Queued), besides each queue's count (CoreDNS has
	// only the count): 10,000 `full` messages of large answers would
	// otherwise hold hundreds of MiB while a collector is slow. A message
	// past it is dropped and counted (docs/design.md, "The bounds add up").
	MaxQueueBytes = 16 << 20
	// MaxQueueLen bounds one queue's length whatever QUEUE says (CoreDNS
	// takes up to 4096 × 10,000): a queue is a channel whose slots (24
	// bytes each) are allocated when the tap starts, so 2 × 10,000 at
	// most (480 KiB); -check-config and the start notes say so.
	MaxQueueLen = 2 * QueueUnit
	// MaxTaps bounds the distinct dnstap directives of a configuration
	// (each a queue, a connection and a goroutine).
	MaxTaps = 16
	// ioTimeout is CoreDNS's tcpTimeout: dialing, the handshake and each
	// write. A collector that stops reading for that long loses its
	// connection (and what was being written to it) and is dialed again.
	ioTimeout = 4 * time.Second
	// Redialing backs off from minBackoff to maxBackoff (CoreDNS redials
	// every 10 s, and at once after a failed write).
	minBackoff = 250 * time.Millisecond
	maxBackoff = 10 * time.Second
	// writeBuffer is the writer's own buffer; it is flushed whenever the
	// queue runs empty, so a frame waits at most until then.
	writeBuffer = 64 << 10
)

// Config is one dnstap directive.
type Config struct {
	// Network is "unix", "tcp" or "tls"; Address a path or host:port.
	Network, Address string
	// Full: the DNS messages are sent too.
	Full bool
	// WriteBufferMiB is the TCP connection's send buffer in MiB (1 to
	// 1024; 0: 1); QueueMultiple the queue's length in 10,000 messages
	// (1 to 4096; 0: 1).
	WriteBufferMiB, QueueMultiple int
	// Identity and Version are the messages' fields; Extra, when not
	// empty, the extra field.
	Identity, Version, Extra string
	// SkipVerify: a tls:// collector's certificate is not verified.
	SkipVerify bool
}

// Endpoint is the configuration's endpoint as written in the logs.
func (c Config) Endpoint() string { return c.Network + "://" + c.Address }

// Key identifies a configuration: taps with equal keys are the same.
// QueueLen is the queue's length: QueueMultiple × QueueUnit (1 × when 0),
// at most MaxQueueLen.
func (c Config) QueueLen() int {
	return min(max(c.QueueMultiple, 1)*QueueUnit, MaxQueueLen)
}

func (c Config) Key() string {
	return fmt.Sprintf("%s %v %d %d %q %q %q %v", c.Endpoint(), c.Full, c.WriteBufferMiB, c.QueueMultiple, c.Identity, c.Version, c.Extra, c.SkipVerify)
}

// Hostname is CoreDNS's default identity.
func Hostname() string {
	h, _ := os.Hostname()
	return h
}

// DefaultVersion is the version field when the directive sets none:
// "nodelocaldns-" and the module version (CoreDNS sends "CoreDNS-" and
// its own).
func DefaultVersion() string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return "nodelocaldns-" + v
}

// Totals are the messages of the taps one owner runs (the daemon's running
// configuration, across its reloads: answer.Env.Stats): written to
// collectors and dropped (a full queue, no connection, a failed write),
// for nodelocaldns_dnstap_messages_total, and the bytes waiting in all
// their queues (MaxQueueBytes). Not a package variable: two daemons in one
// process (tests) count apart.
type Totals struct {
	Sent, Dropped atomic.Uint64
	Queued        atomic.Int64
}

// Tap sends one directive's messages. Safe for concurrent use.
type Tap struct {
	cfg                      Config
	identity, version, extra []byte
	log                      *slog.Logger
	q                        chan []byte
	qBytes                   atomic.Int64
	quit                     chan struct{}
	done                     chan struct{}
	closeOnce                sync.Once
	sent, dropped            atomic.Uint64
	totals                   *Totals // the owner's
	connected                atomic.Bool
	dial                     func() (net.Conn, error)
}

// New starts a tap: its writer connects in the background. log gets its
// state changes (nil: slog.Default()); totals its owner's counts and
// bound (nil: its own).
func New(cfg Config, log *slog.Logger, totals *Totals) *Tap {
	if totals == nil {
		totals = &Totals{}
	}
	if log == nil {
		log = slog.Default()
	}
	t := &Tap{
		cfg:      cfg,
		identity: []byte(cfg.Identity),
		version:  []byte(cfg.Version),
		log:      log.With("dnstap", cfg.Endpoint()),
		q:        make(chan []byte, cfg.QueueLen()),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		totals:   totals,
	}
	if cfg.Extra != "" {
		t.extra = []byte(cfg.Extra)
	}
	t.dial = t.dialConfig
	go t.run()
	return t
}

// Full reports whether the tap sends the DNS messages.
func (t *Tap) Full() bool { return t.cfg.Full }

// Config is the tap's configuration.
func (t *Tap) Config() Config { return t.cfg }

// Stats are the tap's own counts: written, dropped.
func (t *Tap) Stats() (sent, dropped uint64) { return t.sent.Load(), t.dropped.Load() }

// Connected reports whether the tap has a collector now.
func (t *Tap) Connected() bool { return t.connected.Load() }

// Send encodes m and queues it; it never blocks. m and its buffers may be
// reused once it returns. A nil Tap sends nothing.
func (t *Tap) Send(m *Message) {
	if t == nil {
		return
	}
	n := 128 + len(t.identity) + len(t.version) + len(t.extra) // the fields: at most 100 bytes (IPv6 addresses)
	if t.cfg.Full {
		n += len(m.QueryMessage) + len(m.ResponseMessage)
	}
	if t.totals.Queued.Load()+int64(n) > MaxQueueBytes {
		t.drop(1)
		return
	}
	b := appendMessage(make([]byte, 0, n), m, t.identity, t.version, t.extra, t.cfg.Full)
	t.queue(int64(len(b)))
	select {
	case t.q <- b:
	default:
		t.queue(-int64(len(b)))
		t.drop(1)
	}
}

// queue counts n bytes into (or, negative, out of) the tap's queue.
func (t *Tap) queue(n int64) {
	t.qBytes.Add(n)
	t.totals.Queued.Add(n)
}

func (t *Tap) drop(n int) {
	t.dropped.Add(uint64(n))
	t.totals.Dropped.Add(uint64(n))
}

// Close stops the writer: what is queued is written if the collector
// takes it within the write timeout, then STOP is sent and the connection
// closed. It waits for that.
func (t *Tap) Close() {
	if t == nil {
		return
	}
	t.closeOnce.Do(func() { close(t.quit) })
	<-t.done
	for { // what was not written leaves the process's count
		select {
		case b := <-t.q:
			t.queue(-int64(len(b)))
		default:
			return
		}
	}
}

func (t *Tap) dialConfig() (net.Conn, error) {
	d := &net.Dialer{Timeout: ioTimeout}
	var c net.Conn
	var err error
	switch t.cfg.Network {
	case "tls":
		c, err = tls.DialWithDialer(d, "tcp", t.cfg.Address, &tls.Config{InsecureSkipVerify: t.cfg.SkipVerify, MinVersion: tls.VersionTLS12})
	default:
		c, err = d.Dial(t.cfg.Network, t.cfg.Address)
	}
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		mib := t.cfg.WriteBufferMiB
		if mib <= 0 {
			mib = 1
		}
		_ = tc.SetWriteBuffer(mib << 20)
		_ = tc.SetNoDelay(false)
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if err := handshake(c); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// run is the writer: connect, write, reconnect with backoff.
func (t *Tap) run() {
	defer close(t.done)
	backoff := minBackoff
	failing := false
	for {
		c, err := t.dial()
		if err != nil {
			if !failing {
				t.log.Warn("dnstap: no connection to the collector; messages are dropped until one", "err", err)
				failing = true
			}
			if t.discard(backoff) {
				return
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		}
		failing, backoff = false, minBackoff
		t.connected.Store(true)
		t.log.Info("dnstap: connected to the collector")
		err = t.write(c)
		t.connected.Store(false)
		if err == nil {
			return
		}
		t.log.Warn("dnstap: connection to the collector lost", "err", err)
	}
}

// discard drops what is queued (counted) for d, or until Close (true).
func (t *Tap) discard(d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	for {
		select {
		case b := <-t.q:
			t.queue(-int64(len(b)))
			t.drop(1)
		case <-tm.C:
			return false
		case <-t.quit:
			return true
		}
	}
}

// write writes queued messages to c until Close (nil) or an error; c is
// closed when it returns.
func (t *Tap) write(c net.Conn) error {
	defer c.Close()
	bw := bufio.NewWriterSize(c, writeBuffer)
	pending := 0 // written into bw, not yet flushed
	flush := func() error {
		if pending == 0 {
			return nil
		}
		_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
		err := bw.Flush()
		if err != nil {
			t.drop(pending)
		} else {
			t.sent.Add(uint64(pending))
			t.totals.Sent.Add(uint64(pending))
		}
		pending = 0
		return err
	}
	var h [4]byte
	for {
		var b []byte
		select {
		case <-t.quit:
			return t.stop(c, bw)
		default:
		}
		select {
		case b = <-t.q:
		default:
			if err := flush(); err != nil {
				return err
			}
			select {
			case b = <-t.q:
			case <-t.quit:
				return t.stop(c, bw)
			}
		}
		t.queue(-int64(len(b)))
		binary.BigEndian.PutUint32(h[:], uint32(len(b)))
		_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
		pending++
		if _, err := bw.Write(h[:]); err != nil {
			t.drop(pending)
			return err
		}
		if _, err := bw.Write(b); err != nil {
			t.drop(pending)
			return err
		}
		if bw.Buffered() < len(b)+4 {
			// bufio wrote what came before this frame through.
			t.sent.Add(uint64(pending - 1))
			t.totals.Sent.Add(uint64(pending - 1))
			pending = 1
		}
	}
}

// stop writes what is still queued, then STOP, and waits for FINISH
// (within the timeout).
func (t *Tap) stop(c net.Conn, bw *bufio.Writer) error {
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	pending := 0
	var h [4]byte
	for more := true; more; {
		select {
		case b := <-t.q:
			t.queue(-int64(len(b)))
			binary.BigEndian.PutUint32(h[:], uint32(len(b)))
			_, _ = bw.Write(h[:])
			_, _ = bw.Write(b)
			pending++
		default:
			more = false
		}
	}
	_, _ = bw.Write(appendControl(nil, ctrlStop, ""))
	if err := bw.Flush(); err != nil {
		t.drop(pending)
		return nil
	}
	t.sent.Add(uint64(pending))
	t.totals.Sent.Add(uint64(pending))
	_, _, _ = readControl(c) // FINISH
	return nil
}

// ParseEndpoint maps a dnstap SOCKET argument as CoreDNS reads it:
// tls://HOST:PORT, tcp://HOST:PORT, else a unix socket path (with or
// without unix://).
func ParseEndpoint(s string) (network, address string, err error) {
	for _, p := range []string{"tls", "tcp"} {
		if rest, ok := cutPrefix(s, p+"://"); ok {
			host, port, err := net.SplitHostPort(rest)
			if err != nil || host == "" {
				return "", "", fmt.Errorf("%s: want %s://HOST:PORT", s, p)
			}
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return "", "", fmt.Errorf("%s: invalid port %q", s, port)
			}
			return p, rest, nil
		}
	}
	path, _ := cutPrefix(s, "unix://")
	if path == "" {
		return "", "", errors.New("an empty socket path")
	}
	return "unix", path, nil
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return s, false
}
