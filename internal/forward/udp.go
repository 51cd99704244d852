package forward

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// udpBufSize is the receive buffer of a UDP try for a query advertising 1232 bytes (what the
// server advertises upstream by default, -max-udp-size), plus one: an answer that fills the
// buffer is larger than we asked for, so it is treated as truncated and asked over TCP. A
// buffer held while the try waits costs 1.2 KB, not 64 KB: 1000 misses in flight hold 1.2 MB.
const udpBufSize = 1232 + 1

// udpBufs holds receive buffers of udpBufSize; a query advertising more gets a buffer of its own.
var udpBufs = sync.Pool{New: func() any { b := make([]byte, udpBufSize); return &b }}

// errOversized: a UDP answer with our ID filled the receive buffer, so it is larger than the
// size the query advertised. It is asked again over TCP, as a truncated one.
var errOversized = errors.New("UDP answer larger than the advertised size")

// Idle UDP sockets kept per upstream, and how many queries one socket
// carries before it is replaced. Opening a socket per query (socket,
// connect, poller registration, close: about ten syscalls) was most of the
// cost of a miss to the node's resolvers. Reuse keeps RFC 5452's defence:
// each query still has a random ID, the ports are random (kernel-chosen)
// and change every udpSocketUses queries, and at most udpIdleSockets of
// them are idle at a time (256: the misses a busy node has in flight). A
// socket whose query failed is never reused: a late answer could arrive on
// it.
const (
	udpIdleSockets = 256
	udpSocketUses  = 64
)

// udpSockets is the free list of one upstream's connected UDP sockets.
type udpSockets struct {
	mu     sync.Mutex
	idle   []*udpSocket
	closed bool
}

type udpSocket struct {
	nc   net.Conn
	uses int
}

func (p *udpSockets) get(ctx context.Context, addr string) (*udpSocket, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return s, nil
	}
	p.mu.Unlock()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return nil, err
	}
	return &udpSocket{nc: nc}, nil
}

// put returns a socket whose query was answered, or closes it.
func (p *udpSockets) put(s *udpSocket) {
	s.uses++
	p.mu.Lock()
	if !p.closed && s.uses < udpSocketUses && len(p.idle) < udpIdleSockets {
		p.idle = append(p.idle, s)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	_ = s.nc.Close()
}

func (p *udpSockets) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, s := range idle {
		_ = s.nc.Close()
	}
}

// exchangeUDP sends query from a connected socket (a kernel-chosen random
// source port, see udpSockets) with a random ID, and reads until a valid
// answer or the deadline. Packets that are not the answer (garbage,
// another ID, another question) are counted and ignored, not accepted: with
// the random ID and port this is the spoofing defence of RFC 5452. A
// truncated answer is returned as is.
func (g *Group) exchangeUDP(ctx context.Context, u *upstream, query []byte, q question) ([]byte, error) {
	sock, err := u.udp.get(ctx, u.name)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", u.name, err)
	}
	ans, reuse, err := g.exchangeOn(ctx, sock.nc, u, query, q)
	if err != nil || !reuse {
		_ = sock.nc.Close()
		return ans, err
	}
	u.udp.put(sock)
	return ans, nil
}

// The try ends at ctx's deadline or after the group's TryTimeout, whichever comes first, or
// when ctx is cancelled. On the real clock the try's bound is the socket's deadline; on another
// clock (tests) a timer on that clock ends the read. reuse, decided on the way out, says whether
// the socket may serve another query: not while a timer may still move its deadline.
func (g *Group) exchangeOn(ctx context.Context, nc net.Conn, u *upstream, query []byte, q question) (ans []byte, reuse bool, err error) {
	dl, hasDL := ctx.Deadline()
	var tryTimer clock.Timer
	var timedOut atomic.Bool // set by tryTimer
	if !hasDL || time.Until(dl) > g.cfg.TryTimeout {
		if g.clk == clock.Real {
			dl = time.Now().Add(g.cfg.TryTimeout)
		} else {
			tryTimer = g.clk.AfterFunc(g.cfg.TryTimeout, func() {
				timedOut.Store(true)
				nc.SetReadDeadline(time.Now())
			})
		}
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) }) // cancellation before the deadline
	defer func() {
		// A socket whose deadline a timer may still move is not reused.
		reuse = stop()
		if tryTimer != nil && !tryTimer.Stop() {
			reuse = false
		}
	}()
	if err := nc.SetDeadline(dl); err != nil {
		return nil, false, fmt.Errorf("set deadline: %w", err)
	}

	var buf []byte
	if q.size+1 <= udpBufSize {
		bp := udpBufs.Get().(*[]byte)
		defer udpBufs.Put(bp)
		buf = *bp
	} else {
		buf = make([]byte, q.size+1)
	}
	// The query goes out from the receive buffer, free until the answer comes.
	out := append(buf[:0], query...)
	id := uint16(rand.Uint32())
	wire.SetID(out, id)
	if _, err := nc.Write(out); err != nil {
		return nil, false, fmt.Errorf("send to %s: %w", u.name, err)
	}
	for {
		n, err := nc.Read(buf)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				err = context.Cause(ctx)
			case timedOut.Load() || errors.Is(err, os.ErrDeadlineExceeded):
				err = errTryTimeout // the try's own bound, as when it had a context
			}
			return nil, false, fmt.Errorf("read from %s: %w", u.name, err)
		}
		msg := buf[:n]
		if n == len(buf) && wire.ID(msg) == id && wire.Flags(msg)&wire.FlagQR != 0 {
			return nil, false, fmt.Errorf("answer from %s: %w (%d)", u.name, errOversized, q.size)
		}
		if err := matchAnswer(msg, id, q); err != nil {
			if truncatedWithoutQuestion(msg, id) {
				return append([]byte(nil), msg...), false, nil
			}
			// Not the answer to this query (spoofed, stray or garbage): count it and keep
			// listening for the real one.
			g.obs.Failure(g.name, u.name, failureKind(err))
			continue
		}
		// The answer: if it is malformed inside, the try fails (the next server is asked).
		if err := wire.CheckMessage(msg); err != nil {
			return nil, false, fmt.Errorf("answer from %s: %w: %w", u.name, errMalformed, err)
		}
		return append([]byte(nil), msg...), false, nil
	}
}

// exchangeTCPOnce sends one query over a fresh TCP connection and reads its answer: the re-ask
// after a truncated UDP answer, rare enough not to need a pool.
func exchangeTCPOnce(ctx context.Context, addr string, query []byte, q question) ([]byte, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := nc.SetDeadline(dl); err != nil {
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()

	id := uint16(rand.Uint32())
	frame := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(frame, uint16(len(query)))
	copy(frame[2:], query)
	wire.SetID(frame[2:], id)
	if _, err := nc.Write(frame); err != nil {
		return nil, tcpOnceErr(ctx, "send to", addr, err)
	}
	var size [2]byte
	if _, err := io.ReadFull(nc, size[:]); err != nil {
		return nil, tcpOnceErr(ctx, "read from", addr, err)
	}
	ans, err := readGrowing(nc, int(binary.BigEndian.Uint16(size[:])))
	if err != nil {
		return nil, tcpOnceErr(ctx, "read from", addr, err)
	}
	if err := checkAnswer(ans, id, q); err != nil {
		return nil, fmt.Errorf("answer from %s over TCP: %w", addr, err)
	}
	return ans, nil
}

// readGrowing reads exactly size bytes from r into a buffer that grows with the bytes received,
// not with the length the peer announced: a lying length prefix costs nothing until the data
// arrives.
func readGrowing(r io.Reader, size int) ([]byte, error) {
	buf := make([]byte, min(size, readBufStart))
	n := 0
	for n < size {
		if n == len(buf) {
			buf = append(buf, make([]byte, min(len(buf), size-len(buf)))...)
		}
		m, err := r.Read(buf[n:])
		n += m
		if err != nil && n < size {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return buf, nil
}

func tcpOnceErr(ctx context.Context, op, addr string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s %s over TCP: %w", op, addr, context.Cause(ctx))
	case peerClosed(err):
		return fmt.Errorf("%w: %s %s over TCP: %w", errPeerClosed, op, addr, err)
	}
	return fmt.Errorf("%s %s over TCP: %w", op, addr, err)
}
