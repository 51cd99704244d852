package server

import (
	"encoding/binary"
	"net"
	"time"
	"unsafe"

	"github.com/nodelocaldns/nodelocaldns/internal/fair"
)

// A miss's answer to a TCP client waits in its connection's queue, and the
// connection's one writer goroutine (made when the queue gets its first
// answer, gone when it is empty) writes what is there with one writev. An
// answer never has a goroutine of its own: a client that pipelines
// queries and never reads costs its connection's writer and the answers
// queued, which the bound on TCP answers (MaxTCPAnswerBytes, by client
// share) counts whole: the request with its buffers, not only the bytes
// of the answer, and the writer while it runs (issue 37: a goroutine per
// pending answer had one pod hold 6,700 of them and 80 MiB where the
// budget said 8).

// missCost is what a pending TCP answer holds beside its buffers: the
// request (its struct, the pooled query and answer buffers are counted by
// their capacity) and its slot in the queue.
const missCost = int(unsafe.Sizeof(missReq{})) + 8

// answerKiB is what m, a miss's answer waiting to be written, counts
// against MaxTCPAnswerBytes: its request and buffers, in KiB rounded up.
func answerKiB(m *missReq) int {
	return (cap(m.out) + cap(m.raw) + missCost + 1023) >> 10
}

// writerKiB is what a connection's writer counts against
// MaxTCPAnswerBytes while it runs: its goroutine's stack, grown once.
const writerKiB = 8

// deliverTCP queues a miss's answer for its connection's writer, within
// the bound on TCP answers waiting to be written (MaxTCPAnswerBytes, by
// client share). An answer that would pass it, or its client's share
// while only the reserve is free, is dropped and its connection closed: a
// client whose answers pile up does not read them, and what it leaves
// unread must not grow without bound.
func (s *Server) deliverTCP(m *missReq) {
	tc := m.tc
	if len(m.out) <= 2 { // only the length's room: dropped (autopath.go)
		tc.done(m)
		return
	}
	if n := len(m.out) - 2; n <= 0xFFFF {
		binary.BigEndian.PutUint16(m.out, uint16(n))
	} else {
		m.out = m.out[:2] // cannot be framed: dropped, and the connection with it
		_ = tc.c.Close()
		tc.done(m)
		return
	}
	kib := answerKiB(m)
	tc.qmu.Lock() // then tcpOutMu: the writer never holds both
	start := !tc.writing
	if start {
		kib += writerKiB
	}
	s.tcpOutMu.Lock()
	v := s.tcpOut.TakeN(tc.key, kib)
	s.tcpOutMu.Unlock()
	if v != fair.Taken {
		tc.qmu.Unlock()
		s.stats.TCPAnswerDrops.Add(1)
		_ = tc.c.Close()
		tc.done(m)
		return
	}
	tc.queue = append(tc.queue, m)
	tc.writing = true
	tc.qmu.Unlock()
	if start {
		go s.writeAnswers(tc)
	}
}

// writeAnswers is a connection's writer: it writes the queued answers,
// as many as are there at once, until the queue is empty. After a failed
// write (the client does not read within the write timeout, or is gone)
// the connection is closed and what is queued is dropped.
func (s *Server) writeAnswers(tc *tcpConn) {
	var bufs net.Buffers
	var batch []*missReq
	for {
		tc.qmu.Lock()
		batch = append(batch[:0], tc.queue...)
		clear(tc.queue)
		tc.queue = tc.queue[:0]
		broken := tc.broken
		if len(batch) == 0 {
			tc.writing = false
			tc.queue = nil // a burst's backing array goes with it
			tc.qmu.Unlock()
			s.tcpOutMu.Lock()
			s.tcpOut.PutN(tc.key, writerKiB)
			s.tcpOutMu.Unlock()
			return
		}
		tc.qmu.Unlock()
		if !broken {
			bufs = bufs[:0]
			for _, m := range batch {
				bufs = append(bufs, m.out)
			}
			wb := bufs // WriteTo consumes its slice
			if !tc.writeBuffers(&wb) {
				_ = tc.c.Close()
				tc.qmu.Lock()
				tc.broken = true
				tc.qmu.Unlock()
			}
		}
		for i, m := range batch {
			s.tcpOutMu.Lock()
			s.tcpOut.PutN(tc.key, answerKiB(m))
			s.tcpOutMu.Unlock()
			tc.done(m)
			batch[i] = nil
		}
	}
}

// done frees m's pipeline slot, counts its answer as given and returns it
// to the pool.
func (tc *tcpConn) done(m *missReq) {
	<-tc.slots
	tc.pending.Done()
	putMiss(m)
}

// writeBuffers sends length-prefixed answers (one writev) under the
// connection's write lock.
func (tc *tcpConn) writeBuffers(b *net.Buffers) bool {
	tc.wmu.Lock()
	defer tc.wmu.Unlock()
	_ = tc.c.SetWriteDeadline(time.Now().Add(tc.wtimeout))
	_, err := b.WriteTo(tc.c)
	return err == nil
}
