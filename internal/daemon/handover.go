package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The control socket (<state-dir>/<key>/<id>.sock, SOCK_SEQPACKET, private
// to root) answers one request per connection, each request and each reply
// one message:
//
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

// listenControl listens on the control socket and answers until it is
// closed.
func (d *Daemon) listenControl() error {
	path := d.reg.SockPath(d.reg.ID())
	_ = os.Remove(path) // a dead instance with our id left it
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // unregister removes it, after the lock
	d.control = ln
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
			go d.handleControl(c)
		}
	}()
	return nil
}

func (d *Daemon) handleControl(c *net.UnixConn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(controlTimeout))
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
	switch req[0] {
	case "ready":
		reply(d.readyProbe(context.Background()))
	case "health":
		ctx, cancel := context.WithTimeout(context.Background(), healthCheckTimeout)
		defer cancel()
		reply(d.health(ctx))
	case "handover":
		twin := "?"
		if len(req) > 1 {
			twin = req[1]
		}
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
		twin := "?"
		if len(req) > 1 {
			twin = req[1]
		}
		d.sendCache(c, twin)
	default:
		reply(fmt.Errorf("unknown request %q", req[0]))
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
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: d.reg.SockPath(twin), Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(dl)
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
