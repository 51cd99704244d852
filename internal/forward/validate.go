package forward

import (
	"encoding/binary"
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

const (
	headerLen = 12
	// maxNameLen is the longest name on the wire, root label included (RFC 1035 §2.3.4).
	maxNameLen = 255

	rcodeServFail = 2
	rcodeRefused  = 5
)

// question is the header ID and the question of a query, as on the wire.
type question struct {
	id     uint16
	name   []byte // uncompressed wire-format name, sliced from the query
	qtype  uint16
	qclass uint16
	opcode byte
}

// parseQuery reads the ID and the single question of a query without unpacking it.
func parseQuery(msg []byte) (question, error) {
	if len(msg) < headerLen {
		return question{}, fmt.Errorf("%w: %d bytes, shorter than a header", ErrBadQuery, len(msg))
	}
	if n := binary.BigEndian.Uint16(msg[4:]); n != 1 {
		return question{}, fmt.Errorf("%w: %d questions, want 1", ErrBadQuery, n)
	}
	end, err := nameEnd(msg, headerLen)
	if err != nil {
		return question{}, fmt.Errorf("%w: %w", ErrBadQuery, err)
	}
	if end+4 > len(msg) {
		return question{}, fmt.Errorf("%w: question truncated", ErrBadQuery)
	}
	return question{
		id:     binary.BigEndian.Uint16(msg),
		name:   msg[headerLen:end],
		qtype:  binary.BigEndian.Uint16(msg[end:]),
		qclass: binary.BigEndian.Uint16(msg[end+2:]),
		opcode: msg[2] >> 3 & 0x0F,
	}, nil
}

// nameEnd returns the offset just past the uncompressed name at off. The question is the first
// name of a message, so a compression pointer there is invalid.
func nameEnd(msg []byte, off int) (int, error) {
	start := off
	for {
		if off >= len(msg) {
			return 0, fmt.Errorf("name truncated")
		}
		l := int(msg[off])
		if l == 0 {
			return off + 1, nil
		}
		if l&0xC0 != 0 {
			return 0, fmt.Errorf("compressed or extended label in question")
		}
		off += 1 + l
		if off-start >= maxNameLen {
			return 0, fmt.Errorf("name longer than %d bytes", maxNameLen)
		}
	}
}

// checkAnswer validates an upstream answer for a query sent with wireID: a response, that ID,
// the same opcode, and exactly one question equal to q (name compared case-insensitively: the
// upstream may echo 0x20 case, RFC 4343).
func checkAnswer(ans []byte, wireID uint16, q question) error {
	if len(ans) < headerLen {
		return fmt.Errorf("%w: %d bytes, shorter than a header", errMalformed, len(ans))
	}
	if ans[2]&0x80 == 0 {
		return fmt.Errorf("%w: QR bit not set", errMalformed)
	}
	if id := binary.BigEndian.Uint16(ans); id != wireID {
		return fmt.Errorf("%w: ID %d, want %d", errMismatch, id, wireID)
	}
	if op := ans[2] >> 3 & 0x0F; op != q.opcode {
		return fmt.Errorf("%w: opcode %d, want %d", errMismatch, op, q.opcode)
	}
	if n := binary.BigEndian.Uint16(ans[4:]); n != 1 {
		return fmt.Errorf("%w: %d questions, want 1", errMismatch, n)
	}
	end, err := nameEnd(ans, headerLen)
	if err != nil {
		return fmt.Errorf("%w: %w", errMalformed, err)
	}
	if end+4 > len(ans) {
		return fmt.Errorf("%w: question truncated", errMalformed)
	}
	if !wire.EqualNameFold(ans[headerLen:end], q.name) ||
		binary.BigEndian.Uint16(ans[end:]) != q.qtype ||
		binary.BigEndian.Uint16(ans[end+2:]) != q.qclass {
		return fmt.Errorf("%w: question differs", errMismatch)
	}
	return nil
}

func setID(msg []byte, id uint16) { binary.BigEndian.PutUint16(msg, id) }

func truncated(msg []byte) bool { return len(msg) >= headerLen && msg[2]&0x02 != 0 }

func rcode(msg []byte) int { return int(msg[3] & 0x0F) }
