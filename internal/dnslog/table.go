package dnslog

import (
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Zone is one zone as a listen address sees it: the block that serves its
// names there, by that block's log rules (nil: the block has no log).
type Zone struct {
	Name  string // lower-case FQDN, "." for the root
	Rules []Rule
}

// Addr is what one listen address sees: every zone of the blocks it sees.
type Addr struct {
	// Addr is the listen address; the zero Addr is every other address
	// (an adopted socket, a wildcard bind).
	Addr  netip.Addr
	Zones []Zone
}

// Table logs queries by the blocks that answer them. Built once (a
// Corefile change of log applies at restart), safe for concurrent use.
type Table struct {
	addrs []addrTable
	def   *addrTable
	mu    sync.Mutex // one line per Write, lines never interleaved
	w     io.Writer
	now   func() time.Time
}

type addrTable struct {
	addr  netip.Addr
	zones []zoneRules // longest first
}

type zoneRules struct {
	wire  []byte // lower-case wire form
	rules []rule // nil: the block does not log
}

type rule struct {
	scope   string // lower-case FQDN
	classes Class
	format  format
}

// NewTable builds the table of addrs, writing lines to w. It returns nil
// when no block of any address logs: the server then pays nothing.
func NewTable(w io.Writer, addrs []Addr) *Table {
	t := &Table{w: w, now: time.Now}
	any := false
	for _, a := range addrs {
		at := addrTable{addr: a.Addr.Unmap()}
		for _, z := range a.Zones {
			wn, ok := wire.AppendNameWire(nil, z.Name)
			if !ok {
				continue
			}
			zr := zoneRules{wire: wire.AppendLower(nil, wn)}
			for _, r := range z.Rules {
				zr.rules = append(zr.rules, rule{scope: strings.ToLower(dns.Fqdn(r.Scope)), classes: r.Classes, format: parseFormat(r.Format)})
				any = true
			}
			at.zones = append(at.zones, zr)
		}
		slices.SortStableFunc(at.zones, func(x, y zoneRules) int { return len(y.wire) - len(x.wire) })
		t.addrs = append(t.addrs, at)
	}
	if !any {
		return nil
	}
	for i := range t.addrs {
		if !t.addrs[i].addr.IsValid() {
			t.def = &t.addrs[i]
		}
	}
	return t
}

// forAddr is the table of the listen address a.
func (t *Table) forAddr(a netip.Addr) *addrTable {
	a = a.Unmap()
	for i := range t.addrs {
		if t.addrs[i].addr == a {
			return &t.addrs[i]
		}
	}
	return t.def
}

// match is the rules of the longest zone holding name (wire form).
func (at *addrTable) match(name []byte) ([]rule, bool) {
	for _, z := range at.zones {
		if inZone(name, z.wire) {
			return z.rules, true
		}
	}
	return nil, false
}

// inZone reports whether the wire name ends with the zone at a label
// boundary.
func inZone(name, zone []byte) bool {
	p := len(name) - len(zone)
	if p < 0 || !wire.EqualNameFold(name[p:], zone) {
		return false
	}
	off := 0
	for off < p {
		l := int(name[off])
		if l == 0 || l&0xC0 != 0 {
			return false
		}
		off += l + 1
	}
	return off == p
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// Log writes e's line when the block answering it logs it. The caller
// passes only answers to parsed questions.
func (t *Table) Log(e *Entry) {
	at := t.forAddr(e.Local)
	if at == nil || e.Q == nil || !e.Q.HasQ {
		return
	}
	rules, ok := at.match(e.Q.Name)
	if !ok || len(rules) == 0 {
		return
	}
	var name string // lower-case presentation form, made once
	for i := range rules {
		r := &rules[i]
		if r.scope != "." {
			if name == "" {
				name = strings.ToLower(wire.NameString(e.Q.Name))
			}
			if name != r.scope && !strings.HasSuffix(name, "."+r.scope) {
				continue
			}
		}
		// CoreDNS: the first rule whose scope holds the name decides.
		if r.classes != All && r.classes&Classify(e.Resp, t.now()) == 0 {
			return
		}
		p := bufPool.Get().(*[]byte)
		b := append((*p)[:0], "[INFO] "...)
		b = append(r.format.appendLine(b, e), '\n')
		t.mu.Lock()
		_, _ = t.w.Write(b)
		t.mu.Unlock()
		*p = b
		if cap(b) <= 4096 {
			bufPool.Put(p)
		}
		return
	}
}

// Classify is the class of the answer resp as CoreDNS's
// response.Typify and Classify see it; an answer that does not parse is
// an error.
func Classify(resp []byte, now time.Time) Class {
	m := new(dns.Msg)
	if err := m.Unpack(resp); err != nil {
		return Error
	}
	switch typify(m, now) {
	case tNoError, tDelegation:
		return Success
	case tNameError, tNoData:
		return Denial
	}
	return Error
}

const (
	tNoError = iota
	tNameError
	tServerError
	tNoData
	tDelegation
	tMeta
	tUpdate
	tOtherError
)

// typify is CoreDNS 1.15's response.Typify.
func typify(m *dns.Msg, now time.Time) int {
	opt := m.IsEdns0()
	switch {
	case m.Opcode == dns.OpcodeUpdate:
		return tUpdate
	case m.Opcode == dns.OpcodeNotify:
		return tMeta
	case len(m.Question) > 0 && (m.Question[0].Qtype == dns.TypeAXFR || m.Question[0].Qtype == dns.TypeIXFR):
		return tMeta
	}
	if opt != nil && opt.Do() {
		for _, s := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
			for _, r := range s {
				if sig, ok := r.(*dns.RRSIG); ok && !sig.ValidityPeriod(now) {
					return tOtherError
				}
			}
		}
	}
	if len(m.Answer) > 0 && m.Rcode == dns.RcodeSuccess {
		return tNoError
	}
	if len(m.Answer) > 0 && m.Rcode == dns.RcodeNameError {
		return tOtherError
	}
	soa, ns := false, 0
	for _, r := range m.Ns {
		switch r.Header().Rrtype {
		case dns.TypeSOA:
			soa = true
		case dns.TypeNS:
			ns++
		}
	}
	switch {
	case soa && m.Rcode == dns.RcodeSuccess:
		return tNoData
	case m.Rcode == dns.RcodeNameError:
		return tNameError
	case m.Rcode == dns.RcodeServerFailure || m.Rcode == dns.RcodeNotImplemented:
		return tServerError
	case ns > 0 && m.Rcode == dns.RcodeSuccess:
		return tDelegation
	case m.Rcode == dns.RcodeSuccess:
		return tNoError
	}
	return tOtherError
}
