package dnslog

import (
	"io"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Sink is where the blocks' log lines go: one writer shared by every
// block, one line per Write, lines never interleaved. Safe for concurrent
// use.
type Sink struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

// NewSink writes lines to w.
func NewSink(w io.Writer) *Sink { return &Sink{w: w, now: time.Now} }

// Log is one block's log: its rules, compiled, writing to a Sink. Never
// modified once built; safe for concurrent use. Which block answers a
// query, and so which Log (if any) logs it, is internal/blocks' to say.
type Log struct {
	rules []rule
	sink  *Sink
}

type rule struct {
	scope   string // lower-case FQDN
	classes Class
	format  format
}

// Compile builds the Log of a block's rules, writing to s; nil when the
// block has no rules (it does not log).
func (s *Sink) Compile(rules []Rule) *Log {
	if len(rules) == 0 {
		return nil
	}
	l := &Log{sink: s}
	for _, r := range rules {
		f := parseFormat(r.Format)
		if r.Metadata {
			f = f.withMetadata()
		}
		l.rules = append(l.rules, rule{scope: strings.ToLower(dns.Fqdn(r.Scope)), classes: r.Classes, format: f})
	}
	return l
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// Log writes e's line, the answer of a query to the block l is the log
// of, when one of its rules logs it: the first rule whose scope holds the
// name decides, by the answer's class. A nil Log logs nothing.
func (l *Log) Log(e *Entry) {
	if l == nil || e.Q == nil || !e.Q.HasQ {
		return
	}
	rules := l.rules
	var name string // lower-case presentation form, made once
	for i := range rules {
		r := &rules[i]
		if r.scope != "." {
			if name == "" {
				name = strings.ToLower(wire.NameString(e.Q.Name))
			}
			if !zone.Holds(r.scope, name) {
				continue
			}
		}
		// CoreDNS: the first rule whose scope holds the name decides.
		if r.classes != All && r.classes&Classify(e.Resp, l.sink.now()) == 0 {
			return
		}
		p := bufPool.Get().(*[]byte)
		b := append((*p)[:0], "[INFO] "...)
		b = append(r.format.appendLine(b, e), '\n')
		l.sink.mu.Lock()
		_, _ = l.sink.w.Write(b)
		l.sink.mu.Unlock()
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
