package server

import (
	"net/netip"
	"sync/atomic"

	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// Stats counts what the server did. Fields are read by the metrics
// collector at scrape time.
type Stats struct {
	RequestsUDP atomic.Uint64
	RequestsTCP atomic.Uint64
	// Responses by rcode: index 0-15 are header rcodes, 16 is BADVERS.
	Responses [17]atomic.Uint64
	// Malformed queries answered FORMERR/NOTIMP/BADVERS; Dropped messages
	// that could not be answered at all.
	Malformed atomic.Uint64
	Dropped   atomic.Uint64
	// HealthChecks: queries for the health name, answered by the server
	// and counted neither as hits nor as misses.
	HealthChecks atomic.Uint64
	// ReflectorDrops: UDP queries from a reflector source port (see
	// reflectorPort), dropped and counted (also in Dropped).
	ReflectorDrops atomic.Uint64
	TCPConns       atomic.Int64
	TCPRefused     atomic.Uint64
	// WaitingShareRejects: misses refused because their client held its
	// share of the waiting bound while only the reserve was free.
	WaitingShareRejects atomic.Uint64
	// TCPEvicted: idle client TCP connections closed to make room for a
	// new one; TCPOversized: connections closed because a query announced
	// more than MaxTCPQuery bytes.
	TCPEvicted      atomic.Uint64
	TCPOversized    atomic.Uint64
	TCPShareRejects atomic.Uint64
	// TCPAnswerDrops: answers to misses dropped, and their connections
	// closed, over the bound on TCP answers being written.
	TCPAnswerDrops atomic.Uint64
	_              [64]byte
}

func (st *Stats) countRequest(tcp bool) {
	if tcp {
		st.RequestsTCP.Add(1)
	} else {
		st.RequestsUDP.Add(1)
	}
}

func (st *Stats) countRcode(rcode int) {
	if rcode == wire.RcodeBadVers {
		rcode = 16
	}
	if rcode >= 0 && rcode < len(st.Responses) {
		st.Responses[rcode].Add(1)
	}
}

// Counters is a point-in-time sum of the server's and its Resolver's
// counters. Every client query that reached the cache is exactly one of a
// hit (the cache's counters, by kind), StaleServed or CacheMisses; health
// checks, malformed and dropped queries are none of them.
type Counters struct {
	RequestsUDP, RequestsTCP uint64
	Responses                [17]uint64
	Malformed, Dropped       uint64
	// Rejected: misses not admitted (the server's bound on waiting clients
	// and the Resolver's bounds), a part of CacheMisses.
	Rejected       uint64
	Coalesced      uint64
	UpstreamErrors uint64
	// CacheMisses: client queries the cache could not answer.
	CacheMisses uint64
	// StaleServed: client queries answered stale (RFC 8767), not misses.
	StaleServed    uint64
	HealthChecks   uint64
	ReflectorDrops uint64
	TCPConns       int64
	TCPRefused     uint64
	// Share rejects by bound (package fair): flights (the Resolvers'),
	// waiting clients, TCP connections (a new one refused because its
	// client held its share and no idle connection of its could go).
	ShareRejectsFlights, ShareRejectsWaiting, ShareRejectsTCP uint64
	TCPEvicted, TCPOversized, TCPAnswerDrops                  uint64
	// PrefetchSkipped: prefetches not started (the prefetches' share of
	// the flights held, or the question's last prefetch stalled).
	PrefetchSkipped uint64
	// TCPAnswerBytes: what the answers waiting to be written to TCP
	// clients hold now, as the bound on them counts it (MaxTCPAnswerBytes).
	TCPAnswerBytes int64
}

func (c *Counters) add(st *Stats) {
	c.RequestsUDP += st.RequestsUDP.Load()
	c.RequestsTCP += st.RequestsTCP.Load()
	for i := range st.Responses {
		c.Responses[i] += st.Responses[i].Load()
	}
	c.Malformed += st.Malformed.Load()
	c.Dropped += st.Dropped.Load()
	c.HealthChecks += st.HealthChecks.Load()
	c.ReflectorDrops += st.ReflectorDrops.Load()
	c.TCPConns += st.TCPConns.Load()
	c.TCPRefused += st.TCPRefused.Load()
	c.ShareRejectsWaiting += st.WaitingShareRejects.Load()
	c.ShareRejectsTCP += st.TCPShareRejects.Load()
	c.TCPEvicted += st.TCPEvicted.Load()
	c.TCPOversized += st.TCPOversized.Load()
	c.TCPAnswerDrops += st.TCPAnswerDrops.Load()
}

// Snapshot sums the counters of every socket. Each UDP socket counts on its
// own cache line so the serving loops never contend on a counter.
func (s *Server) Snapshot() Counters {
	var c Counters
	c.add(&s.stats)
	s.mu.Lock()
	all := s.allRes
	c.Rejected, c.Coalesced, c.UpstreamErrors = s.retired.Rejected, s.retired.Coalesced, s.retired.UpstreamErrors
	c.CacheMisses, c.StaleServed = s.retired.CacheMisses, s.retired.StaleServed
	c.ShareRejectsFlights, c.PrefetchSkipped = s.retired.ShareRejectsFlights, s.retired.PrefetchSkipped
	s.mu.Unlock()
	s.tcpOutMu.Lock()
	c.TCPAnswerBytes = int64(s.tcpOut.Used()) << 10
	s.tcpOutMu.Unlock()
	for _, r := range all {
		addResolverStats(&c, r)
	}
	for _, l := range s.udp {
		c.add(&l.stats)
	}
	return c
}

// addResolverStats adds r's counters to c.
func addResolverStats(c *Counters, r *resolve.Resolver) {
	rs := r.Stats()
	c.Rejected += rs.Rejected.Load()
	c.Coalesced += rs.Coalesced.Load()
	c.UpstreamErrors += rs.UpstreamErrors.Load()
	c.CacheMisses += rs.Misses.Load()
	c.StaleServed += rs.Stale.Load()
	c.ShareRejectsFlights += rs.ShareRejected.Load()
	c.PrefetchSkipped += rs.PrefetchSkipped.Load()
}

// RcodeLabel names index i of Counters.Responses.
func RcodeLabel(i int) string {
	names := [...]string{"NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED",
		"YXDOMAIN", "YXRRSET", "NXRRSET", "NOTAUTH", "NOTZONE", "RCODE11", "RCODE12", "RCODE13",
		"RCODE14", "RCODE15", "BADVERS"}
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "OTHER"
}

// CoreDNS-named accounting (coredns_dns_*): per query a request, a response
// by rcode, a duration and the two sizes, by server address and Corefile
// zone, as CoreDNS's prometheus plugin counts them. The counters are cells
// of one flat array indexed by small integers (server, zone, proto, family,
// type, rcode, bucket), so counting costs no lock, no map and no
// allocation. A UDP receive loop counts in plain memory it owns and
// publishes the cells it touched once per batch (cdCounters.flush); TCP
// and the miss path add to shared atomics. The metrics package sums and
// names the cells at scrape time (CDSnapshot).

// CDZone is a Corefile zone counted under coredns_dns_*: the zone label
// and the plugin label CoreDNS gives the answers of its block (the first
// handler after prometheus in the block's chain, "errors" in the stock
// Corefile).
type CDZone struct {
	Name   string // lower-case FQDN, "." for the root
	Plugin string
	// Off: the block has no prometheus directive, so its queries are not
	// counted (CoreDNS counts only in blocks that have one). It is listed
	// all the same so that its names do not count under a shorter zone.
	Off bool
}

// CDTypes are the query types CoreDNS's metrics name (plugin/metrics/vars
// monitorType); every other type counts as "other", the last index.
var CDTypes = [...]string{"A", "NS", "CNAME", "SOA", "PTR", "MX", "TXT", "AAAA", "SRV", "DS",
	"RRSIG", "NSEC", "DNSKEY", "NSEC3", "SVCB", "HTTPS", "IXFR", "AXFR", "ANY", "other"}

// cdTypeIndex maps a qtype below 256 to its index in CDTypes.
var cdTypeIndex = func() (t [256]uint8) {
	codes := [...]uint16{1, 2, 5, 6, 12, 15, 16, 28, 33, 43, 46, 47, 48, 50, 64, 65, 251, 252, 255}
	for i := range t {
		t[i] = uint8(len(CDTypes) - 1)
	}
	for i, c := range codes {
		t[c] = uint8(i)
	}
	return
}()

func cdType(qtype uint16) int {
	if qtype < 256 {
		return int(cdTypeIndex[qtype])
	}
	return len(CDTypes) - 1
}

// CDTimeBuckets are CoreDNS's plugin.TimeBuckets (0.25 ms doubling to
// 8 s); CDSizeBuckets the size buckets of plugin/metrics/vars.
var (
	CDTimeBuckets = [...]float64{0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128,
		0.256, 0.512, 1.024, 2.048, 4.096, 8.192}
	CDSizeBuckets = [...]float64{0, 100, 200, 300, 400, 511, 1023, 2047, 4095, 8291, 16e3, 32e3, 48e3, 64e3}
)

// cdTimeBucketsNs are CDTimeBuckets in nanoseconds.
var cdTimeBucketsNs = func() (b [len(CDTimeBuckets)]int64) {
	for i, v := range CDTimeBuckets {
		b[i] = int64(v * 1e9)
	}
	return
}()

func cdTimeBucket(ns int64) int { return bucketOf(cdTimeBucketsNs[:], ns) }

// bucketOf is the index of the first of bounds (increasing) at or above
// v; len(bounds) is the +Inf bucket.
func bucketOf[T int | int64](bounds []T, v T) int {
	for i, le := range bounds {
		if v <= le {
			return i
		}
	}
	return len(bounds)
}

// cdSizeBounds are CDSizeBuckets as ints (all whole numbers).
var cdSizeBounds = func() (b [len(CDSizeBuckets)]int) {
	for i, v := range CDSizeBuckets {
		b[i] = int(v)
	}
	return
}()

func cdSizeBucket(n int) int { return bucketOf(cdSizeBounds[:], n) }

// Cell layout of one (server, zone) block.
const (
	CDRcodes  = 24 // rcodes 0-23 (BADCOOKIE); all we ever send
	cdNTypes  = len(CDTypes)
	cdNTime   = len(CDTimeBuckets) + 1 // + the +Inf bucket
	cdNSize   = len(CDSizeBuckets) + 1
	cdReq     = 0                         // [proto 2][family 2][type]
	cdResp    = cdReq + 2*2*cdNTypes      // [rcode][plugin 2: the block's, ""]
	cdDur     = cdResp + CDRcodes*2       // [bucket], then the sum in ns
	cdReqSize = cdDur + cdNTime + 1       // [proto 2][bucket], then per proto the sum
	cdRspSize = cdReqSize + 2*(cdNSize+1) // same
	cdDo      = cdRspSize + 2*(cdNSize+1) // DO-bit requests
	cdCache   = cdDo + 1                  // hits success, hits denial, misses, served stale
	cdStride  = cdCache + 4
)

// CDDropped is CoreDNS's zone label for queries handled before any zone
// (vars.Dropped): we count malformed queries there, and the names no block
// on the query's address and port serves (CDDroppedZone).
const CDDropped = "dropped"

// CDDroppedZone is the metric zone (resolve.Block.Metric) of a name no
// block serves where it arrived: CoreDNS refuses it and counts it as
// dropped.
const CDDroppedZone = resolve.MetricDropped

// cdCounters holds the cells of every (server, zone) block.
type cdCounters struct {
	cells []atomic.Uint64
	// Owned by a UDP loop: plain counts, published by flush.
	own     []uint64
	dirty   []int32
	isDirty []bool
	// pend counts, per zone, the hits of the batch in hand whose duration
	// is added at flush (one clock read per batch).
	pend    []uint32
	hasPend bool
	srv     int // the loop's server index
}

func newCDCounters(servers, zones int, owned bool) *cdCounters {
	n := servers * zones * cdStride
	c := &cdCounters{cells: make([]atomic.Uint64, n)}
	if owned {
		c.own = make([]uint64, n)
		c.isDirty = make([]bool, n)
		c.dirty = make([]int32, 0, 64)
		c.pend = make([]uint32, zones)
	}
	return c
}

func (c *cdCounters) add(i int, v uint64) {
	if c.own == nil {
		c.cells[i].Add(v)
		return
	}
	c.own[i] += v
	if !c.isDirty[i] {
		c.isDirty[i] = true
		c.dirty = append(c.dirty, int32(i))
	}
}

// flush publishes an owned counter's batch: the pending hits' durations
// (elapsed since the batch was read) and every touched cell.
func (c *cdCounters) flush(nz int, elapsed int64) {
	for z, n := range c.pend {
		if n == 0 {
			continue
		}
		base := (c.srv*nz + z) * cdStride
		c.add(base+cdDur+cdTimeBucket(elapsed), uint64(n))
		c.add(base+cdDur+cdNTime, uint64(n)*uint64(elapsed))
		c.pend[z] = 0
	}
	c.hasPend = false
	for _, i := range c.dirty {
		c.cells[i].Store(c.own[i])
		c.isDirty[i] = false
	}
	c.dirty = c.dirty[:0]
}

// cdKey says where one query counts: its (server, zone) block, transport
// and family. zone < 0: the query's zone has no prometheus directive, so
// CoreDNS would not count it.
type cdKey struct {
	base  int32
	zone  int16
	proto uint8 // 0 udp, 1 tcp
	fam   uint8 // 0 IPv4 ("1"), 1 IPv6 ("2")
}

// cdZones are the counted Corefile zones.
type cdZones struct {
	zones []CDZone
	n     int // len(zones)+1: the last index is "dropped"
}

// cdKey returns the cells of a query arriving on server srv whose block's
// metric zone is metric (resolve.Block.Metric: an index in CoreDNSZones,
// -1 for none, CDDroppedZone): nothing here matches names.
func (s *Server) cdKey(srv, metric int, tcp bool) cdKey {
	k := cdKey{zone: -1}
	if s.cdz.n == 0 || srv < 0 {
		return k
	}
	if tcp {
		k.proto = 1
	}
	if a := s.cfg.Addrs[srv]; a.Is6() && !a.Is4In6() {
		k.fam = 1
	}
	z := metric
	if z == CDDroppedZone {
		z = len(s.cdz.zones)
	} else if z < 0 || z >= len(s.cdz.zones) || s.cdz.zones[z].Off {
		return k
	}
	k.zone = int16(z)
	k.base = int32((srv*s.cdz.n + z) * cdStride)
	return k
}

// cdRequest counts a query as it arrives.
func (c *cdCounters) request(k cdKey, q *wire.Query, size int) {
	if k.zone < 0 {
		return
	}
	b := int(k.base)
	c.add(b+cdReq+(int(k.proto)*2+int(k.fam))*cdNTypes+cdType(q.Type), 1)
	c.add(b+cdReqSize+int(k.proto)*(cdNSize+1)+cdSizeBucket(size), 1)
	c.add(b+cdReqSize+int(k.proto)*(cdNSize+1)+cdNSize, uint64(size))
	if q.DO {
		c.add(b+cdDo, 1)
	}
}

// response counts an answer; own says the block's plugin wrote it (a hit
// or an upstream's answer) rather than the server (our SERVFAIL, errors).
// dur < 0 leaves the duration to flush (UDP hits).
func (c *cdCounters) response(k cdKey, rcode int, own bool, size int, dur int64) {
	if k.zone < 0 {
		return
	}
	b := int(k.base)
	if rcode == wire.RcodeBadVers {
		rcode = 16
	}
	rcode = min(max(rcode, 0), CDRcodes-1)
	p := 1
	if own {
		p = 0
	}
	c.add(b+cdResp+rcode*2+p, 1)
	c.add(b+cdRspSize+int(k.proto)*(cdNSize+1)+cdSizeBucket(size), 1)
	c.add(b+cdRspSize+int(k.proto)*(cdNSize+1)+cdNSize, uint64(size))
	if dur < 0 {
		c.pend[k.zone]++
		c.hasPend = true
		return
	}
	c.add(b+cdDur+cdTimeBucket(dur), 1)
	c.add(b+cdDur+cdNTime, uint64(dur))
}

// cache counts a query that went through the cache: a fresh hit (success
// when it has answers, else denial, as CoreDNS's cache types them), a miss,
// or a stale answer.
func (c *cdCounters) cache(k cdKey, cell int) {
	if k.zone >= 0 {
		c.add(int(k.base)+cdCache+cell, 1)
	}
}

// Cache cells.
const (
	cdHitSuccess = iota
	cdHitDenial
	cdCacheMiss
	cdServedStale
)

// CDBlock is the sum of one (server, zone) block's cells.
type CDBlock struct {
	Server, Zone, Plugin string
	// Requests[proto][family][type]: proto 0 udp, 1 tcp; family 0 IPv4.
	Requests [2][2][cdNTypes]uint64
	// Responses[rcode][0]: the block's plugin wrote it; [1]: the server.
	Responses [CDRcodes][2]uint64
	// Duration: per bucket (not cumulative, last +Inf) and the sum in ns.
	Duration    [cdNTime]uint64
	DurationSum uint64
	// Sizes per proto: buckets (not cumulative) and sums.
	ReqSize, RespSize       [2][cdNSize]uint64
	ReqSizeSum, RespSizeSum [2]uint64
	DO                      uint64
	// Cache: fresh hits by type (success, denial), misses, stale answers.
	HitsSuccess, HitsDenial, CacheMisses, ServedStale uint64
}

// CDSnapshot sums the CoreDNS-named counters of every loop, one block per
// (server, zone) that has counted anything.
func (s *Server) CDSnapshot() []CDBlock {
	if s.cdz.n == 0 {
		return nil
	}
	n := len(s.cfg.Addrs) * s.cdz.n * cdStride
	sum := make([]uint64, n)
	add := func(c *cdCounters) {
		if c == nil {
			return
		}
		for i := range c.cells {
			sum[i] += c.cells[i].Load()
		}
	}
	add(s.cd)
	s.mu.Lock()
	for _, l := range s.udp {
		add(l.cd.Load())
	}
	s.mu.Unlock()
	var out []CDBlock
	for srv := range s.cfg.Addrs {
		for z := 0; z < s.cdz.n; z++ {
			c := sum[(srv*s.cdz.n+z)*cdStride:][:cdStride]
			var b CDBlock
			var any uint64
			for p := 0; p < 2; p++ {
				for f := 0; f < 2; f++ {
					for t := 0; t < cdNTypes; t++ {
						b.Requests[p][f][t] = c[cdReq+(p*2+f)*cdNTypes+t]
						any += b.Requests[p][f][t]
					}
				}
				for i := 0; i < cdNSize; i++ {
					b.ReqSize[p][i] = c[cdReqSize+p*(cdNSize+1)+i]
					b.RespSize[p][i] = c[cdRspSize+p*(cdNSize+1)+i]
				}
				b.ReqSizeSum[p] = c[cdReqSize+p*(cdNSize+1)+cdNSize]
				b.RespSizeSum[p] = c[cdRspSize+p*(cdNSize+1)+cdNSize]
			}
			for r := 0; r < CDRcodes; r++ {
				b.Responses[r] = [2]uint64{c[cdResp+r*2], c[cdResp+r*2+1]}
				any += c[cdResp+r*2] + c[cdResp+r*2+1]
			}
			copy(b.Duration[:], c[cdDur:cdDur+cdNTime])
			b.DurationSum = c[cdDur+cdNTime]
			b.DO = c[cdDo]
			b.HitsSuccess, b.HitsDenial = c[cdCache+cdHitSuccess], c[cdCache+cdHitDenial]
			b.CacheMisses, b.ServedStale = c[cdCache+cdCacheMiss], c[cdCache+cdServedStale]
			if any == 0 {
				continue
			}
			b.Server = s.cdServer(srv)
			if z < len(s.cdz.zones) {
				b.Zone, b.Plugin = s.cdz.zones[z].Name, s.cdz.zones[z].Plugin
			} else {
				b.Zone = CDDropped
			}
			out = append(out, b)
		}
	}
	return out
}

// cdServerIndex is the index in Config.Addrs of a local socket address,
// -1 if none (an adopted socket on another address). A socket of port 0
// (tests) is its address's first.
func (s *Server) cdServerIndex(ap netip.AddrPort) int {
	a := ap.Addr()
	for i, x := range s.cfg.Addrs {
		if p := s.cfg.port(i); sameAddr(x, a) && (p == 0 || p == int(ap.Port())) {
			return i
		}
	}
	return -1
}

// cdServer is CoreDNS's server label of Addrs[i]: "dns://" and the
// address and port it listens on.
func (s *Server) cdServer(i int) string {
	port := uint16(s.cfg.port(i))
	s.mu.Lock()
	for _, l := range s.udp {
		if port == 0 && sameAddr(l.local.Addr(), s.cfg.Addrs[i]) {
			port = l.local.Port()
			break
		}
	}
	s.mu.Unlock()
	return "dns://" + netip.AddrPortFrom(s.cfg.Addrs[i].Unmap(), port).String()
}

// CDServers lists the server labels of every listen address.
func (s *Server) CDServers() []string {
	out := make([]string, len(s.cfg.Addrs))
	for i := range out {
		out[i] = s.cdServer(i)
	}
	return out
}
