package dnstap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Frame Streams (https://github.com/farsightsec/fstrm, the protocol
// document): a data frame is a 32-bit big-endian length and that many
// bytes; a control frame is a zero length (the escape), the control
// frame's length, its type and its fields, each a type, a length and the
// bytes. The bidirectional handshake: the writer sends READY with the
// content types it can send, the reader answers ACCEPT with the one it
// takes, the writer sends START with it; at the end STOP, answered with
// FINISH.
const (
	ctrlAccept = 0x01
	ctrlStart  = 0x02
	ctrlStop   = 0x03
	ctrlReady  = 0x04
	ctrlFinish = 0x05

	fieldContentType = 0x01

	// ContentType is dnstap's Frame Streams content type.
	ContentType = "protobuf:dnstap.Dnstap"

	// maxControl bounds a control frame read (the protocol's own limit,
	// 512 bytes): a peer cannot make us allocate more.
	maxControl = 512
	// MaxFrame bounds a data frame read by Collect: a dnstap message
	// with two DNS messages of 64 KiB and its fields fits.
	MaxFrame = 1 << 18
)

// appendControl appends a control frame of type typ with the content
// type ct ("" for none).
func appendControl(b []byte, typ uint32, ct string) []byte {
	n := 4
	if ct != "" {
		n += 8 + len(ct)
	}
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = binary.BigEndian.AppendUint32(b, typ)
	if ct != "" {
		b = binary.BigEndian.AppendUint32(b, fieldContentType)
		b = binary.BigEndian.AppendUint32(b, uint32(len(ct)))
		b = append(b, ct...)
	}
	return b
}

// readControl reads a control frame and returns its type and content
// types.
func readControl(r io.Reader) (uint32, []string, error) {
	var h [8]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	if binary.BigEndian.Uint32(h[:4]) != 0 {
		return 0, nil, errors.New("frame streams: a data frame where a control frame was due")
	}
	n := binary.BigEndian.Uint32(h[4:])
	if n < 4 || n > maxControl {
		return 0, nil, fmt.Errorf("frame streams: control frame of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	typ := binary.BigEndian.Uint32(b)
	var cts []string
	for b = b[4:]; len(b) > 0; {
		if len(b) < 8 {
			return 0, nil, errors.New("frame streams: short control field")
		}
		ft, fl := binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
		b = b[8:]
		if uint32(len(b)) < fl {
			return 0, nil, errors.New("frame streams: control field past the frame")
		}
		if ft == fieldContentType {
			cts = append(cts, string(b[:fl]))
		}
		b = b[fl:]
	}
	return typ, cts, nil
}

// handshake is the writer's side of the bidirectional handshake on rw:
// READY, ACCEPT with our content type, START.
func handshake(rw io.ReadWriter) error {
	if _, err := rw.Write(appendControl(nil, ctrlReady, ContentType)); err != nil {
		return err
	}
	typ, cts, err := readControl(rw)
	if err != nil {
		return fmt.Errorf("frame streams: no ACCEPT: %w", err)
	}
	if typ != ctrlAccept {
		return fmt.Errorf("frame streams: control frame %d where ACCEPT was due", typ)
	}
	ok := false
	for _, ct := range cts {
		ok = ok || ct == ContentType
	}
	if !ok {
		return fmt.Errorf("frame streams: the collector accepts %q, not %q", cts, ContentType)
	}
	_, err = rw.Write(appendControl(nil, ctrlStart, ContentType))
	return err
}

// Collect is the reader's side of a bidirectional Frame Stream on rw (a
// collector, as `dnstap -u` is): it answers READY with ACCEPT, reads
// START, then calls f with each data frame's payload (valid until f
// returns) until STOP, which it answers with FINISH, or an error. Frames
// longer than MaxFrame are an error.
func Collect(rw io.ReadWriter, f func(payload []byte)) error {
	br := bufio.NewReader(rw)
	typ, cts, err := readControl(br)
	if err != nil {
		return err
	}
	if typ != ctrlReady || !slices.Contains(cts, ContentType) {
		return fmt.Errorf("frame streams: expected READY with %q, got %d %q", ContentType, typ, cts)
	}
	if _, err := rw.Write(appendControl(nil, ctrlAccept, ContentType)); err != nil {
		return err
	}
	if typ, _, err = readControl(br); err != nil {
		return err
	}
	if typ != ctrlStart {
		return fmt.Errorf("frame streams: expected START, got %d", typ)
	}
	buf := make([]byte, 0, 4096)
	h, l := make([]byte, 4), make([]byte, 8)
	for {
		if _, err := io.ReadFull(br, h); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(h)
		if n == 0 {
			if _, err := io.ReadFull(br, l); err != nil {
				return err
			}
			cl := binary.BigEndian.Uint32(l[:4])
			if cl < 4 || cl > maxControl {
				return fmt.Errorf("frame streams: control frame of %d bytes", cl)
			}
			if _, err := io.CopyN(io.Discard, br, int64(cl-4)); err != nil {
				return err
			}
			if t := binary.BigEndian.Uint32(l[4:]); t == ctrlStop {
				_, err := rw.Write(appendControl(nil, ctrlFinish, ""))
				return err
			}
			continue
		}
		if n > MaxFrame {
			return fmt.Errorf("frame streams: data frame of %d bytes", n)
		}
		if uint32(cap(buf)) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(br, buf); err != nil {
			return err
		}
		f(buf)
	}
}
