package server

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// missReq carries one miss off the reading goroutine, UDP or TCP: copies
// of the query (the read buffers are reused at once), where the answer
// goes, and the answer.
type missReq struct {
	raw []byte
	q   wire.Query
	out []byte // the answer; over TCP it starts with the 2-byte length
	t0  time.Time
	tcp bool
	// source says where the answer came from.
	source answer.Source
	// res is the resolver of the query's view and blk its block, as the
	// query found them when it arrived (request); a is what blk.Answer's
	// handlers see.
	res *resolve.Resolver
	blk *resolve.Block
	a   answer.Request
	// UDP: the socket and the client's raw sockaddr.
	l    *udpListener
	name [unix.SizeofSockaddrAny]byte
	nlen uint32
	// The wildcard socket's: the control message the answer is sent with
	// (clen 0: none).
	ctl  [pktinfoLen]byte
	clen uint32
	// TCP: the connection.
	tc *tcpConn
	// cdk: the query's CoreDNS-named counters (stats.go); cdSelf: the
	// answer is our SERVFAIL, not the block's.
	cdk    cdKey
	cdSelf bool
	// undecorated: the answer is a SERVFAIL after a recovered panic, which
	// the block's handlers do not see (guard.go).
	undecorated bool
	// srv: the server, for Resolved; async: the answer is sent from the
	// goroutine that read it from the upstream (Resolved), which must
	// not yield before it sends (reply).
	srv   *Server
	async bool
}

var missPool = sync.Pool{New: func() any {
	return &missReq{raw: make([]byte, 0, 512), out: make([]byte, 0, 1232)}
}}

// putMiss returns m to the pool unless it grew past a UDP answer.
func putMiss(m *missReq) {
	if cap(m.out) <= udpOutSize && cap(m.raw) <= udpBufSize {
		m.l, m.tc, m.srv, m.res, m.blk, m.a = nil, nil, nil, nil, nil, answer.Request{}
		missPool.Put(m)
	}
}

func (m *missReq) client() netip.AddrPort {
	if m.tcp {
		return remoteAddrPort(m.tc.c)
	}
	return sockaddrAddrPort(m.name[:m.nlen])
}

// newMiss copies r, a query that missed, for the miss path (its query,
// its block, what its handlers see); the caller sets the destination (l
// and name, or tc). The copy is not parsed again: its slices are moved
// onto the copied bytes (wire.Query.Rebase).
func newMiss(r *request) *missReq {
	m := missPool.Get().(*missReq)
	m.raw = append(m.raw[:0], r.raw...)
	m.q = r.q
	m.q.Rebase(m.raw)
	m.tcp, m.t0 = r.tcp, r.t
	m.res, m.blk = r.res, r.blk
	m.cdk, m.cdSelf, m.async, m.undecorated = r.k, false, false, false
	if r.cd.c == nil {
		m.cdk = cdKey{zone: -1}
	}
	if r.blk != nil && r.blk.Answer != nil {
		m.a = r.a
		m.a.Q, m.a.Raw = &m.q, m.raw
	}
	m.out = m.out[:0]
	if r.tcp {
		m.out = append(m.out, 0, 0)
	}
	return m
}

// startMiss is the one miss path of UDP and TCP. The caller holds what the
// destination needs until deliver (the UDP socket's reference, the TCP
// connection's pipeline slot). Past MaxWaiting the client is answered at
// once (stale or SERVFAIL), and so is a client past its share of it while
// only the reserve is free (package fair). Otherwise the Resolver takes the miss without
// blocking (resolve.Resolver.Start): no goroutine waits for it, and the
// goroutine that reads the upstream's answer writes the client's
// (Resolved). What Start leaves to the blocking path (a stale entry to
// weigh against its refresh, an autopath candidate, a fetch that is not a
// plain forward) goes to a miss worker. It reports whether it made a
// goroutine runnable (a miss worker), which the UDP receive loop must
// yield to (serveUDP). m is not the caller's any more.
func (s *Server) startMiss(m *missReq) (ready bool) {
	// A panic before m is handed on (to the Resolver, a miss worker or
	// finishMiss) answers it SERVFAIL here; after, m is not ours to answer.
	handed, admitted := false, false
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Miss, p, m.raw)
			if !handed {
				if admitted {
					s.release(m.q.Client)
				}
				s.finishMiss(s.recoveredMiss(m))
			}
		}
	}()
	if !m.tcp {
		// Every miss knows its client: the shares of the waiting and the
		// flight bounds are per client (its key: the node's by port,
		// package fair); over TCP the connection's.
		ap := m.client()
		m.q.From, m.q.Client = ap.Addr(), s.cfg.Clients.Key(ap.Addr(), ap.Port())
	}
	if len(m.blk.Answer.Forwarders()) > 0 {
		// The client's port goes with the question to its upstream fetch
		// (dnstap's FORWARDER_* name the first asker, as CoreDNS's do).
		m.q.FromPort = m.client().Port()
	}
	if !s.admit(m.q.Client) {
		m.source = answer.FromOverload
		m.out = s.shed(m)
		handed = true
		s.finishMiss(m)
		return false
	}
	admitted = true
	if !s.isCandidate(&m.q) {
		m.srv, m.async = s, true
		s.missWG.Add(1)
		handed = true // Start may call Resolved before it returns
		e, how, err := m.res.Start(&m.q, m.blk, m)
		switch how {
		case resolve.Later:
			return false // m is Resolved's
		case resolve.Now: // known at once: answered as if it had come later
			m.Resolved(e, err)
			return false
		}
		m.async = false
		s.missWG.Done()
	}
	handed = true
	select {
	case s.missQ <- m: // an idle miss worker took it
	default:
		s.missWG.Add(1)
		go s.missWorker(m)
	}
	return true
}

// missWorkerIdle is how long a miss worker waits for another miss before it
// exits. Workers are reused because a new goroutine's stack starts small
// and the miss path is deep: nearly every miss on a fresh goroutine copied
// its stack once or more (runtime.newstack and copystack were about a third
// of a miss's instructions under callgrind). Their number is bounded by
// -max-waiting (admit), and 5 s lets them serve the next burst without
// keeping a past burst's stacks for long.
const missWorkerIdle = 5 * time.Second

// missWorker resolves m, then further misses handed over on missQ, until it
// has been idle for missWorkerIdle or the server shuts down.
func (s *Server) missWorker(m *missReq) {
	defer s.missWG.Done()
	var idle *time.Timer // real time: when to exit is not what tests observe
	for {
		s.resolveGuarded(m)
		s.release(m.q.Client)
		s.finishMiss(m)
		if idle == nil {
			idle = time.NewTimer(missWorkerIdle)
		} else {
			idle.Reset(missWorkerIdle)
		}
		select {
		case m = <-s.missQ:
		case <-idle.C:
			return
		case <-s.missStop:
			idle.Stop()
			return
		}
	}
}

// resolveGuarded gives m its answer on a miss worker: autopath's, or the
// Resolver's. A panic on the way answers it SERVFAIL.
func (s *Server) resolveGuarded(m *missReq) {
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Miss, p, m.raw)
			s.recoveredMiss(m)
		}
	}()
	if !s.answerAutopath(m) {
		m.out = s.resolve(m)
	}
}

// recoveredMiss makes m's answer SERVFAIL after a panic, replacing
// whatever was appended for it, and returns m. The SERVFAIL goes
// undecorated: what the block does may be what panicked.
func (s *Server) recoveredMiss(m *missReq) *missReq {
	m.out = m.out[:0]
	if m.tcp {
		m.out = append(m.out, 0, 0)
	}
	n := len(m.out)
	m.out = appendServfail(m.out, m.raw, s.cfg.MaxUDPSize)
	if len(m.out) > n {
		m.cdSelf = true
		s.stats.countRcode(wire.RcodeServFail)
	}
	m.source, m.undecorated = answer.FromUpstream, true
	return m
}

// Resolved answers a miss taken by resolve.Resolver.Start, on the goroutine
// that learnt the answer (an upstream's reader, mostly).
func (m *missReq) Resolved(e *cache.Entry, err error) {
	s := m.srv
	m.out = s.written(m, e, false, err)
	s.release(m.q.Client)
	// Over TCP the answer is queued for the connection's writer
	// (tcpanswers.go): a client that stops reading blocks neither this
	// goroutine nor the answers behind this one.
	s.finishMiss(m)
	s.missWG.Done()
}

// resolve asks the Resolver and appends the answer to m.out.
func (s *Server) resolve(m *missReq) []byte {
	e, stale, err := m.res.Resolve(context.Background(), &m.q, m.blk)
	return s.written(m, e, stale, err)
}

// written appends to m.out the answer the Resolver gave: the entry (stale
// or not), or SERVFAIL for an error.
func (s *Server) written(m *missReq, e *cache.Entry, stale bool, err error) (out []byte) {
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Miss, p, m.raw)
			out = s.recoveredMiss(m).out
		}
	}()
	switch {
	case err != nil:
		m.source = answer.FromUpstream
		if errors.Is(err, resolve.ErrOverloaded) {
			m.source = answer.FromOverload
		}
		if rc := wire.RcodeError(0); errors.As(err, &rc) {
			m.cdSelf = true
			s.stats.countRcode(int(rc))
			return wire.AppendError(m.out, m.raw, &m.q, int(rc), s.cfg.MaxUDPSize)
		}
		return s.servfail(m)
	case stale:
		m.source = answer.FromStale
		return s.writeStale(m, e)
	}
	m.source = answer.FromUpstream
	s.stats.countRcode(e.Rcode())
	return e.Write(m.out, &m.q, s.cfg.Clock.Now().UnixNano(), s.maxSize(&m.q, m.tcp), s.cfg.MaxUDPSize)
}

// shed answers a miss that was not admitted: with the stale answer if
// there is one, else SERVFAIL, never cached.
func (s *Server) shed(m *missReq) []byte {
	if e := m.res.Shed(&m.q, s.cfg.Clock.Now().UnixNano()); e != nil {
		m.source = answer.FromStale
		return s.writeStale(m, e)
	}
	return s.servfail(m)
}

func (s *Server) servfail(m *missReq) []byte {
	m.cdSelf = true
	s.stats.countRcode(wire.RcodeServFail)
	return wire.AppendError(m.out, m.raw, &m.q, wire.RcodeServFail, s.cfg.MaxUDPSize)
}

func (s *Server) writeStale(m *missReq, e *cache.Entry) []byte {
	s.stats.countRcode(e.Rcode())
	return e.WriteStale(m.out, &m.q, s.maxSize(&m.q, m.tcp), s.cfg.MaxUDPSize)
}
