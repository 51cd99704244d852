package cache

import (
	"encoding/binary"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// LastKnownGood counts, for one zone, what the prefer_positive policy did
// (Policy.PreferPositive): refreshes that did not answer the question and
// were refused in favour of the last good answer (Kept), and answers served
// from such a kept entry (Served), fresh or stale.
type LastKnownGood struct {
	Zone   string
	Kept   atomic.Uint64
	Served atomic.Uint64
}

var lkgZones struct {
	sync.Mutex
	m map[string]*LastKnownGood
}

// String is the zone: what a policy's fingerprint (fmt's %+v, a cache
// handed to a twin) shows of the counters, the same in every process.
func (l *LastKnownGood) String() string { return l.Zone }

// LastKnownGoodCounter returns the counters of zone (an FQDN, or "" for
// the flags' default policy), the same for every call with the same zone,
// so a reload keeps counting where it was.
func LastKnownGoodCounter(zone string) *LastKnownGood {
	lkgZones.Lock()
	defer lkgZones.Unlock()
	if c := lkgZones.m[zone]; c != nil {
		return c
	}
	if lkgZones.m == nil {
		lkgZones.m = map[string]*LastKnownGood{}
	}
	c := &LastKnownGood{Zone: zone}
	lkgZones.m[zone] = c
	return c
}

// knownLastKnownGood returns the counters of zone when a policy of this
// process made them (LastKnownGoodCounter), else nil.
func knownLastKnownGood(zone string) *LastKnownGood {
	lkgZones.Lock()
	defer lkgZones.Unlock()
	return lkgZones.m[zone]
}

// LastKnownGoodStat is one zone's counts.
type LastKnownGoodStat struct {
	Zone         string
	Kept, Served uint64
}

// LastKnownGoodStats returns every zone's counts, by zone, for a metrics
// scrape.
func LastKnownGoodStats() []LastKnownGoodStat {
	lkgZones.Lock()
	out := make([]LastKnownGoodStat, 0, len(lkgZones.m))
	for z, c := range lkgZones.m {
		out = append(out, LastKnownGoodStat{Zone: z, Kept: c.Kept.Load(), Served: c.Served.Load()})
	}
	lkgZones.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Zone < out[j].Zone })
	return out
}

// Answering reports whether the entry is a NOERROR whose answer section
// answers its question (records of the question's type at the end of the
// CNAME chain from the question name; for CNAME questions one CNAME at the
// name; for ANY any record at the name), as CoreDNS 1.15's cache decides
// for serve_stale_policy prefer_positive. It is computed only for entries
// built under Policy.PreferPositive (false otherwise).
func (e *Entry) Answering() bool { return e.answering }

// Keep records that a refresh which does not answer the question was
// refused in favour of e (prefer_positive) and reports whether it is the
// first time for e: a state change, worth one log line.
func (e *Entry) Keep() (first bool) {
	if e.lkg != nil {
		e.lkg.Kept.Add(1)
	}
	return !e.kept.Swap(true)
}

// Kept reports whether a refresh was refused in favour of e.
func (e *Entry) Kept() bool { return e.kept.Load() }

// CountServed counts an answer served from e when a refresh was refused
// in favour of it: an answer the client got because of the policy.
func (e *Entry) CountServed() {
	if e.lkg != nil && e.kept.Load() {
		e.lkg.Served.Add(1)
	}
}

// ansRR is one answer record as answersQuestion reads it: owner and (for
// a CNAME) target, lower-cased and uncompressed.
type ansRR struct {
	typ, class uint16
	owner      string
	target     string
}

// answersQuestion implements Answering for the message msg (question name
// lower-cased at the header's end) whose records are rrs.
func answersQuestion(msg []byte, rrs []wire.RR, qtype, qclass uint16, qname []byte) bool {
	var ans []ansRR
	var buf [wire.MaxNameLen]byte
	for _, rr := range rrs {
		if rr.Section != wire.SectionAnswer {
			continue
		}
		owner, ok := expandName(buf[:0], msg, rr.Start)
		if !ok || rr.TTLOff < 2+wire.HeaderLen {
			return false
		}
		a := ansRR{typ: rr.Type, class: binary.BigEndian.Uint16(msg[rr.TTLOff-2:]), owner: string(owner)}
		if rr.Type == wire.TypeCNAME {
			t, ok := expandName(buf[:0], msg, rr.TTLOff+6)
			if !ok {
				return false
			}
			a.target = string(t)
		}
		ans = append(ans, a)
	}
	if len(ans) == 0 {
		return false
	}
	name := string(wire.AppendLower(nil, qname))
	classOK := func(c uint16) bool { return qclass == typeANY || c == qclass }
	// cnameOf is the one target of name's CNAMEs ("" when none); ok is
	// false when name has two different ones (RFC 2181 §10.1).
	cnameOf := func(name string) (target string, ok bool) {
		for _, a := range ans {
			if a.typ != wire.TypeCNAME || !classOK(a.class) || a.owner != name {
				continue
			}
			if target != "" && target != a.target {
				return "", false
			}
			target = a.target
		}
		return target, true
	}
	switch qtype {
	case typeANY:
		for _, a := range ans {
			if classOK(a.class) && a.owner == name {
				return true
			}
		}
		return false
	case wire.TypeCNAME:
		t, ok := cnameOf(name)
		return ok && t != ""
	}
	seen := map[string]bool{}
	for {
		if seen[name] {
			return false // a loop
		}
		seen[name] = true
		t, ok := cnameOf(name)
		if !ok {
			return false
		}
		if t == "" {
			break
		}
		name = t
	}
	for _, a := range ans {
		if a.typ == qtype && classOK(a.class) && a.owner == name {
			return true
		}
	}
	return false
}

// typeANY is QTYPE and QCLASS 255 (ANY, "*").
const typeANY = 255

// expandName appends the name at off in msg, following compression
// pointers, lower-cased and in wire form, to dst. ok is false for a name
// that does not parse (pointer loops are bounded by the name length).
func expandName(dst, msg []byte, off int) ([]byte, bool) {
	for hops := 0; hops < 128; hops++ {
		if off >= len(msg) {
			return nil, false
		}
		l := int(msg[off])
		switch {
		case l == 0:
			return append(dst, 0), len(dst) < wire.MaxNameLen
		case l&0xC0 == 0xC0:
			if off+2 > len(msg) {
				return nil, false
			}
			off = int(binary.BigEndian.Uint16(msg[off:]) & 0x3FFF)
			continue
		case l > 63 || off+1+l > len(msg) || len(dst)+1+l > wire.MaxNameLen:
			return nil, false
		}
		dst = append(dst, byte(l))
		dst = wire.AppendLower(dst, msg[off+1:off+1+l])
		off += 1 + l
	}
	return nil, false
}

// StaleUntil is when the entry's serve-stale window ends (unix ns).
func (e *Entry) StaleUntil() int64 { return e.staleUntil }
