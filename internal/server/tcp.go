package server

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// serveTCP accepts connections until the listener closes. Connections over
// MaxTCPConns are closed at once (counted): a client then retries or uses
// UDP, and the server keeps its memory.
func (s *Server) serveTCP(ln net.Listener) {
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: slow down, keep going.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.cfg.Logger.Warn("tcp accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if s.stats.TCPConns.Add(1) > int64(s.cfg.MaxTCPConns) {
			s.stats.TCPConns.Add(-1)
			s.stats.TCPRefused.Add(1)
			_ = c.Close()
			continue
		}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			s.stats.TCPConns.Add(-1)
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			s.stats.TCPConns.Add(-1)
		}()
	}
}

// tcpConn is one client connection: queries are read in order and
// answered as they complete (RFC 7766 §6.2.1.1), hits at once, misses when
// their upstream answers.
type tcpConn struct {
	c       net.Conn
	wmu     sync.Mutex
	pending sync.WaitGroup
	slots   chan struct{}
	timeout time.Duration
}

func (s *Server) serveConn(c net.Conn) {
	tc := &tcpConn{c: c, slots: make(chan struct{}, s.cfg.MaxTCPPipeline), timeout: s.cfg.TCPReadTimeout}
	defer func() {
		// Let outstanding misses write their answers, then close.
		tc.pending.Wait()
		_ = c.Close()
	}()
	r := bufio.NewReaderSize(c, 4096)
	var q wire.Query
	out := make([]byte, 0, 1024)
	buf := make([]byte, 0, 512)
	for {
		if s.closing.Load() {
			return
		}
		// Wait for the next query no longer than the idle timeout; once
		// its first byte is there, the rest must follow within the read
		// timeout (a slow-loris client cannot hold a slot for long).
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		if _, err := r.Peek(1); err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.TCPReadTimeout))
		var lb [2]byte
		if _, err := io.ReadFull(r, lb[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lb[:]))
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		now := s.cfg.Now().UnixNano()
		out = append(out[:0], 0, 0)
		resp, v := s.answerLocal(buf, &q, out, true, now, &s.stats)
		switch v {
		case dropped:
			continue
		case answered:
			out = resp
			if !tc.write(out) {
				return
			}
			continue
		}
		// A miss: resolve it concurrently, bounded per connection.
		select {
		case tc.slots <- struct{}{}:
		default:
			t := time.NewTimer(s.cfg.TCPReadTimeout)
			select {
			case tc.slots <- struct{}{}:
				t.Stop()
			case <-t.C:
				return // the client does not read its answers
			}
		}
		if !s.admit() {
			<-tc.slots
			out = wire.AppendError(append(out[:0], 0, 0), buf, &q, wire.RcodeServFail, s.cfg.MaxUDPSize)
			s.stats.countRcode(wire.RcodeServFail)
			if !tc.write(out) {
				return
			}
			continue
		}
		raw := append([]byte(nil), buf...)
		var mq wire.Query
		_ = wire.ParseQuery(raw, &mq)
		tc.pending.Add(1)
		s.missWG.Add(1)
		go func() {
			defer s.missWG.Done()
			defer tc.pending.Done()
			defer func() { <-tc.slots }()
			defer s.release()
			resp := s.resolve(raw, &mq, make([]byte, 2, 514), true)
			tc.write(resp)
		}()
	}
}

// write sends one answer (out starts with two bytes of room for the length
// prefix) under the connection's write lock.
func (tc *tcpConn) write(out []byte) bool {
	n := len(out) - 2
	if n > 0xFFFF {
		return false
	}
	binary.BigEndian.PutUint16(out, uint16(n))
	tc.wmu.Lock()
	defer tc.wmu.Unlock()
	_ = tc.c.SetWriteDeadline(time.Now().Add(tc.timeout))
	_, err := tc.c.Write(out)
	return err == nil
}
