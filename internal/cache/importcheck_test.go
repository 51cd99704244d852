package cache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// stream wraps entries' records (appendEntry) as Export frames them.
func stream(recs ...[]byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, ExportVersion)
	for _, r := range recs {
		b = append(b, r...)
	}
	return append(b, 0, 0, 0, 0)
}

// crafted builds the entry of an answer to a.example. A with the records
// ans and lets mutate make it what a corrupt or hostile twin would send.
func crafted(t *testing.T, ans []string, mutate func(e *Entry)) (*Entry, *wire.Query) {
	t.Helper()
	_, q := query(t, "a.example.", dns.TypeA, 0, false)
	e, err := BuildStale(answer(t, "a.example.", dns.TypeA, 0, ans, nil, false), q, externalP, time.Second, time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if mutate != nil {
		mutate(e)
	}
	return e, q
}

// addrs is n A records of a.example.
func addrs(n int) []string {
	var ans []string
	for i := range n {
		ans = append(ans, fmt.Sprintf("a.example. 30 IN A 192.0.2.%d", i+1))
	}
	return ans
}

// setRdata rewrites every record of e to carry n bytes of data, its
// layout moved to match: the structure ParseAnswer reads stays
// consistent, only the records' contents are wrong (an A record of n
// bytes).
func setRdata(e *Entry, n int) {
	off := wire.HeaderLen + int(e.nameLen) + 4
	msg := append([]byte(nil), e.msg[:off]...)
	for i := range e.rrs {
		f := &e.rrs[i]
		msg = append(msg, e.msg[off:f.off+4]...)
		f.off = uint16(len(msg) - 4)
		msg = binary.BigEndian.AppendUint16(msg, uint16(n))
		msg = append(msg, bytes.Repeat([]byte{7}, n)...)
		off = int(f.end)
		f.end = uint16(len(msg))
	}
	e.msg = msg
}

// TestImportChecksEntriesAsStrictlyAsUpstreamAnswers: an imported entry
// that is not what Build makes of a well-formed answer is dropped and
// counted, and the import goes on. Each of these passed the old checks
// (offsets within the message); several then panicked on a hit, which
// with the checks of the hit path (Entry.write, loadbalance) they no
// longer do either.
func TestImportChecksEntriesAsStrictlyAsUpstreamAnswers(t *testing.T) {
	cases := []struct {
		name   string
		ans    []string
		mutate func(e *Entry)
	}{
		{"an A record of 3 bytes", addrs(2), func(e *Entry) { setRdata(e, 3) }},
		{"A records of 20 bytes", addrs(2), func(e *Entry) { setRdata(e, 20) }},
		{"a TTL offset inside another record's data", addrs(2), func(e *Entry) { e.rrs[0].off = e.rrs[1].end - 4 }},
		{"a TTL offset past a truncated answer's end", addrs(40), func(e *Entry) { e.rrs[0].off = uint16(len(e.msg) - 4) }},
		{"a record end inside the next record", addrs(2), func(e *Entry) { e.rrs[0].end += 3 }},
		{"record ends out of order", addrs(3), func(e *Entry) { e.rrs[0].end, e.rrs[1].end = e.rrs[1].end, e.rrs[0].end }},
		{"a name offset inside a record", addrs(1), func(e *Entry) { e.rrs[0].name = e.rrs[0].off }},
		{"fewer records laid out than in the message", addrs(2), func(e *Entry) { e.rrs = e.rrs[:1] }},
		{"bytes after the last record", addrs(1), func(e *Entry) { e.msg = append(e.msg, 0) }},
		{"a question of another type", addrs(1), func(e *Entry) { e.qtype = dns.TypeAAAA }},
		{"a question name longer than the message's", addrs(1), func(e *Entry) { e.nameLen += 2 }},
		{"an upper-case question name", addrs(1), func(e *Entry) { e.msg[13] = 'A' }},
		{"AA set", addrs(1), func(e *Entry) { e.msg[2] |= 0x04 }},
		{"not a response", addrs(1), func(e *Entry) { e.msg[2] &^= 0x80 }},
		{"a success that says NXDOMAIN", addrs(1), func(e *Entry) { e.msg[3] |= 3 }},
		{"a denial with answers", addrs(1), func(e *Entry) { e.kind = Denial }},
		{"an rcode that is not the header's", addrs(1), func(e *Entry) { e.rcode = 3 }},
		{"a kind the cache does not keep", addrs(1), func(e *Entry) { e.kind = Uncacheable }},
		{"a record TTL over the lifetime", addrs(1), func(e *Entry) { e.rrs[0].ttl = 31 }},
		{"expiring before it was stored", addrs(1), func(e *Entry) { e.expires = e.stored }},
		{"a stale window ending before the TTL", addrs(1), func(e *Entry) { e.staleUntil = e.expires - 1 }},
		{"a lifetime of a century", addrs(1), func(e *Entry) {
			e.expires += 100 * 365 * 24 * int64(time.Hour)
			e.staleUntil += 100 * 365 * 24 * int64(time.Hour)
		}},
		{"answering what it does not", []string{"b.example. 30 IN A 192.0.2.1"}, func(e *Entry) { e.answering = true }},
		{"a prefetch at 200%", addrs(1), func(e *Entry) { e.pfSet, e.pfPct = true, 200 }},
		// Per-tag counters grow to the largest tag: 64 shards x 65536 x 56 B.
		{"a tag that is not its policy's", addrs(1), func(e *Entry) { e.tag = 65535 }},
	}
	fp := func([]byte, uint8) (uint64, uint16) { return 0, 0 }
	good, q := crafted(t, addrs(2), nil)
	_, oq := query(t, "b.example.", dns.TypeA, 0, false)
	other, err := Build(answer(t, "b.example.", dns.TypeA, 0, []string{"b.example. 30 IN A 192.0.2.1"}, nil, false), oq, externalP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad, _ := crafted(t, tc.ans, tc.mutate)
			// The bad entry between two good ones: the import goes on. (A
			// kept bad entry would replace good, the same question.)
			c := New(Config{})
			st, err := c.Import(bytes.NewReader(stream(appendEntry(nil, good, 0), appendEntry(nil, bad, 0), appendEntry(nil, other, 0))), t0+1, fp)
			if err != nil || st.Kept != 2 || st.Invalid != 1 || st.InvalidErr == nil {
				t.Fatalf("import %+v, %v; want the two good entries kept, the bad one invalid", st, err)
			}
			t.Logf("%v", st.InvalidErr)
			if e, _ := c.Get(q, t0+1); e == nil || !bytes.Equal(e.msg, good.msg) {
				t.Fatal("the good entry is not what was kept")
			}
			if e, _ := c.Get(oq, t0+1); e == nil {
				t.Fatal("the entry after the bad one was not kept")
			}
			// A hit on the entry, as the old import kept it: whatever it
			// writes, nothing panics (Entry.write and the shuffle check
			// what they walk).
			old := New(Config{})
			if !old.Put(bad) {
				return
			}
			for _, size := range []int{512, 0xFFFF} {
				if e, _ := old.Get(q, t0+1); e != nil {
					loadbalance.Shuffle(e.Write(nil, q, t0+1, size, 1232))
				}
			}
		})
	}
}

// TestHitOnAMalformedLayoutDoesNotPanic: an entry whose layout points
// past what a truncated answer keeps (as an unchecked import could make)
// writes an answer instead of panicking.
func TestHitOnAMalformedLayoutDoesNotPanic(t *testing.T) {
	e, q := crafted(t, addrs(40), func(e *Entry) {
		e.rrs[0].off = uint16(len(e.msg) - 4)
		e.rrs[1].name = uint16(len(e.msg) - 1)
		e.rrs[len(e.rrs)-1].end = uint16(len(e.msg) + 100)
	})
	for _, size := range []int{512, 600, 0xFFFF} {
		if out := e.Write(nil, q, t0, size, 1232); len(out) < wire.HeaderLen || len(out) > size {
			t.Fatalf("%d bytes for a %d-byte client", len(out), size)
		}
	}
}

// TestImportDoesNotAddLastKnownGoodZones: an entry naming a zone whose
// counters this process does not have keeps no counters and adds none.
func TestImportDoesNotAddLastKnownGoodZones(t *testing.T) {
	e, q := crafted(t, addrs(1), func(e *Entry) { e.lkg = &LastKnownGood{Zone: "never-configured.test."} })
	c := New(Config{})
	if st, err := c.Import(bytes.NewReader(stream(appendEntry(nil, e, 0))), t0, func([]byte, uint8) (uint64, uint16) { return 0, 0 }); err != nil || st.Kept != 1 {
		t.Fatalf("import %+v %v", st, err)
	}
	if got, _ := c.Get(q, t0); got == nil || got.lkg != nil {
		t.Fatalf("imported %+v", got)
	}
	for _, s := range LastKnownGoodStats() {
		if strings.HasPrefix(s.Zone, "never-configured") {
			t.Fatal("the import added the zone's counters")
		}
	}
}

// TestImportShifted: a shift moves every time of an entry, so the TTLs a
// hit shows count down from the entry's true age and it expires when it
// would have.
func TestImportShifted(t *testing.T) {
	e, q := crafted(t, addrs(1), nil) // 30 s, an hour stale
	c := New(Config{})
	fp := func([]byte, uint8) (uint64, uint16) { return 0, 0 }
	// Written at t0; read at t0+1h on a clock 1h ahead, 10 s later in truth.
	now := t0 + int64(time.Hour)
	shift := int64(time.Hour)
	if st, err := c.ImportShifted(bytes.NewReader(stream(appendEntry(nil, e, 0))), now+10*int64(time.Second), shift, fp); err != nil || st.Kept != 1 {
		t.Fatalf("import %+v %v", st, err)
	}
	got, _ := c.Get(q, now+10*int64(time.Second))
	if got == nil {
		t.Fatal("not kept")
	}
	m := unpack(t, got.Write(nil, q, now+10*int64(time.Second), 512, 1232))
	if ttl := m.Answer[0].Header().Ttl; ttl != 20 {
		t.Fatalf("TTL %d after 10 s of 30, want 20", ttl)
	}
	if got, _ := c.Get(q, now+30*int64(time.Second)); got != nil {
		t.Fatal("alive past its TTL")
	}
}

// TestBoundedExportKeepsEveryShard: a bound below the cache's size keeps
// entries of every shard, the most recently used of each.
func TestBoundedExportKeepsEveryShard(t *testing.T) {
	c := New(Config{Shards: 8})
	fp := func([]byte, uint8) (uint64, uint16) { return 0, 0 }
	var qs []*wire.Query
	for i := range 800 {
		name := fmt.Sprintf("n%d.example.", i)
		_, q := query(t, name, dns.TypeA, 0, false)
		e, _ := Build(answer(t, name, dns.TypeA, 0, []string{name + " 30 IN A 192.0.2.1"}, nil, false), q, externalP, 0, t0)
		c.Put(e)
		qs = append(qs, q)
	}
	var b bytes.Buffer
	n, err := c.Export(&b, t0, fp, 16<<10)
	if err != nil || n == 0 || n >= 800 || b.Len() > 16<<10 {
		t.Fatalf("exported %d entries in %d bytes, %v", n, b.Len(), err)
	}
	nw := New(Config{Shards: 8})
	if _, err := nw.Import(&b, t0, fp); err != nil {
		t.Fatal(err)
	}
	per := make([]int, 8)
	for _, q := range qs {
		if e, _ := nw.Get(q, t0); e != nil {
			per[e.hash&7]++
		}
	}
	for i, k := range per {
		if k < n/8-2 {
			t.Errorf("shard %d: %d entries of %d exported (%v)", i, k, n, per)
		}
	}
}
