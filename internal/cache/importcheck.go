package cache

import (
	"fmt"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// An imported entry (a twin's export, or the snapshot file a crashed
// instance left) comes from outside this process: it is checked as
// strictly as Build checks an upstream answer, and against what Build
// would have made of that answer, before it can answer anyone. Every hit
// path (Entry.write, truncation, loadbalance's shuffles, the rwanswer
// rules) then walks records Build itself laid out.

// maxLifetime bounds an imported entry's lifetime: a TTL is at most
// 2^31-1 seconds (RFC 2181 §8).
const maxLifetime = int64(1<<31-1) * int64(time.Second)

// checkImported reports what is wrong with the imported entry e, using a
// for the message's layout; nil when Build could have made it.
func checkImported(e *Entry, a *wire.Answer) error {
	msg := e.msg
	if err := wire.CheckMessage(msg); err != nil {
		return fmt.Errorf("the message is not well-formed (wire.CheckMessage): %w", err)
	}
	if err := wire.ParseAnswer(msg, a); err != nil {
		return fmt.Errorf("the message is not an answer (wire.ParseAnswer): %w", err)
	}
	_, an, _, _ := wire.Counts(msg)
	switch {
	case e.kind >= numKinds:
		return fmt.Errorf("kind %d", e.kind)
	case a.OPTStart >= 0:
		return fmt.Errorf("an OPT record")
	case a.End != len(msg):
		return fmt.Errorf("%d bytes after the last record", len(msg)-a.End)
	case a.Flags&wire.FlagQR == 0 || a.Flags&(wire.FlagAA|wire.FlagTC) != 0:
		return fmt.Errorf("header flags %#04x", a.Flags)
	case len(a.Name) != int(e.nameLen) || a.Type != e.qtype || a.Class != e.qclass || !isLower(a.Name):
		return fmt.Errorf("the question is not the entry's")
	case int(e.rcode) != a.Rcode4() || e.kind != kindOf(a.Rcode4(), an):
		return fmt.Errorf("kind %v with rcode %d and %d answers", e.kind, a.Rcode4(), an)
	case len(a.RRs) != len(e.rrs):
		return fmt.Errorf("%d records laid out, %d in the message", len(e.rrs), len(a.RRs))
	}
	if err := checkTimes(e); err != nil {
		return err
	}
	life := uint32((e.expires - e.stored) / int64(time.Second))
	for i := range a.RRs {
		rr, f := &a.RRs[i], e.rrs[i]
		name := uint16(0)
		if n := len(a.Name); rr.TTLOff-4-rr.Start == n && wire.EqualNameFold(msg[rr.Start:rr.Start+n], a.Name) {
			name = uint16(rr.Start)
		}
		if int(f.off) != rr.TTLOff || int(f.end) != rr.End || f.name != name {
			return fmt.Errorf("record %d: layout (ttl at %d, end %d, name %d) is not the message's (%d, %d, %d)",
				i, f.off, f.end, f.name, rr.TTLOff, rr.End, name)
		}
		if f.ttl > life {
			return fmt.Errorf("record %d: TTL %d over the entry's lifetime %d s", i, f.ttl, life)
		}
	}
	if e.pfPct > 100 {
		return fmt.Errorf("prefetch at %d%%", e.pfPct)
	}
	if e.answering && (e.kind != Success || !answersQuestion(msg, a.RRs, a.Type, a.Class, msg[wire.HeaderLen:wire.HeaderLen+len(a.Name)])) {
		return fmt.Errorf("marked as answering its question, which it does not")
	}
	return nil
}

// checkTimes checks the entry's lifetimes: stored, expires and the end of
// the stale window in order, within maxLifetime, and a SERVFAIL never
// served stale.
func checkTimes(e *Entry) error {
	switch {
	case e.expires <= e.stored || e.staleUntil < e.expires:
		return fmt.Errorf("times out of order (stored %d, expires %d, stale until %d)", e.stored, e.expires, e.staleUntil)
	case e.expires-e.stored > maxLifetime || e.staleUntil-e.expires > maxLifetime:
		return fmt.Errorf("a lifetime over 2^31 s")
	case e.kind == ServFail && e.staleUntil != e.expires:
		return fmt.Errorf("a SERVFAIL with a stale window")
	}
	return nil
}

// kindOf is the kind classify gives an answer with this header rcode and
// number of answer records, numKinds for one it never stores.
func kindOf(rcode int, answers uint16) Kind {
	switch {
	case rcode == wire.RcodeServFail:
		return ServFail
	case rcode == wire.RcodeSuccess && answers > 0:
		return Success
	case rcode == wire.RcodeSuccess || rcode == wire.RcodeNXDomain:
		return Denial
	}
	return numKinds
}

// isLower reports whether the name has no upper-case ASCII letter (Build
// stores the question name lower-cased).
func isLower(name []byte) bool {
	for _, c := range name {
		if 'A' <= c && c <= 'Z' {
			return false
		}
	}
	return true
}
