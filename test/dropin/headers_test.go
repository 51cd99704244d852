package dropin

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// Header bits, as on the wire (RFC 1035 §4.1.1, RFC 4035 §3.1).
const (
	hQR    = 1 << 15
	hAA    = 1 << 10
	hTC    = 1 << 9
	hRD    = 1 << 8
	hRA    = 1 << 7
	hZ     = 1 << 6
	hAD    = 1 << 5
	hCD    = 1 << 4
	hOp    = 0xF << 11
	hRcode = 0xF
	hEvery = hAA | hTC | hRD | hRA | hZ | hAD | hCD
)

// hdrQuery is one question of the header test, asked of each server.
type hdrQuery struct {
	name    string // a case name: its kind, then the query's header bits
	qname   string
	opcode  int
	bits    uint16 // header bits set in the query
	qd      int    // questions (1 unless FORMERR's 2)
	edns    bool
	do      bool
	badVers bool
	qtype   uint16
	tcp     bool
	before  int           // asked this many times before the answer examined (hits)
	wait    time.Duration // between the last asking and the one examined (stale)
	timeout time.Duration
}

// kind is the case's answer kind: its name's first word.
func (q hdrQuery) kind() string { return strings.Fields(q.name)[0] }

// headerCases are every answer kind (errors of our own, local answers,
// misses, hits, stale and truncated answers), each asked with the header
// bits that test a rule: RD alone (dig's), RD with CD, AD or DO, none, and
// every bit of the header at once.
func headerCases() []hdrQuery {
	var cs []hdrQuery
	add := func(q hdrQuery) {
		if q.qd == 0 {
			q.qd = 1
		}
		if q.qtype == 0 {
			q.qtype = dns.TypeA
		}
		if q.timeout == 0 {
			q.timeout = 3 * time.Second
		}
		cs = append(cs, q)
	}
	flags := []struct {
		name string
		bits uint16
		do   bool
	}{
		{"rd", hRD, false}, {"rd+cd", hRD | hCD, false}, {"rd+ad", hRD | hAD, false}, {"do", hRD, true},
		{"none", 0, false}, {"every-but-tc", hEvery &^ hTC, false}, {"every", hEvery, false},
	}
	for i, f := range flags {
		q := func(kind string) hdrQuery {
			return hdrQuery{name: kind + " " + f.name, bits: f.bits, do: f.do, edns: f.do,
				qname: fmt.Sprintf("%s-%d.hdr.example.", strings.Split(kind, "-")[0], i)}
		}
		for _, op := range []int{15, 1, 2, 5} {
			n := q(fmt.Sprintf("notimp-op%d", op))
			n.opcode = op
			add(n)
		}
		n := q("formerr")
		n.qd = 2
		add(n)
		n = q("badvers")
		n.edns, n.badVers = true, true
		add(n)
		n = q("refused-axfr")
		n.qtype, n.tcp = dns.TypeAXFR, true
		add(n)
		n = q("servfail")
		n.qname = fmt.Sprintf("s%d.dead.example.", i)
		add(n)
		n = q("local")
		n.qname = "a.hosts.example."
		add(n)
		for _, k := range []string{"miss", "hit"} {
			for _, sub := range []string{"", "nx", "trunc"} {
				kind := strings.TrimSuffix(k+"-"+sub, "-")
				n = q(kind)
				n.qname = fmt.Sprintf("%s%d-%s.hdr.example.", map[string]string{"": "a", "nx": "nx", "trunc": "big"}[sub], i, k)
				if k == "hit" {
					n.before = 1
				}
				add(n)
			}
		}
		n = q("stale")
		n.qname, n.before, n.wait = fmt.Sprintf("stale%d.hdr.example.", i), 1, 1500*time.Millisecond
		add(n)
	}
	return cs
}

// pack is the query's wire form, its header bits set as given (Z too).
func (q hdrQuery) pack(id uint16) []byte {
	m := new(dns.Msg)
	m.SetQuestion(q.qname, q.qtype)
	m.Id, m.Opcode, m.RecursionDesired = id, q.opcode, false
	if q.qd == 2 {
		m.Question = append(m.Question, dns.Question{Name: "b." + q.qname, Qtype: dns.TypeA, Qclass: dns.ClassINET})
	}
	if q.edns {
		m.SetEdns0(1232, q.do)
		if q.badVers {
			m.IsEdns0().SetVersion(1)
		}
	}
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	f := binary.BigEndian.Uint16(b[2:])
	binary.BigEndian.PutUint16(b[2:], f&^hEvery|q.bits)
	return b
}

// hdrAnswer is what a server's answer header said: its flags word (with
// the 4-bit rcode) and its full rcode ("" when it did not answer).
type hdrAnswer struct {
	flags uint16
	id    uint16
	rcode string
	ttl   int64 // the first record's TTL; -1: no record
	err   string
}

func (a hdrAnswer) String() string {
	if a.err != "" {
		return a.err
	}
	var s []string
	for _, b := range []struct {
		bit  uint16
		name string
	}{{hQR, "qr"}, {hAA, "aa"}, {hTC, "tc"}, {hRD, "rd"}, {hRA, "ra"}, {hZ, "z"}, {hAD, "ad"}, {hCD, "cd"}} {
		if a.flags&b.bit != 0 {
			s = append(s, b.name)
		}
	}
	out := fmt.Sprintf("op%d %s %s", a.flags&hOp>>11, strings.Join(s, " "), a.rcode)
	if a.ttl >= 0 {
		out += fmt.Sprintf(" ttl=%d", a.ttl)
	}
	return out
}

// rawExchange sends b to addr over UDP or TCP and reads one answer.
func rawExchange(addr string, tcp bool, b []byte, timeout time.Duration) ([]byte, error) {
	network := "udp"
	if tcp {
		network = "tcp"
		b = append([]byte{byte(len(b) >> 8), byte(len(b))}, b...)
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(b); err != nil {
		return nil, err
	}
	buf := make([]byte, 0xFFFF+2)
	if !tcp {
		n, err := c.Read(buf)
		return buf[:n], err
	}
	if _, err := io.ReadFull(c, buf[:2]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(buf))
	_, err = io.ReadFull(c, buf[:n])
	return buf[:n], err
}

// askHeader asks q of the server at addr as the case says (before, wait)
// and reads the header of the answer examined.
func askHeader(addr string, q hdrQuery, id uint16) hdrAnswer {
	for range q.before {
		_, _ = rawExchange(addr, q.tcp, q.pack(id-1), q.timeout)
	}
	time.Sleep(q.wait)
	b, err := rawExchange(addr, q.tcp, q.pack(id), q.timeout)
	if err != nil {
		return hdrAnswer{err: "no answer: " + err.Error()}
	}
	if len(b) < 12 {
		return hdrAnswer{err: fmt.Sprintf("%d-byte answer", len(b))}
	}
	a := hdrAnswer{flags: binary.BigEndian.Uint16(b[2:]), id: binary.BigEndian.Uint16(b)}
	rcode := int(a.flags & hRcode)
	a.ttl = -1
	var m dns.Msg
	if m.Unpack(b) == nil {
		rcode = m.Rcode
		if len(m.Answer) > 0 {
			a.ttl = int64(m.Answer[0].Header().Ttl)
		}
	}
	a.rcode = dns.RcodeToString[rcode]
	if rcode == dns.RcodeBadVers {
		a.rcode = "BADVERS" // miekg/dns names 16 BADSIG, its TSIG meaning
	}
	if a.rcode == "" {
		a.rcode = fmt.Sprint(rcode)
	}
	return a
}

// headerUpstream answers as a validating upstream that writes its own
// header: AD set, CD never copied (as Knot and NSD), Z set, RA set, AA
// clear; NXDOMAIN for nx*, 40 addresses for big*, TTL 1 for stale*.
var headerUpstream = dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.CheckingDisabled, m.AuthenticatedData, m.Zero, m.RecursionAvailable = false, true, true, true
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	rr := func(s string) dns.RR { x, _ := dns.NewRR(s); return x }
	switch {
	case q.Qtype == dns.TypeAXFR:
	case strings.HasPrefix(name, "nx"):
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, rr("hdr.example. 300 IN SOA ns.hdr.example. h.hdr.example. 1 7200 1800 86400 60"))
	case strings.HasPrefix(name, "big"):
		for i := range 40 {
			m.Answer = append(m.Answer, rr(fmt.Sprintf("%s 300 IN A 192.0.2.%d", q.Name, i+1)))
		}
	case strings.HasPrefix(name, "stale"):
		m.Answer = append(m.Answer, rr(q.Name+" 1 IN A 192.0.2.1"))
	default:
		m.Answer = append(m.Answer, rr(q.Name+" 300 IN A 192.0.2.1"))
	}
	if o := r.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
	}
	_ = w.WriteMsg(m)
})

// brokenUpstream answers every query at once, over UDP and TCP, with a
// header that counts a question and no question after it: an answer no
// resolver can use. Unbound answers its own SERVFAIL at once (the stock
// answers FORMERR, ours waits for a usable answer until its timeout).
func brokenUpstream(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close(); _ = l.Close() })
	broken := func(q []byte) []byte { return []byte{q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0} }
	go func() {
		buf := make([]byte, 0xFFFF)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n >= 12 {
				_, _ = pc.WriteTo(broken(buf), from)
			}
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 0xFFFF)
				for {
					if _, err := io.ReadFull(c, buf[:2]); err != nil {
						return
					}
					n := int(binary.BigEndian.Uint16(buf))
					if _, err := io.ReadFull(c, buf[:n]); err != nil || n < 12 {
						return
					}
					_, _ = c.Write(append([]byte{0, 12}, broken(buf)...))
				}
			}()
		}
	}()
	return addr
}

// headerCorefile is ours' and the stock's: "." to the upstream with a
// cache serving stale answers at once, dead.example to a broken upstream, hosts.example answered from a hosts block.
func headerCorefile(port int, up, dead string) string {
	return fmt.Sprintf(`.:%[1]d {
    bind 127.0.0.1
    cache 30 {
        success 9984 30 1
        denial 9984 30 1
        serve_stale 1h immediate
    }
    forward . %[2]s
}
dead.example:%[1]d {
    bind 127.0.0.1
    forward . %[3]s
}
hosts.example:%[1]d {
    bind 127.0.0.1
    hosts {
        192.0.2.7 a.hosts.example
    }
}
`, port, up, dead)
}

// startUnboundFor runs Unbound as the same resolver: forwarding "." to up
// and dead.example to dead (brokenUpstream), serving expired answers at once, hosts.example
// from local data. It returns its address.
func startUnboundFor(t *testing.T, up, dead string) string {
	t.Helper()
	bin, err := exec.LookPath("unbound")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/unbound"); serr != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("unbound not installed")
			}
			t.Skip("unbound not installed")
		}
		bin = "/usr/sbin/unbound"
	}
	dir := t.TempDir()
	port := testhost.FreePort(t, "127.0.0.1")
	at := func(a string) string { h, p, _ := net.SplitHostPort(a); return h + "@" + p }
	conf := fmt.Sprintf(`server:
	interface: 127.0.0.1
	port: %d
	do-ip6: no
	do-daemonize: no
	chroot: ""
	username: ""
	directory: %q
	pidfile: %q
	use-syslog: no
	logfile: ""
	num-threads: 1
	module-config: "iterator"
	access-control: 127.0.0.0/8 allow
	do-not-query-localhost: no
	serve-expired: yes
	local-zone: "hosts.example." static
	local-data: "a.hosts.example. 3600 IN A 192.0.2.7"
forward-zone:
	name: "."
	forward-addr: %s
forward-zone:
	name: "dead.example."
	forward-addr: %s
remote-control:
	control-enable: no
`, port, dir, filepath.Join(dir, "unbound.pid"), at(up), at(dead))
	path := filepath.Join(dir, "unbound.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, []string{bin, "-d", "-c", path}, new(testhost.SyncBuffer))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitDNS(t, addr)
	return addr
}

// startHeaderServers runs ours, the stock node-cache and Unbound on
// loopback over one upstream (headerUpstream) and returns their addresses.
func startHeaderServers(t *testing.T) (ours, stock, unbound string) {
	t.Helper()
	stockBin := stockBinary(t)
	oursBin := buildNodelocaldns(t)
	up := serveDNS(t, headerUpstream)
	// A port nobody listens on (an address of loopback's /8 that no test
	// uses, a port below 1024): ours and the stock answer their own
	// SERVFAIL at once. Unbound, which retries such a port for seconds,
	// gets brokenUpstream instead: its SERVFAIL is as much its own.
	dead := fmt.Sprintf("127.%d.%d.%d:1", 100+rand.IntN(100), rand.IntN(256), 1+rand.IntN(254))
	dir := t.TempDir()
	free := func() int { return testhost.FreePort(t, "127.0.0.1") }
	pOurs, pStock := free(), free()
	confOurs, confStock := filepath.Join(dir, "ours.Corefile"), filepath.Join(dir, "stock.Corefile")
	for f, p := range map[string]int{confOurs: pOurs, confStock: pStock} {
		if err := os.WriteFile(f, []byte(headerCorefile(p, up, dead)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start(t, []string{oursBin, "-localip", "127.0.0.1", "-conf", confOurs, "-basecorefile", filepath.Join(dir, "none"),
		"-kubednscm=", "-setupinterface=false", "-setupiptables=false", "-state-dir=", "-skipteardown",
		"-kube-dns", fmt.Sprintf("127.0.0.1:%d", free()),
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", free()), "-health-listen-address", fmt.Sprintf("127.0.0.1:%d", free())}, new(testhost.SyncBuffer))
	start(t, []string{stockBin, "-localip", "127.0.0.1", "-conf", confStock, "-basecorefile", filepath.Join(dir, "none"),
		"-setupinterface=false", "-setupiptables=false", "-skipteardown", "-health-port", fmt.Sprint(free()),
		"-metrics-listen-address", fmt.Sprintf("127.0.0.1:%d", free())}, new(testhost.SyncBuffer))
	ours, stock = fmt.Sprintf("127.0.0.1:%d", pOurs), fmt.Sprintf("127.0.0.1:%d", pStock)
	waitDNS(t, ours)
	waitDNS(t, stock)
	return ours, stock, startUnboundFor(t, up, brokenUpstream(t))
}

// headerRule is one rule of the header: the bits it is about, the cases it
// covers, and of those the ones each oracle answers by it (asserted, so a
// change of an oracle shows); elsewhere the oracles' answers are logged
// with why the rule does not follow them.
type headerRule struct {
	name   string
	mask   uint16
	covers func(q hdrQuery) bool
	want   func(q hdrQuery) uint16 // ours' bits under mask
	// stock and unbound: the covered cases where the oracle agrees.
	stock, unbound func(q hdrQuery) bool
	why            string
}

func kindIs(kinds ...string) func(q hdrQuery) bool {
	return func(q hdrQuery) bool {
		for _, k := range kinds {
			if q.kind() == k || strings.HasPrefix(q.kind(), k+"-") {
				return true
			}
		}
		return false
	}
}

func and(fs ...func(q hdrQuery) bool) func(q hdrQuery) bool {
	return func(q hdrQuery) bool {
		for _, f := range fs {
			if !f(q) {
				return false
			}
		}
		return true
	}
}

func not(f func(q hdrQuery) bool) func(q hdrQuery) bool {
	return func(q hdrQuery) bool { return !f(q) }
}

func all(hdrQuery) bool  { return true }
func none(hdrQuery) bool { return false }

// sets reports whether the query's header sets any of bits.
func sets(bits uint16) func(q hdrQuery) bool {
	return func(q hdrQuery) bool { return q.bits&bits != 0 }
}

// errorKinds are the answers we write ourselves without data.
var errorKinds = kindIs("notimp", "formerr", "badvers", "refused", "servfail")

// misses and hits are the cases answered from an upstream's data.
var (
	misses = kindIs("miss")
	hits   = kindIs("hit", "stale")
	// stockRelays are the answers the stock relays as the upstream
	// wrote them: its misses (it never caches a truncated answer, so
	// asking again is a miss too) and AXFR, which it forwards.
	stockRelays = kindIs("miss", "hit-trunc", "refused")
	// unboundReads are the queries Unbound answers as queries: not one
	// with TC set (FORMERR, from the query's own header), nor a
	// non-recursive one for data it has not cached (REFUSED).
	unboundReads = and(not(sets(hTC)), not(and(kindIs("miss", "hit", "stale"), not(sets(hRD)))))
	// fromQueryHeader are the answers the oracles make from the query's
	// own header, copying what it sets: the stock's NOTIMP and FORMERR
	// (miekg/dns's reject path), Unbound's NOTIMP, FORMERR and AXFR
	// refusal (its early checks).
	fromQueryHeader = kindIs("notimp", "formerr", "refused")
)

// headerRules are the header's rules, each with the RFC it follows and
// where the stock node-cache and Unbound agree with it.
func headerRules() []headerRule {
	or := func(fs ...func(q hdrQuery) bool) func(q hdrQuery) bool {
		return func(q hdrQuery) bool {
			for _, f := range fs {
				if f(q) {
					return true
				}
			}
			return false
		}
	}
	isDO := func(q hdrQuery) bool { return q.do }
	withEDNS := func(q hdrQuery) bool { return q.edns }
	return []headerRule{{
		name: "QR set, opcode echoed (RFC 1035 §4.1.1)", mask: hQR | hOp, covers: all,
		want:  func(q hdrQuery) uint16 { return hQR | uint16(q.opcode)<<11 },
		stock: all, unbound: all,
	}, {
		name: "RD copied from the query (RFC 1035 §4.1.1)", mask: hRD, covers: all,
		want:  func(q hdrQuery) uint16 { return q.bits & hRD },
		stock: all, unbound: all,
	}, {
		name: "NOTIMP for an opcode not implemented (RFC 1035 §4.1.1)", mask: hRcode, covers: kindIs("notimp"),
		want:  func(hdrQuery) uint16 { return dns.RcodeNotImplemented },
		stock: all, unbound: not(sets(hTC)),
		why: "Unbound answers FORMERR to a query with TC set before it looks at the opcode",
	}, {
		name: "no RA on NOTIMP or FORMERR: recursion is offered for a QUERY read whole", mask: hRA, covers: kindIs("notimp", "formerr"),
		want:  func(hdrQuery) uint16 { return 0 },
		stock: not(sets(hRA)), unbound: not(sets(hRA)),
		why: "both answer these from the query's own header and so copy its RA",
	}, {
		name: "RA on every other answer: every name is resolved for the client", mask: hRA, covers: not(kindIs("notimp", "formerr")),
		want:  func(hdrQuery) uint16 { return hRA },
		stock: or(misses, hits), unbound: or(not(kindIs("refused")), sets(hRA)),
		why: "the stock relays the upstream's RA (none from kube-dns answering with authority) and sets none on its own SERVFAIL, BADVERS and hosts answers (docs/migration.md); Unbound answers AXFR from the query's own header",
	}, {
		name: "CD copied from the query (RFC 4035 §3.2.2, RFC 6895 §2), whatever the upstream's header", mask: hCD, covers: all,
		want:  func(q hdrQuery) uint16 { return q.bits & hCD },
		stock: not(stockRelays), unbound: all,
		why: "the stock relays a miss's header as the upstream wrote it: an upstream that does not copy CD (Knot, NSD) clears it; its cache copies the client's",
	}, {
		name: "no AD on an answer without data (RFC 4035 §3.2.3)", mask: hAD, covers: or(errorKinds, kindIs("local")),
		want:    func(hdrQuery) uint16 { return 0 },
		stock:   or(kindIs("badvers", "servfail", "local"), and(not(sets(hAD)), not(isDO))),
		unbound: and(unboundReads, or(not(fromQueryHeader), not(sets(hAD)))),
		why:     "both copy the query's AD into the answers they make from the query's header; the stock forwards AXFR and relays the upstream's AD",
	}, {
		name: "AD from the upstream only for a client that asked about DNSSEC, DO or AD (RFC 6840 §5.8)", mask: hAD, covers: or(misses, hits),
		want: func(q hdrQuery) uint16 {
			if q.do || q.bits&hAD != 0 {
				return hAD
			}
			return 0
		},
		stock: all, unbound: none,
		why: "Unbound here runs no validator (module-config iterator) and sets AD on nothing; the stock and we pass on a validating upstream's AD",
	}, {
		name: "AA never: a cache is no authority for what it answers (RFC 1035 §4.1.1)", mask: hAA, covers: all,
		want:    func(hdrQuery) uint16 { return 0 },
		stock:   or(errorKinds, stockRelays),
		unbound: and(unboundReads, not(kindIs("local")), or(not(fromQueryHeader), not(sets(hAA)))),
		why:     "the stock sets AA on every answer from its cache and on hosts answers (docs/migration.md); Unbound on its local data, and it copies the query's AA into the answers it makes from the query's header",
	}, {
		name: "Z never (RFC 1035 §4.1.1), neither the query's nor the upstream's", mask: hZ, covers: all,
		want:    func(hdrQuery) uint16 { return 0 },
		stock:   not(stockRelays),
		unbound: and(unboundReads, or(not(fromQueryHeader), not(sets(hZ)))),
		why:     "the stock relays a miss's header, Z and all; Unbound copies the query's Z into the answers it makes from the query's header",
	}, {
		name: "TC only on an answer cut short (RFC 1035 §4.1.1)", mask: hTC, covers: all,
		want: func(q hdrQuery) uint16 {
			if strings.HasSuffix(q.kind(), "-trunc") && !q.edns {
				return hTC
			}
			return 0
		},
		stock: and(not(sets(hTC)), not(and(kindIs("miss-trunc", "hit-trunc"), withEDNS))), unbound: unboundReads,
		why: "the stock copies the query's TC into NOTIMP and FORMERR, and cuts the upstream's 40 uncompressed records at 1232 bytes where ours, compressed, fit (docs/migration.md); Unbound answers FORMERR to a query with TC set",
	}}
}

// The header of every answer kind, rule by rule (headerRules), against
// the stock node-cache and Unbound over the same upstream: one that
// validates (AD) but does not copy CD and sets Z. Every case is asked of
// all three; a rule asserts ours, and each oracle where it agrees (so a
// change of an oracle shows), and logs what the oracles do elsewhere.
func TestAnswerHeadersWithStockAndUnbound(t *testing.T) {
	if testing.Short() {
		t.Skip("builds our binary and runs three servers")
	}
	servers := map[string]string{}
	servers["ours"], servers["stock"], servers["unbound"] = startHeaderServers(t)
	cases := headerCases()
	got := map[string][]hdrAnswer{}
	done := make(chan struct{})
	var results [3][]hdrAnswer
	names := []string{"ours", "stock", "unbound"}
	for i, n := range names {
		go func() {
			defer func() { done <- struct{}{} }()
			results[i] = askAll(servers[n], cases)
		}()
	}
	for range names {
		<-done
	}
	var table strings.Builder
	for i, n := range names {
		got[n] = results[i]
	}
	for i, c := range cases {
		fmt.Fprintf(&table, "%-30s ours %-32s stock %-32s unbound %s\n", c.name, got["ours"][i], got["stock"][i], got["unbound"][i])
	}
	t.Logf("answers (ours, the stock, Unbound):\n%s", table.String())
	for i, c := range cases {
		if a := got["ours"][i]; a.err != "" || a.id != uint16(1000+2*i) {
			t.Errorf("%s: ours: %s, ID %d (want %d)", c.name, a, a.id, 1000+2*i)
		}
		if a := got["ours"][i]; c.kind() == "stale" && (a.rcode != "NOERROR" || a.ttl == 1) {
			// A fetch would show the upstream's TTL of 1.
			t.Errorf("%s: ours %s, want a stale answer", c.name, a)
		}
	}
	for _, r := range headerRules() {
		t.Run(r.name, func(t *testing.T) {
			checkHeaderRule(t, r, cases, got)
		})
	}
}

// askAll asks every case of addr: first what the cases ask before (so
// hits are cached and stale entries stored), then, once the stale
// entries' TTL of 1 s has run out, the answers examined, with IDs
// 1000+2i.
func askAll(addr string, cases []hdrQuery) []hdrAnswer {
	wait := time.Duration(0)
	for i, c := range cases {
		for range c.before {
			_, _ = rawExchange(addr, c.tcp, c.pack(uint16(999+2*i)), c.timeout)
		}
		wait = max(wait, c.wait)
	}
	time.Sleep(wait)
	out := make([]hdrAnswer, len(cases))
	for i, c := range cases {
		c.before, c.wait = 0, 0
		out[i] = askHeader(addr, c, uint16(1000+2*i))
	}
	return out
}

// checkHeaderRule asserts rule r on ours for every case it covers and on
// each oracle where the rule says it agrees; it logs the oracles' other
// answers.
func checkHeaderRule(t *testing.T, r headerRule, cases []hdrQuery, got map[string][]hdrAnswer) {
	t.Helper()
	covered, agreed, differ := 0, map[string]int{}, map[string][]string{}
	for i, c := range cases {
		if !r.covers(c) {
			continue
		}
		covered++
		want := r.want(c) & r.mask
		if a := got["ours"][i]; a.err != "" || a.flags&r.mask != want {
			t.Errorf("%s: ours %s, want %04x under mask %04x", c.name, a, want, r.mask)
		}
		for _, o := range []struct {
			name  string
			agree func(q hdrQuery) bool
		}{{"stock", r.stock}, {"unbound", r.unbound}} {
			a := got[o.name][i]
			switch {
			case o.agree(c) && (a.err != "" || a.flags&r.mask != want):
				t.Errorf("%s: %s %s, the rule's %04x under mask %04x: the oracle changed", c.name, o.name, a, want, r.mask)
			case o.agree(c):
				agreed[o.name]++
			case a.err == "" && a.flags&r.mask != want:
				differ[o.name] = append(differ[o.name], c.name+": "+a.String())
			}
		}
	}
	if covered == 0 {
		t.Fatal("no case covered")
	}
	t.Logf("%d cases; the stock agrees on %d, Unbound on %d", covered, agreed["stock"], agreed["unbound"])
	for _, o := range []string{"stock", "unbound"} {
		if len(differ[o]) > 0 {
			t.Logf("%s differs (%s) on %d: %s", o, r.why, len(differ[o]), strings.Join(differ[o], "; "))
		}
	}
}
