// Command upstream is the bench's test upstream: a fast authoritative-style
// responder that answers any name, so that it can play both kube-dns (the
// cluster domain, reached over TCP by a node-local cache) and the node's
// resolvers (everything else, reached over UDP).
//
// Every name gets an answer built straight in wire format, without unpacking:
//
//   - a name whose first label starts with "nx" gets NXDOMAIN with an SOA;
//   - A and AAAA get one record, its address derived from the name;
//   - any other type gets NODATA with an SOA.
//
// TTLs are realistic: the cluster domain answers with -cluster-ttl (30 s, as a
// kubeadm Corefile's "ttl 30"), other names with -external-ttl (300 s).
//
// TCP follows RFC 7766: queries pipelined on one connection are read while
// earlier ones are answered, and with -jitter they are answered out of order.
//
// It prints the queries it answered per listener and transport on exit, and
// answers "_stats.upstream.bench. TXT" with the totals so far
// ("udp=N tcp=N tcp_conns=N"), so that a bench can tell how many queries a
// cache forwarded.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	headerLen = 12
	typeA     = 1
	typeSOA   = 6
	typeTXT   = 16
	typeAAAA  = 28
	typeOPT   = 41
	classIN   = 1

	rcodeNoError  = 0
	rcodeFormErr  = 1
	rcodeNXDomain = 3
	rcodeNotImp   = 4

	// 1232 bytes: the DNS flag day 2020 EDNS buffer size, what real servers advertise.
	ednsSize = 1232
	// 64 KiB: the largest DNS message over TCP; UDP queries are far smaller.
	maxMsg = 65535
)

// Policy is what the responder puts in its answers.
type Policy struct {
	Zone        string        // the cluster domain, lower case, with a trailing dot
	ClusterTTL  uint32        // TTL of answers in Zone
	ExternalTTL uint32        // TTL of answers elsewhere
	ClusterNeg  uint32        // SOA TTL and MINIMUM in Zone (negative caching)
	ExternalNeg uint32        // SOA TTL and MINIMUM elsewhere
	Delay       time.Duration // added before every answer
	Jitter      time.Duration // random extra delay in [0, Jitter): reorders pipelined TCP answers
	Stats       func() string // text of the "_stats.upstream.bench. TXT" answer; nil: no such name
}

// statsName is the name whose TXT record carries the query counters.
const statsName = "_stats.upstream.bench."

// Counters are the queries one listener answered.
type Counters struct {
	UDP, TCP, Conns atomic.Uint64
}

func main() {
	var (
		listen      = flag.String("listen", "127.0.0.2:53,127.0.0.3:53", "comma-separated addresses to serve on, UDP and TCP")
		zone        = flag.String("zone", "cluster.local", "cluster domain")
		clusterTTL  = flag.Uint("cluster-ttl", 30, "TTL of answers in the cluster domain, seconds")
		externalTTL = flag.Uint("external-ttl", 300, "TTL of answers outside the cluster domain, seconds")
		clusterNeg  = flag.Uint("cluster-negative-ttl", 30, "SOA TTL/MINIMUM for denials in the cluster domain, seconds")
		externalNeg = flag.Uint("external-negative-ttl", 60, "SOA TTL/MINIMUM for denials elsewhere, seconds")
		delay       = flag.Duration("delay", 0, "delay before every answer")
		jitter      = flag.Duration("jitter", 0, "random extra delay per answer (reorders pipelined TCP answers)")
		idle        = flag.Duration("tcp-idle", 10*time.Second, "close a TCP connection idle this long (CoreDNS: 10 s)")
		readers     = flag.Int("udp-readers", runtime.GOMAXPROCS(0), "goroutines reading each UDP socket")
	)
	flag.Parse()
	p := Policy{
		Zone:        strings.ToLower(strings.TrimSuffix(*zone, ".")) + ".",
		ClusterTTL:  uint32(*clusterTTL),
		ExternalTTL: uint32(*externalTTL),
		ClusterNeg:  uint32(*clusterNeg),
		ExternalNeg: uint32(*externalNeg),
		Delay:       *delay,
		Jitter:      *jitter,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	type listener struct {
		addr string
		c    *Counters
	}
	var ls []listener
	p.Stats = func() string {
		var udp, tcp, conns uint64
		for _, l := range ls {
			udp += l.c.UDP.Load()
			tcp += l.c.TCP.Load()
			conns += l.c.Conns.Load()
		}
		return fmt.Sprintf("udp=%d tcp=%d tcp_conns=%d", udp, tcp, conns)
	}
	for _, a := range strings.Split(*listen, ",") {
		if a = strings.TrimSpace(a); a != "" {
			ls = append(ls, listener{a, new(Counters)})
		}
	}
	var wg sync.WaitGroup
	for _, l := range ls {
		if err := serve(ctx, &wg, l.addr, p, l.c, *readers, *idle); err != nil {
			fmt.Fprintf(os.Stderr, "upstream: %v\n", err)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "upstream: serving on %s\n", *listen)
	<-ctx.Done()
	for _, l := range ls {
		fmt.Fprintf(os.Stderr, "upstream: %s udp=%d tcp=%d tcp_conns=%d\n",
			l.addr, l.c.UDP.Load(), l.c.TCP.Load(), l.c.Conns.Load())
	}
}

// serve starts UDP and TCP service on addr; both stop when ctx is done.
func serve(ctx context.Context, wg *sync.WaitGroup, addr string, p Policy, c *Counters, readers int, idle time.Duration) error {
	uc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listen udp %s: %w", addr, err)
	}
	udp := uc.(*net.UDPConn)
	// 4 MiB: room for bursts from a cache forwarding a whole miss workload at once.
	_ = udp.SetReadBuffer(4 << 20)
	_ = udp.SetWriteBuffer(4 << 20)
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		_ = udp.Close()
		return fmt.Errorf("listen tcp %s: %w", addr, err)
	}
	go func() {
		<-ctx.Done()
		_ = udp.Close()
		_ = tl.Close()
	}()
	for range max(readers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveUDP(udp, p, c)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := tl.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			c.Conns.Add(1)
			go serveTCP(conn, p, c, idle)
		}
	}()
	return nil
}

func serveUDP(conn *net.UDPConn, p Policy, c *Counters) {
	in := make([]byte, maxMsg)
	out := make([]byte, 0, 1024)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(in)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		resp := Answer(out[:0], in[:n], p)
		if resp == nil {
			continue
		}
		if p.Delay > 0 || p.Jitter > 0 {
			resp = append([]byte(nil), resp...)
			go func(resp []byte, to netip.AddrPort) {
				time.Sleep(p.delay())
				_, _ = conn.WriteToUDPAddrPort(resp, to)
			}(resp, from)
		} else {
			_, _ = conn.WriteToUDPAddrPort(resp, from)
		}
		c.UDP.Add(1)
	}
}

// serveTCP reads pipelined queries and answers each as soon as it is ready;
// a single writer goroutine owns the connection's write side and flushes
// when no further answer is waiting.
func serveTCP(conn net.Conn, p Policy, c *Counters, idle time.Duration) {
	answers := make(chan []byte, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := bufio.NewWriterSize(conn, 64<<10)
		for a := range answers {
			if _, err := w.Write(a); err != nil {
				continue // keep draining so that senders never block
			}
			if len(answers) == 0 {
				_ = w.Flush()
			}
		}
		_ = w.Flush()
	}()
	var pending sync.WaitGroup
	r := bufio.NewReaderSize(conn, 64<<10)
	var lenBuf [2]byte
	for {
		_ = conn.SetReadDeadline(time.Now().Add(idle))
		if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
			break
		}
		q := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(r, q); err != nil {
			break
		}
		// 2 bytes of length prefix, then the message.
		resp := Answer(make([]byte, 2, 2+len(q)+128), q, p)
		if resp == nil {
			continue
		}
		binary.BigEndian.PutUint16(resp, uint16(len(resp)-2))
		c.TCP.Add(1)
		if p.Delay > 0 || p.Jitter > 0 {
			pending.Add(1)
			go func() {
				defer pending.Done()
				time.Sleep(p.delay())
				answers <- resp
			}()
			continue
		}
		answers <- resp
	}
	pending.Wait()
	close(answers)
	<-done
	_ = conn.Close()
}

func (p Policy) delay() time.Duration {
	d := p.Delay
	if p.Jitter > 0 {
		d += rand.N(p.Jitter)
	}
	return d
}

// Answer appends the response to query q to dst and returns it, or nil when q
// deserves no answer (too short, or itself a response).
func Answer(dst, q []byte, p Policy) []byte {
	if len(q) < headerLen || q[2]&0x80 != 0 {
		return nil
	}
	base := len(dst)
	flags2 := byte(0x80) // RA
	rd := q[2] & 0x01
	opcode := (q[2] >> 3) & 0x0f
	dst = append(dst, q[0], q[1], 0x80|0x04|rd|opcode<<3, flags2, 0, 0, 0, 0, 0, 0, 0, 0)
	if opcode != 0 {
		dst[base+3] |= rcodeNotImp
		return dst
	}
	if binary.BigEndian.Uint16(q[4:]) != 1 {
		dst[base+3] |= rcodeFormErr
		return dst
	}
	// The question, copied as it came (keeps the client's 0x20 case).
	name, labels, ok := readName(q, headerLen)
	if !ok || len(q) < name+4 {
		dst[base+3] |= rcodeFormErr
		return dst
	}
	qend := name + 4
	qtype := binary.BigEndian.Uint16(q[name:])
	qclass := binary.BigEndian.Uint16(q[name+2:])
	dst = append(dst, q[headerLen:qend]...)
	dst[base+5] = 1 // QDCOUNT

	qname := q[headerLen:name]
	inZone, zoneOff := zoneOf(qname, labels, p.Zone)
	ttl, neg := p.ExternalTTL, p.ExternalNeg
	if inZone {
		ttl, neg = p.ClusterTTL, p.ClusterNeg
	}
	if qtype == typeTXT && p.Stats != nil && nameEqual(qname, statsName) {
		txt := p.Stats()
		txt = txt[:min(len(txt), 255)]
		dst = append(dst, 0xc0, headerLen)
		dst = binary.BigEndian.AppendUint16(dst, typeTXT)
		dst = binary.BigEndian.AppendUint16(dst, classIN)
		dst = binary.BigEndian.AppendUint32(dst, 0)
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(txt)+1))
		dst = append(dst, byte(len(txt)))
		dst = append(dst, txt...)
		dst[base+7] = 1 // ANCOUNT
		return dst
	}
	nx := len(qname) > 2 && qname[0] >= 2 && lower(qname[1]) == 'n' && lower(qname[2]) == 'x'

	switch {
	case nx:
		dst[base+3] |= rcodeNXDomain
		dst = appendSOA(dst, zoneOff, neg)
		dst[base+9] = 1 // NSCOUNT
	case qclass == classIN && (qtype == typeA || qtype == typeAAAA):
		sum := hashName(qname)
		dst = append(dst, 0xc0, headerLen) // pointer to the question name
		dst = binary.BigEndian.AppendUint16(dst, qtype)
		dst = binary.BigEndian.AppendUint16(dst, classIN)
		dst = binary.BigEndian.AppendUint32(dst, ttl)
		if qtype == typeA {
			// 10.0.0.0/8 in the cluster domain (a service range), 198.18.0.0/15 (benchmarking) elsewhere.
			if inZone {
				dst = append(dst, 0, 4, 10, byte(sum>>16), byte(sum>>8), byte(sum))
			} else {
				dst = append(dst, 0, 4, 198, 18|byte(sum>>16)&1, byte(sum>>8), byte(sum))
			}
		} else {
			dst = append(dst, 0, 16, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0,
				byte(sum>>24), byte(sum>>16), byte(sum>>8), byte(sum))
		}
		dst[base+7] = 1 // ANCOUNT
	default:
		dst = appendSOA(dst, zoneOff, neg)
		dst[base+9] = 1 // NSCOUNT
	}

	// EDNS: echo an OPT record (with the DO bit) when the query had one.
	if binary.BigEndian.Uint16(q[10:]) > 0 && len(q) >= qend+11 && q[qend] == 0 &&
		binary.BigEndian.Uint16(q[qend+1:]) == typeOPT {
		do := q[qend+7] & 0x80
		dst = append(dst, 0, 0, typeOPT, byte(ednsSize>>8), byte(ednsSize&0xff), 0, 0, do, 0, 0, 0)
		dst[base+11] = 1 // ARCOUNT
	}
	return dst
}

// appendSOA appends the zone's SOA record; zoneOff is the offset of the zone
// apex inside the question name (compression pointer target).
func appendSOA(dst []byte, zoneOff int, neg uint32) []byte {
	ptr := func(b []byte) []byte {
		return append(b, 0xc0|byte((headerLen+zoneOff)>>8), byte(headerLen+zoneOff))
	}
	dst = ptr(dst)
	dst = binary.BigEndian.AppendUint16(dst, typeSOA)
	dst = binary.BigEndian.AppendUint16(dst, classIN)
	dst = binary.BigEndian.AppendUint32(dst, neg)
	lenAt := len(dst)
	dst = append(dst, 0, 0)
	dst = append(dst, 2, 'n', 's', 3, 'd', 'n', 's')
	dst = ptr(dst)
	dst = append(dst, 10, 'h', 'o', 's', 't', 'm', 'a', 's', 't', 'e', 'r')
	dst = ptr(dst)
	// serial, refresh 7200, retry 1800, expire 86400, minimum.
	for _, v := range []uint32{1, 7200, 1800, 86400, neg} {
		dst = binary.BigEndian.AppendUint32(dst, v)
	}
	binary.BigEndian.PutUint16(dst[lenAt:], uint16(len(dst)-lenAt-2))
	return dst
}

// readName returns the offset just past the uncompressed name at off and the
// offsets of its labels; queries carry no compression pointers.
func readName(m []byte, off int) (end int, labels []int, ok bool) {
	labels = make([]int, 0, 8)
	for off < len(m) {
		l := int(m[off])
		if l == 0 {
			return off + 1, labels, true
		}
		if l&0xc0 != 0 || off+1+l > len(m) {
			return 0, nil, false
		}
		labels = append(labels, off-headerLen)
		off += 1 + l
	}
	return 0, nil, false
}

// zoneOf reports whether qname (wire form) lies in zone and returns the offset,
// inside qname, of the apex to use in an SOA: the zone itself, or for other
// names their last two labels (or the root for shorter names).
func zoneOf(qname []byte, labels []int, zone string) (bool, int) {
	zl := strings.Count(zone, ".")
	if zone == "." {
		zl = 0
	}
	if len(labels) >= zl && zl > 0 {
		off := labels[len(labels)-zl]
		if nameEqual(qname[off:], zone) {
			return true, off
		}
	}
	switch {
	case len(labels) >= 2:
		return false, labels[len(labels)-2]
	case len(labels) == 1:
		return false, labels[0]
	}
	return false, len(qname) - 1
}

// nameEqual compares a wire-form name with a dotted one, ignoring ASCII case.
func nameEqual(wire []byte, dotted string) bool {
	i := 0
	for _, label := range strings.Split(strings.TrimSuffix(dotted, "."), ".") {
		if i >= len(wire) || int(wire[i]) != len(label) || i+1+len(label) > len(wire) {
			return false
		}
		for j := range len(label) {
			if lower(wire[i+1+j]) != label[j] {
				return false
			}
		}
		i += 1 + len(label)
	}
	return i < len(wire) && wire[i] == 0
}

// hashName is FNV-1a over the lower-cased wire name: a stable address per name.
func hashName(wire []byte) uint32 {
	h := uint32(2166136261)
	for _, b := range wire {
		h ^= uint32(lower(b))
		h *= 16777619
	}
	return h
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}
