package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/statedir"
)

// The control socket (statedir: an abstract SOCK_SEQPACKET unix socket of
// the network namespace, @nodelocaldns/<key>/<id>/<nonce>) answers one
// request per connection from a peer that passes statedir.CheckPeer (our
// uid, our network namespace), each request and each reply one message:
//
//	"id"                → statedir.IDReply: whether a twin is one
//	"ready" | "health"  → "ok" or "fail: <reason>"  (exec probes)
//	"handover <id>"     → {"files":N} then N descriptors (SCM_RIGHTS), at
//	                      most fdsPerMessage per message; or "fail: ..."
//	"cache <id>"        → the cache (cache.Export), in messages of at most
//	                      cacheChunk bytes, within cacheHandoverTimeout and
//	                      cacheHandoverBytes (cachehandover.go)
//
// Handover gives a starting twin duplicates of every listening socket, UDP
// and TCP: the sockets, and whatever the kernel has queued in them, then
// live on in the twin when this instance exits. Closing a SO_REUSEPORT
// socket drops what is queued in it; handing it over drops nothing
// (docs/design.md, "Restarts and upgrades", has the measurements).

// fdsPerMessage stays under the kernel's SCM_MAX_FD (253).
const fdsPerMessage = 200

// controlTimeout bounds one control exchange.
const controlTimeout = 3 * time.Second

type handoverHeader struct {
	Files int `json:"files"`
	PID   int `json:"pid"`
}

// controlListeners are the control sockets served: the abstract one, and
// the socket file versions before issue 41 dial. Close closes them all.
type controlListeners []*net.UnixListener

func (ls controlListeners) Close() error {
	for _, l := range ls {
		_ = l.Close()
	}
	return nil
}

// serveControl answers on the control socket ln until it is closed. It
// runs from registration on: a twin deciding whether to tear down sees us
// only once we answer. strict: ln is the socket file an older version's
// twin dials, which any network namespace that mounts the state directory
// reaches: only a peer whose network namespace the kernel names as ours
// is answered (statedir.CheckPeerStrict).
func (d *Daemon) serveControl(ln *net.UnixListener, strict bool) {
	d.control = append(d.control, ln)
	d.ctlWG.Add(1)
	go func() {
		defer d.ctlWG.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			go d.handleControl(c, strict)
		}
	}()
}

// refusedLogged is when a refused peer was last logged (unix ns): one line
// a minute at most, the rest counted.
var refusedLogged atomic.Int64

func (d *Daemon) handleControl(c *net.UnixConn, strict bool) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(controlTimeout))
	check := statedir.CheckPeer
	if strict {
		check = statedir.CheckPeerStrict
	}
	if err := check(c); err != nil {
		d.Metrics.ControlRefused()
		if now, last := time.Now().UnixNano(), refusedLogged.Load(); now-last > int64(time.Minute) && refusedLogged.CompareAndSwap(last, now) {
			d.log.Warn("control socket: refused a peer that is no twin (more within a minute are only counted: nodelocaldns_control_refused_total)", "err", err)
		}
		return
	}
	buf := make([]byte, 256)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		return
	}
	req := strings.Fields(string(buf[:n]))
	if len(req) == 0 {
		return
	}
	reply := func(err error) {
		msg := "ok"
		if err != nil {
			msg = "fail: " + err.Error()
		}
		_, _, _ = c.WriteMsgUnix([]byte(msg), nil, nil)
	}
	// A twin asks for the sockets and the cache of an instance that serves
	// (ready, or stopping), never of one that is starting.
	serving := d.ready.Load() || d.stopping.Load()
	switch req[0] {
	case statedir.IDRequest:
		_, _, _ = c.WriteMsgUnix(statedir.IDReply(d.reg.ID(), d.started), nil, nil)
	case "handover", "cache":
		if !serving {
			reply(errors.New("starting"))
			return
		}
		d.handOut(c, req, reply)
	case "ready":
		reply(d.readyProbe(context.Background()))
	case "health":
		ctx, cancel := context.WithTimeout(context.Background(), healthCheckTimeout)
		defer cancel()
		reply(d.health(ctx))
	default:
		reply(fmt.Errorf("unknown request %q", req[0]))
	}
}

// handOut answers a twin's "handover" (our listening sockets) or "cache".
func (d *Daemon) handOut(c *net.UnixConn, req []string, reply func(error)) {
	twin := "?"
	if len(req) > 1 {
		twin = req[1]
	}
	switch req[0] {
	case "handover":
		files, err := d.Server.Files()
		if err != nil {
			reply(err)
			return
		}
		defer func() {
			for _, f := range files {
				_ = f.Close()
			}
		}()
		if err := sendFiles(c, files); err != nil {
			d.log.Warn("socket handover failed", "twin", twin, "err", err)
			return
		}
		d.handedTo.Store(&twin)
		d.log.Info("handed listening sockets to a twin", "twin", twin, "sockets", len(files))
	case "cache":
		d.sendCache(c, twin)
	}
}

func sendFiles(c *net.UnixConn, files []*os.File) error {
	hdr, _ := json.Marshal(handoverHeader{Files: len(files), PID: os.Getpid()})
	if _, _, err := c.WriteMsgUnix(hdr, nil, nil); err != nil {
		return err
	}
	for len(files) > 0 {
		chunk := files[:min(len(files), fdsPerMessage)]
		files = files[len(chunk):]
		fds := make([]int, len(chunk))
		for i, f := range chunk {
			fds[i] = int(f.Fd())
		}
		if _, _, err := c.WriteMsgUnix([]byte{'f'}, unix.UnixRights(fds...), nil); err != nil {
			return err
		}
	}
	return nil
}

// requestHandover asks twin for its listening sockets.
func (d *Daemon) requestHandover(ctx context.Context, twin string) ([]*os.File, error) {
	dl := time.Now().Add(controlTimeout)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	c, err := d.reg.Dial(twin, time.Until(dl))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix([]byte("handover "+d.reg.ID()), nil, nil); err != nil {
		return nil, err
	}
	buf := make([]byte, 512)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		return nil, err
	}
	if msg, ok := strings.CutPrefix(string(buf[:n]), "fail: "); ok {
		return nil, errors.New(msg)
	}
	var hdr handoverHeader
	if err := json.Unmarshal(buf[:n], &hdr); err != nil {
		return nil, fmt.Errorf("handover header %q: %w", buf[:n], err)
	}
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			_ = f.Close()
		}
		return nil, err
	}
	oob := make([]byte, unix.CmsgSpace(4*fdsPerMessage))
	for len(files) < hdr.Files {
		_, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			return fail(err)
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return fail(errors.New("handover: descriptors truncated"))
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return fail(err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				return fail(err)
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("handover fd %d from %s", fd, twin)))
			}
		}
	}
	return files, nil
}
