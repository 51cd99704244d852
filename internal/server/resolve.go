package server

import (
	"context"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// resolve answers a miss and appends the answer to out. There is at most
// one upstream query per question however many clients ask (cache.Flight).
// When the entry is stale (RFC 8767) the client waits at most
// StaleClientTimeout for the refresh and then gets the stale answer; while
// a failed refresh's recheck interval runs it gets the stale answer at once.
// Otherwise an upstream failure is answered SERVFAIL and nothing is cached.
func (s *Server) resolve(raw []byte, q *wire.Query, out []byte, tcp bool) []byte {
	st := &s.stats
	now := s.cfg.Now().UnixNano()
	e, status, refresh := s.cfg.Cache.Lookup(q, now)
	switch {
	case status == cache.Fresh:
		// Inserted since the serving loop looked.
		return s.write(out, q, e, tcp)
	case status == cache.Stale && !refresh:
		return s.writeStale(out, q, e, tcp)
	}
	stale := e // nil unless status == cache.Stale
	if stale == nil {
		// Nothing to fall back on: wait for the answer, whoever fetches
		// it; the first asker fetches it itself, in this goroutine.
		entry, joined, err := s.cfg.Cache.Flight().Do(q, s.fetch)
		if joined {
			st.Coalesced.Add(1)
		}
		if err != nil {
			out = wire.AppendError(out, raw, q, wire.RcodeServFail, s.cfg.MaxUDPSize)
			st.countRcode(wire.RcodeServFail)
			return out
		}
		return s.write(out, q, entry, tcp)
	}
	call, joined := s.cfg.Cache.Flight().Start(q, s.fetch)
	if joined {
		st.Coalesced.Add(1)
	}
	t := time.NewTimer(s.cfg.StaleClientTimeout)
	select {
	case <-call.Done():
		t.Stop()
	case <-t.C:
		// The refresh goes on in the background and updates the cache.
		return s.writeStale(out, q, stale, tcp)
	}
	if call.Err != nil || call.Entry.Rcode() == wire.RcodeServFail {
		return s.writeStale(out, q, stale, tcp)
	}
	return s.write(out, q, call.Entry, tcp)
}

// fetch asks the upstream for q (its own copy: it may outlive the client
// that started it), builds the entry and caches it when it may be cached.
// A failed refresh of a stale entry starts its recheck interval.
func (s *Server) fetch(q *wire.Query) (*cache.Entry, error) {
	st := &s.stats
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ForwardTimeout)
	defer cancel()
	uq := wire.AppendUpstreamQuery(make([]byte, 0, 64+len(q.Name)), q, s.cfg.MaxUDPSize)
	resp, err := s.cfg.Forward(ctx, wire.NameString(q.Name), uq)
	var e *cache.Entry
	if err == nil {
		e, err = cache.BuildStale(resp, q, s.policy(q.Name), s.cfg.ServFailTTL, s.cfg.StaleWindow, s.cfg.Now().UnixNano())
	}
	if err != nil {
		st.UpstreamErrors.Add(1)
		now := s.cfg.Now().UnixNano()
		s.cfg.Cache.RefreshFailed(q, now, now+int64(s.cfg.StaleRecheck))
		return nil, err
	}
	s.cfg.Cache.Put(e)
	if e.Rcode() == wire.RcodeServFail {
		now := s.cfg.Now().UnixNano()
		s.cfg.Cache.RefreshFailed(q, now, now+int64(s.cfg.StaleRecheck))
	}
	return e, nil
}

// prefetch refreshes a popular entry near its expiry in the background,
// through the flight so a concurrent miss shares it.
func (s *Server) prefetch(q *wire.Query) {
	s.cfg.Cache.Flight().Start(q, s.fetch)
}

// overloaded answers a miss that was not admitted (-max-inflight): with
// the stale answer if there is one, else SERVFAIL, never cached.
func (s *Server) overloaded(raw []byte, q *wire.Query, out []byte, tcp bool) []byte {
	if e, status, _ := s.cfg.Cache.Lookup(q, s.cfg.Now().UnixNano()); status == cache.Stale {
		return s.writeStale(out, q, e, tcp)
	}
	out = wire.AppendError(out, raw, q, wire.RcodeServFail, s.cfg.MaxUDPSize)
	s.stats.countRcode(wire.RcodeServFail)
	return out
}

func (s *Server) write(out []byte, q *wire.Query, e *cache.Entry, tcp bool) []byte {
	s.stats.countRcode(e.Rcode())
	return e.Write(out, q, s.cfg.Now().UnixNano(), s.maxSize(q, tcp), s.cfg.MaxUDPSize)
}

func (s *Server) writeStale(out []byte, q *wire.Query, e *cache.Entry, tcp bool) []byte {
	s.stats.StaleServed.Add(1)
	s.stats.countRcode(e.Rcode())
	return e.WriteStale(out, q, s.maxSize(q, tcp), s.cfg.MaxUDPSize)
}
