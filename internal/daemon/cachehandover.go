package daemon

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/cache"
)

// The cache goes with the sockets (issue 31): a twin that took our
// listening sockets asks for our entries next, so the new instance of a
// rollout answers from the first query what the old one had cached,
// instead of sending a node's whole working set upstream at once. Entries
// keep their lifetimes (both instances read the same clock); an entry is
// dropped when its policy (TTL caps and floors, its block, the SERVFAIL
// and stale windows) is not the new configuration's for its name
// (running.State.PolicyFingerprint). A twin
// whose cache layout differs (cache.ExportVersion) starts empty and says
// so; a restart after a crash has no twin and loads the cache snapshot
// instead (cachesnapshot.go), as does a start whose twin handed nothing.

const (
	// cacheHandoverTimeout bounds the whole transfer: 64 MiB of entries
	// take well under a second.
	cacheHandoverTimeout = 5 * time.Second
	// cacheChunk is one control-socket message (SOCK_SEQPACKET keeps
	// each whole).
	cacheChunk = 32 << 10
)

// cacheHandoverBytes bounds the stream: the cache's own byte budget, and
// a quarter over it for the layout.
func (d *Daemon) cacheHandoverBytes() int64 {
	if b := d.cfg.Cache.MaxBytes; b > 0 {
		return b + b/4
	}
	return 80 << 20
}

// sendCache answers a twin's "cache" request with our entries.
func (d *Daemon) sendCache(c *net.UnixConn, twin string) {
	_ = c.SetDeadline(time.Now().Add(cacheHandoverTimeout))
	start := time.Now()
	n, err := d.Cache.Export(chunkWriter{c}, d.clock.Now().UnixNano(), d.run.PolicyFingerprint(), d.cacheHandoverBytes())
	if err != nil {
		d.log.Warn("cache handover to a twin failed", "twin", twin, "entries", n, "err", err)
		return
	}
	d.log.Info("handed the cache to a twin", "twin", twin, "entries", n, "took", time.Since(start).Round(time.Millisecond))
}

// adoptCache asks the twin that handed us its sockets for its entries.
// Failing that, the cache snapshot is loaded, as after a crash
// (cachesnapshot.go).
func (d *Daemon) adoptCache(twin string) {
	c, err := d.reg.Dial(twin, cacheHandoverTimeout)
	if err != nil {
		d.log.Warn("no cache from the twin: the snapshot instead", "twin", twin, "err", err)
		return
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix([]byte("cache "+d.reg.ID()), nil, nil); err != nil {
		d.log.Warn("no cache from the twin: the snapshot instead", "twin", twin, "err", err)
		return
	}
	start := time.Now()
	st, err := d.Cache.Import(&chunkReader{c: c, left: d.cacheHandoverBytes()}, d.clock.Now().UnixNano(), d.run.PolicyFingerprint())
	d.Metrics.CacheHandover(st.Kept, st.Dropped())
	d.cacheAdopted = err == nil || st.Kept > 0 // else the snapshot is loaded
	switch {
	case errors.Is(err, cache.ErrExportVersion):
		d.log.Warn("the twin's cache is of another version: the snapshot instead", "twin", twin, "err", err)
	case err != nil:
		d.log.Warn("cache handover from the twin cut short", "twin", twin, "kept", st.Kept, "err", err)
	default:
		d.log.Info("took the twin's cache", "twin", twin, "kept", st.Kept, "policy_changed", st.Changed,
			"expired", st.Expired, "not_kept", st.Rejected, "invalid", st.Invalid, "took", time.Since(start).Round(time.Millisecond))
	}
	if st.Invalid > 0 {
		d.log.Warn("the twin's cache held entries that are not well-formed answers: dropped", "twin", twin, "invalid", st.Invalid, "first", st.InvalidErr)
	}
}

// chunkWriter writes to a SOCK_SEQPACKET connection in messages of at most
// cacheChunk bytes.
type chunkWriter struct{ c *net.UnixConn }

func (w chunkWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), cacheChunk)
		if _, err := w.c.Write(p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// chunkReader reads the messages of a SOCK_SEQPACKET connection as one
// stream, at most left bytes.
type chunkReader struct {
	c    *net.UnixConn
	buf  []byte
	rest []byte
	left int64
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		if r.buf == nil {
			r.buf = make([]byte, cacheChunk)
		}
		n, err := r.c.Read(r.buf)
		if n == 0 && err == nil {
			err = io.EOF // the twin closed
		}
		if err != nil {
			return 0, err
		}
		if r.left -= int64(n); r.left < 0 {
			return 0, errors.New("cache handover: more than the cache's byte budget")
		}
		r.rest = r.buf[:n]
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}
