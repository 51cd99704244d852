// Package hosts answers A, AAAA and PTR questions from a hosts file and
// inline entries, as CoreDNS's hosts plugin does (`hosts [FILE [ZONES...]]
// { ENTRIES; ttl SECONDS; no_reverse; reload DURATION; fallthrough
// [ZONES...]; fallthrough_unsupported }`).
//
// It runs on the fetch side of the cache (plugin.cfg puts cache before
// hosts): what it answers is cached for the entries' TTL (ttl, default
// 3600 s) like any answer. Answers are authoritative. A name in the zones
// with no entry goes on (fallthrough) or gets SERVFAIL (ErrServFail, not
// cached); a name with entries of the other family gets NOERROR without
// records. PTR records are made for every entry (unless no_reverse), for
// reverse names inside or outside the zones.
//
// The file is read at New and then, as CoreDNS polls it every reload
// interval (default 5 s, 0: never), checked when a question arrives and
// the interval has passed since the last check: re-read when its
// modification time or size changed. There is no goroutine to stop; the
// answers reflect the file as of at most one interval before the miss.
package hosts

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/directive"

	"github.com/nodelocaldns/nodelocaldns/internal/zone"
)

// Defaults as CoreDNS's hosts plugin.
const (
	DefaultPath   = "/etc/hosts"
	DefaultTTL    = 3600
	DefaultReload = 5 * time.Second
	// maxFieldSize drops an address or name longer than this (CoreDNS's
	// bound: a line of garbage must not grow memory).
	maxFieldSize = 1024
	// maxFileSize bounds what is read of the file: far above any hosts
	// file, it keeps /dev/zero from filling memory.
	maxFileSize = 64 << 20
)

// Config is one `hosts` directive.
type Config struct {
	Path                   string   // "" : no file (inline entries only)
	Zones                  []string // lower-case FQDNs (the block's zones when none are given)
	Inline                 []string // entry lines inside the block
	TTL                    uint32
	NoReverse              bool
	Reload                 time.Duration // 0: the file is read once
	Fallthrough            []string      // nil: no fallthrough
	FallthroughUnsupported bool          // types other than A, AAAA, PTR go on
}

// Next is the rest of the chain.
type Next = directive.Next

// ErrServFail: a name in the zones with no entry and no fallthrough
// (CoreDNS answers SERVFAIL without passing it through its cache).
var ErrServFail = errors.New("hosts: SERVFAIL")

// Stats counts what the plugin did (CoreDNS: coredns_hosts_entries,
// coredns_hosts_reload_timestamp_seconds).
type Stats struct {
	Entries atomic.Int64 // entries of the file and inline
	// ReloadUnix is the modification time (unix seconds) of the file as
	// last read.
	ReloadUnix atomic.Int64
	Reloads    atomic.Uint64 // times the file was (re)read
	// Skipped is the number of lines of the file, as last read, that
	// CoreDNS skips and so do we (SkippedLine).
	Skipped atomic.Int64
}

// entries is one parsed source.
type entries struct {
	name4, name6, wild4, wild6 map[string][]netip.Addr
	addr                       map[netip.Addr][]string
	n                          int
	// skipped counts the lines skipped (SkippedLine); the first
	// maxSkippedKept of them are kept, to be logged.
	skipped int
	first   []SkippedLine
}

// SkippedLine is a line of a hosts file that CoreDNS skips, and so do we:
// never silently (logged once with the file and line number when the file
// is read, counted in nodelocaldns_config_skipped_entries, listed by
// -check-config).
type SkippedLine struct {
	Line int
	Text string // at most maxSkippedText bytes of it
	Why  string
}

// What a read keeps of its skipped lines to log: a file of garbage must
// neither flood the log nor grow memory.
const (
	maxSkippedKept = 10
	maxSkippedText = 120
)

// Handler is one block's hosts.
type Handler struct {
	cfg    Config
	clk    clock.Clock
	log    *slog.Logger
	inline *entries
	Stats  Stats

	// Where Report asked the gauges to go too (internal/metrics'
	// HostsCounters); nil when not.
	entriesOut, reloadOut, skippedOut *atomic.Int64

	mu        sync.RWMutex
	file      *entries
	mtime     time.Time
	size      int64
	checked   time.Time
	missingAt bool // the file was missing at the last check (logged once)
}

// New reads the inline entries and the file. A missing file is not an
// error (CoreDNS warns and serves the inline entries): it is logged and
// read when it appears.
func New(cfg Config, clk clock.Clock, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, clk: clock.Or(clk), log: log}
	h.inline = h.parse(strings.NewReader(strings.Join(cfg.Inline, "\n")))
	h.file = newEntries()
	h.Stats.Entries.Store(int64(h.inline.n))
	h.readFile()
	return h
}

func newEntries() *entries {
	return &entries{
		name4: map[string][]netip.Addr{}, name6: map[string][]netip.Addr{},
		wild4: map[string][]netip.Addr{}, wild6: map[string][]netip.Addr{},
		addr: map[netip.Addr][]string{},
	}
}

// readFile re-reads the file when its modification time or size changed.
func (h *Handler) readFile() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checked = h.clk.Now()
	if h.cfg.Path == "" {
		return
	}
	f, err := os.Open(h.cfg.Path)
	if err != nil {
		if !h.missingAt {
			h.log.Warn("hosts file unreadable; serving the inline entries and what was read before", "file", h.cfg.Path, "err", err)
			h.missingAt = true
		}
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		if !h.missingAt {
			h.log.Warn("hosts file is not a regular file", "file", h.cfg.Path)
			h.missingAt = true
		}
		return
	}
	h.missingAt = false
	if st.ModTime().Equal(h.mtime) && st.Size() == h.size {
		return
	}
	h.file = h.parse(io.LimitReader(f, maxFileSize))
	h.mtime, h.size = st.ModTime(), st.Size()
	h.Stats.Entries.Store(int64(h.file.n + h.inline.n))
	h.Stats.ReloadUnix.Store(st.ModTime().Unix())
	h.Stats.Reloads.Add(1)
	h.Stats.Skipped.Store(int64(h.file.skipped))
	h.publish()
	// Once per content: the file is read again only when it changed.
	for _, l := range h.file.first {
		h.log.Warn("hosts file line skipped, as CoreDNS skips it", "file", h.cfg.Path, "line", l.Line, "text", l.Text, "why", l.Why)
	}
	if more := h.file.skipped - len(h.file.first); more > 0 {
		h.log.Warn("hosts file: more lines skipped, as CoreDNS skips them", "file", h.cfg.Path, "more", more)
	}
}

// Report makes the handler keep entries and reloadUnix (CoreDNS's
// coredns_hosts_entries and coredns_hosts_reload_timestamp_seconds) as it
// keeps Stats.Entries and Stats.ReloadUnix, from now on.
func (h *Handler) Report(entries, reloadUnix, skipped *atomic.Int64) {
	h.mu.Lock()
	h.entriesOut, h.reloadOut, h.skippedOut = entries, reloadUnix, skipped
	h.publish()
	h.mu.Unlock()
}

// publish copies the gauges to Report's (under mu).
func (h *Handler) publish() {
	if h.entriesOut != nil {
		h.entriesOut.Store(h.Stats.Entries.Load())
	}
	if h.reloadOut != nil {
		h.reloadOut.Store(h.Stats.ReloadUnix.Load())
	}
	if h.skippedOut != nil {
		h.skippedOut.Store(h.Stats.Skipped.Load())
	}
}

// maybeReload checks the file when the reload interval has passed.
func (h *Handler) maybeReload() {
	if h.cfg.Reload <= 0 || h.cfg.Path == "" {
		return
	}
	h.mu.RLock()
	due := h.clk.Now().Sub(h.checked) >= h.cfg.Reload
	h.mu.RUnlock()
	if due {
		h.readFile()
	}
}

// parse reads hosts-file lines: ADDRESS NAME..., # comments. A line
// CoreDNS skips (no address, or no name) is skipped and counted, as is a
// field longer than maxFieldSize (our bound: the line for an address, the
// name otherwise).
func (h *Handler) parse(r io.Reader) *entries {
	e := newEntries()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxFileSize)
	for no := 1; sc.Scan(); no++ {
		text := sc.Bytes()
		line := text
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(string(line))
		if len(f) == 0 {
			continue
		}
		why := ""
		a := f[0]
		if i := strings.IndexByte(a, '%'); i >= 0 {
			a = a[:i]
		}
		ip, err := netip.ParseAddr(a)
		switch {
		case len(f[0]) > maxFieldSize:
			why = "an address field over 1024 bytes"
		case err != nil:
			why = "the first field is no address"
		case len(f) < 2:
			why = "an address without a name"
		}
		if why != "" {
			e.skip(no, text, why)
			continue
		}
		ip = ip.Unmap()
		for _, n := range f[1:] {
			if len(n) > maxFieldSize {
				e.skip(no, text, "a name over 1024 bytes")
				continue
			}
			name := strings.ToLower(dns.Fqdn(n))
			if zone.Longest(h.cfg.Zones, name) == "" {
				continue
			}
			wild := len(name) >= 2 && name[:2] == "*."
			switch {
			case ip.Is4() && wild:
				e.wild4[name] = append(e.wild4[name], ip)
			case ip.Is4():
				e.name4[name] = append(e.name4[name], ip)
			case wild:
				e.wild6[name] = append(e.wild6[name], ip)
			default:
				e.name6[name] = append(e.name6[name], ip)
			}
			e.n++
			if !wild && !h.cfg.NoReverse {
				e.addr[ip] = append(e.addr[ip], name)
				e.n++
			}
		}
	}
	return e
}

// skip counts a skipped line and keeps the first ones.
func (e *entries) skip(no int, text []byte, why string) {
	e.skipped++
	if len(e.first) < maxSkippedKept {
		e.first = append(e.first, SkippedLine{Line: no, Text: string(text[:min(len(text), maxSkippedText)]), Why: why})
	}
}

// CheckFile reads the hosts file at path as the hosts directive would and
// returns the lines it skips (the first few) and how many there are, for
// -check-config. A file that does not exist yet is no error (the
// directive reads it when it appears).
func CheckFile(path string) (first []SkippedLine, skipped int, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return nil, 0, fmt.Errorf("%s is not a regular file", path)
	}
	h := &Handler{cfg: Config{Zones: []string{"."}}}
	e := h.parse(io.LimitReader(f, maxFileSize))
	return e.first, e.skipped, nil
}

// lookup returns the addresses of name (v4 or v6), the file's first.
func (h *Handler) lookup(name string, v4 bool) []netip.Addr {
	var out []netip.Addr
	for _, e := range []*entries{h.file, h.inline} {
		m, w := e.name6, e.wild6
		if v4 {
			m, w = e.name4, e.wild4
		}
		if ips, ok := m[name]; ok {
			out = append(out, ips...)
		} else if i, end := dns.NextLabel(name, 0); !end {
			out = append(out, w["*."+name[i:]]...)
		}
	}
	return out
}

// Serve answers r from the entries, or passes it to next.
func (h *Handler) Serve(ctx context.Context, r *dns.Msg, next Next) (*dns.Msg, error) {
	if len(r.Question) != 1 {
		return next(ctx, r)
	}
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	inZone := zone.Longest(h.cfg.Zones, name) != ""
	if !inZone && q.Qtype != dns.TypePTR {
		return next(ctx, r)
	}
	h.maybeReload()
	h.mu.RLock()
	var answers []dns.RR
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: h.cfg.TTL}
	switch q.Qtype {
	case dns.TypePTR:
		var names []string
		if ip, ok := fromReverse(name); ok {
			names = append(append(names, h.file.addr[ip]...), h.inline.addr[ip]...)
		}
		if len(names) == 0 {
			h.mu.RUnlock()
			return next(ctx, r)
		}
		for _, n := range names {
			answers = append(answers, &dns.PTR{Hdr: hdr, Ptr: n})
		}
	case dns.TypeA:
		for _, ip := range h.lookup(name, true) {
			answers = append(answers, &dns.A{Hdr: hdr, A: ip.AsSlice()})
		}
	case dns.TypeAAAA:
		for _, ip := range h.lookup(name, false) {
			answers = append(answers, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
	default:
		if h.cfg.FallthroughUnsupported && h.through(name) {
			h.mu.RUnlock()
			return next(ctx, r)
		}
	}
	other := len(answers) > 0 || len(h.lookup(name, true)) > 0 || len(h.lookup(name, false)) > 0
	h.mu.RUnlock()
	if !other {
		if h.through(name) {
			return next(ctx, r)
		}
		return nil, ErrServFail
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.Answer = answers
	return m, nil
}

func (h *Handler) through(name string) bool {
	return h.cfg.Fallthrough != nil && zone.Longest(h.cfg.Fallthrough, name) != ""
}

// fromReverse reads the address of an in-addr.arpa or ip6.arpa name.
func fromReverse(name string) (netip.Addr, bool) {
	switch {
	case strings.HasSuffix(name, ".in-addr.arpa."):
		l := strings.Split(strings.TrimSuffix(name, ".in-addr.arpa."), ".")
		if len(l) != 4 {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(l[3] + "." + l[2] + "." + l[1] + "." + l[0])
		return ip, err == nil
	case strings.HasSuffix(name, ".ip6.arpa."):
		l := strings.Split(strings.TrimSuffix(name, ".ip6.arpa."), ".")
		if len(l) != 32 {
			return netip.Addr{}, false
		}
		var b strings.Builder
		for i := 31; i >= 0; i-- {
			if len(l[i]) != 1 {
				return netip.Addr{}, false
			}
			b.WriteString(l[i])
			if i%4 == 0 && i > 0 {
				b.WriteByte(':')
			}
		}
		ip, err := netip.ParseAddr(b.String())
		return ip, err == nil
	}
	return netip.Addr{}, false
}
