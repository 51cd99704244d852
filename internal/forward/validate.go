package forward

import (
	"encoding/binary"
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// question is the header ID and the question of a query, as on the wire.
type question struct {
	id     uint16
	name   []byte // uncompressed wire-format name, sliced from the query
	qtype  uint16
	qclass uint16
	opcode byte
	// size is the UDP payload size the query advertises (its OPT's, at
	// least 512; 512 without EDNS): the largest answer it can get over UDP.
	size int
}

// parseQuery reads the ID, the single question and the advertised size of a query without
// unpacking it (wire.ParseQuery).
func parseQuery(msg []byte) (question, error) {
	var q wire.Query
	if err := wire.ParseQuery(msg, &q); err != nil {
		return question{}, fmt.Errorf("%w: %w", ErrBadQuery, err)
	}
	return question{id: q.ID, name: q.Name, qtype: q.Type, qclass: q.Class, opcode: q.Opcode, size: int(q.Size)}, nil
}

// checkAnswer validates an upstream answer for a query sent with wireID: a response, that ID,
// the same opcode, exactly one question equal to q (name compared case-insensitively: the
// upstream may echo 0x20 case, RFC 4343), and a message that wire.CheckMessage accepts (every
// name, compression pointer and record within bounds), so nothing malformed is cached or relayed.
func checkAnswer(ans []byte, wireID uint16, q question) (err error) {
	defer recoverCheck(ans, &err)
	if err := matchAnswer(ans, wireID, q); err != nil {
		return err
	}
	if err := wire.CheckMessage(ans); err != nil {
		return fmt.Errorf("%w: %w", errMalformed, err)
	}
	return nil
}

// matchAnswer checks that ans is the response to the query: header and question.
func matchAnswer(ans []byte, wireID uint16, q question) (err error) {
	defer recoverCheck(ans, &err)
	if len(ans) < wire.HeaderLen {
		return fmt.Errorf("%w: %d bytes, shorter than a header", errMalformed, len(ans))
	}
	if wire.Flags(ans)&wire.FlagQR == 0 {
		return fmt.Errorf("%w: QR bit not set", errMalformed)
	}
	if id := wire.ID(ans); id != wireID {
		return fmt.Errorf("%w: ID %d, want %d", errMismatch, id, wireID)
	}
	if op := wire.Opcode(ans); op != q.opcode {
		return fmt.Errorf("%w: opcode %d, want %d", errMismatch, op, q.opcode)
	}
	if qd, _, _, _ := wire.Counts(ans); qd != 1 {
		return fmt.Errorf("%w: %d questions, want 1", errMismatch, qd)
	}
	name, qtype, qclass, _, err := wire.ReadQuestion(ans)
	if err != nil {
		return fmt.Errorf("%w: question: %w", errMalformed, err)
	}
	if !wire.EqualNameFold(name, q.name) || qtype != q.qtype || qclass != q.qclass {
		return fmt.Errorf("%w: question differs", errMismatch)
	}
	return nil
}

// truncatedWithoutQuestion accepts a truncated response for our ID that omits the question, as
// some servers send; it only leads to a TCP re-ask.
func truncatedWithoutQuestion(msg []byte, id uint16) bool {
	if !truncated(msg) || wire.Flags(msg)&wire.FlagQR == 0 || wire.ID(msg) != id {
		return false
	}
	qd, _, _, _ := wire.Counts(msg)
	return qd == 0
}

func truncated(msg []byte) bool {
	return len(msg) >= wire.HeaderLen && wire.Flags(msg)&wire.FlagTC != 0
}

var rootName = []byte{0}

// probeQuery returns "NAME IN NS" with a random ID and RD clear; name is
// in wire form (nil: the root, ".").
func probeQuery(id uint16, name []byte) []byte {
	if len(name) == 0 {
		name = rootName
	}
	m := make([]byte, wire.HeaderLen, wire.HeaderLen+len(name)+4)
	wire.SetID(m, id)
	wire.SetCounts(m, 1, 0, 0, 0)
	m = append(m, name...)
	m = binary.BigEndian.AppendUint16(m, wire.TypeNS)
	return binary.BigEndian.AppendUint16(m, wire.ClassINET)
}
