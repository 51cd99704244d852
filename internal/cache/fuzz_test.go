package cache

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// FuzzQueryPath runs arbitrary client packets through the serving path:
// parse, key, cache lookup and answer. It must never panic, and every
// answer it writes must be a well-formed DNS message with the query's ID.
func FuzzQueryPath(f *testing.F) {
	c := New(Config{})
	for _, name := range []string{"a.example.", "big.example."} {
		_, q := query(f, name, dns.TypeA, 0, false)
		var ans []string
		for i := 0; i < 40; i++ {
			ans = append(ans, name+" 30 IN A 10.0.0.1")
		}
		e, err := Build(answer(f, name, dns.TypeA, 0, ans, nil, true), q, externalP, 0, t0)
		if err != nil {
			f.Fatal(err)
		}
		c.Put(e)
	}
	for _, seed := range []struct {
		name string
		edns int
	}{{"a.example.", 0}, {"A.Example.", 1232}, {"big.example.", 0}, {"big.example.", 4096}, {"miss.example.", 0}} {
		raw, _ := query(f, seed.name, dns.TypeA, seed.edns, seed.edns > 0)
		f.Add(raw)
	}
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var q wire.Query
		if err := wire.ParseQuery(raw, &q); err != nil {
			if err == wire.ErrDrop {
				return
			}
			out := wire.AppendError(nil, raw, &q, wire.RcodeFormErr, 1232)
			checkAnswer(t, out, &q)
			return
		}
		e, _ := c.Get(&q, t0)
		if e == nil {
			return
		}
		size := int(min(q.Size, 1232))
		out := e.Write(nil, &q, t0, size, 1232)
		if len(out) > size {
			t.Fatalf("%d bytes for a %d-byte client", len(out), size)
		}
		checkAnswer(t, out, &q)
	})
}

func checkAnswer(t *testing.T, out []byte, q *wire.Query) {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(out); err != nil {
		t.Fatalf("answer does not unpack: %v\n%x", err, out)
	}
	if m.Id != q.ID || !m.Response {
		t.Fatalf("answer id %x response %v", m.Id, m.Response)
	}
}

// FuzzBuild feeds arbitrary upstream answers to Build: no panic, and an
// accepted answer always writes a message that unpacks.
func FuzzBuild(f *testing.F) {
	_, q := query(f, "a.example.", dns.TypeA, 1232, false)
	f.Add(answer(f, "a.example.", dns.TypeA, 0, []string{"a.example. 30 IN A 1.1.1.1"}, nil, true))
	f.Add(answer(f, "a.example.", dns.TypeA, 3, nil, []string{"example. 30 IN SOA ns.example. h.example. 1 2 3 4 5"}, true))
	// Uncompressed, as kube-dns sends over TCP: Build re-packs it.
	m := unpack(f, answer(f, "a.example.", dns.TypeA, 0, []string{"A.example. 30 IN CNAME b.Example.", "b.example. 30 IN A 1.1.1.1",
		"b.example. 30 IN A 1.1.1.2"}, []string{"example. 30 IN NS ns.example."}, true))
	m.Compress = false
	raw, err := m.Pack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	ede := unpack(f, answer(f, "a.example.", dns.TypeA, 0, []string{"a.example. 30 IN A 1.1.1.1"}, nil, true))
	ede.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_EDE{InfoCode: 17, ExtraText: "x"}, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "61"}}
	if raw, err = ede.Pack(); err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	pass := Policy{SuccessMax: time.Minute, DenialMax: time.Minute, NoSuccess: true, NoDenial: true, Pass: true}
	f.Fuzz(func(t *testing.T, resp []byte) {
		if cached, fetched, err := BuildFetched(resp, q, pass, 2, 0, t0); err == nil {
			// The fetch's entry with the answer's EDE options: the same
			// bounds, and the options never make a valid answer invalid.
			for _, size := range []int{512, 600, 1232} {
				if out := fetched.Write(nil, q, t0, size, 1232); len(out) > size || len(out) < wire.HeaderLen {
					t.Fatalf("fetched: %d bytes for a %d-byte client", len(out), size)
				}
			}
			if wire.CheckMessage(cached.Write(nil, q, t0, 0xFFFF, 1232)) == nil {
				if err := wire.CheckMessage(fetched.Write(nil, q, t0, 0xFFFF, 1232)); err != nil {
					t.Fatalf("fetched: the EDE options made the answer invalid: %v", err)
				}
			}
		}
		e, err := Build(resp, q, externalP, 2, t0)
		if err != nil {
			return
		}
		// An answer whose names and rdata are well-formed stays so,
		// re-packed or not (records past its OPT are dropped), and the
		// entry passes the import's checks: a twin or the snapshot file
		// keeps every entry Build makes.
		if wire.CheckMessage(resp) == nil {
			if err := wire.CheckMessage(e.Write(nil, q, t0, 0xFFFF, 1232)); err != nil {
				t.Fatalf("valid answer stored as an invalid one: %v", err)
			}
			if e.kind < numKinds {
				var a wire.Answer
				if err := checkImported(e, &a); err != nil {
					t.Fatalf("an entry Build made fails the import's checks: %v", err)
				}
			}
		}
		// A truncated answer never exceeds the client's size, and keeps
		// the header and question whatever the records.
		for _, size := range []int{512, 600, 1232} {
			if out := e.Write(nil, q, t0, size, 1232); len(out) > size || len(out) < wire.HeaderLen {
				t.Fatalf("%d bytes for a %d-byte client", len(out), size)
			}
		}
		out := e.Write(nil, q, t0, 1232, 1232)
		m := new(dns.Msg)
		if err := m.Unpack(out); err != nil {
			// Build only checks structure, not rdata; an answer miekg
			// cannot unpack may still be relayed as the upstream sent it.
			return
		}
		if m.Id != q.ID {
			t.Fatalf("id %x", m.Id)
		}
	})
}

// importSeeds are entries of every kind and shape, as Export writes them
// (without their length): what FuzzImport mutates.
func importSeeds(t testing.TB) [][]byte {
	type seed struct {
		name     string
		rcode    int
		ans, ns  []string
		pol      Policy
		compress bool
	}
	soa := []string{"example. 30 IN SOA ns.example. h.example. 1 2 3 4 5"}
	lkg := Policy{SuccessMax: time.Minute, DenialMax: time.Minute, PreferPositive: true, LastKnownGood: LastKnownGoodCounter("fuzz.test."), PrefetchSet: true, PrefetchHits: 3, PrefetchPercent: 20}
	var out [][]byte
	for _, s := range []seed{
		{"a.example.", 0, []string{"a.example. 30 IN A 192.0.2.1", "a.example. 30 IN A 192.0.2.2"}, nil, externalP, true},
		{"a.example.", 0, []string{"a.example. 30 IN CNAME b.example.", "b.example. 30 IN A 192.0.2.1"}, []string{"example. 30 IN NS ns.example."}, lkg, false},
		{"a.example.", 3, nil, soa, externalP, true},
		{"a.example.", 0, nil, soa, clusterP, true},
		{"a.example.", 2, nil, nil, externalP, true},
	} {
		_, q := query(t, s.name, dns.TypeA, 0, false)
		resp := answer(t, s.name, dns.TypeA, s.rcode, s.ans, s.ns, false)
		if !s.compress {
			m := unpack(t, resp)
			m.Compress = false
			resp, _ = m.Pack()
		}
		e, err := BuildStale(resp, q, s.pol, 2*time.Second, time.Hour, t0)
		if err != nil || e.kind >= numKinds {
			t.Fatalf("seed %v: %v %v", s, e.kind, err)
		}
		out = append(out, appendEntry(nil, e, 0)[4:])
	}
	return out
}

// FuzzImport: no entry a twin or a snapshot file can hold makes the
// import or a hit on what it kept panic, and every answer written from a
// kept entry (fresh, stale, truncated, shuffled as loadbalance does) is a
// message wire.CheckMessage accepts.
func FuzzImport(f *testing.F) {
	fp := func([]byte, uint8) (uint64, uint16) { return 0, 0 }
	for _, s := range importSeeds(f) {
		// Every seed is kept: the fuzzer starts from entries that reach a hit.
		in := stream(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s)
		if st, err := New(Config{}).Import(bytes.NewReader(in), t0, fp); err != nil || st.Kept != 1 {
			f.Fatalf("seed not kept: %+v %v", st, err)
		}
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		if len(rec) == 0 {
			return // the stream's end
		}
		c := New(Config{Shards: 1})
		st, err := c.Import(bytes.NewReader(stream(binary.BigEndian.AppendUint32(nil, uint32(len(rec))), rec)), t0, fp)
		if err != nil || st.Kept+st.Dropped() != 1 {
			if err == nil || len(rec) <= maxExportEntry {
				t.Fatalf("import %+v %v", st, err)
			}
			return
		}
		for _, e := range c.shards[0].items {
			hitKept(t, e)
		}
	})
}

// hitKept writes every answer a client can get from e and checks each.
func hitKept(t *testing.T, e *Entry) {
	t.Helper()
	for _, do := range []bool{false, true} {
		m := new(dns.Msg)
		m.Id = 0xBEEF
		if e.flags&keyDO != 0 || do {
			m.SetEdns0(1232, e.flags&keyDO != 0)
		}
		m.Question = []dns.Question{{Qtype: e.qtype, Qclass: e.qclass}}
		m.Question[0].Name, _ = wireName(e.msg[12 : 12+int(e.nameLen)])
		raw, err := m.Pack()
		if err != nil {
			return
		}
		var q wire.Query
		if wire.ParseQuery(raw, &q) != nil {
			return
		}
		q.View = e.flags >> keyViewShift
		if e.flags&keyCD != 0 {
			q.Flags |= wire.FlagCD
		}
		for _, size := range []int{512, 700, 0xFFFF} {
			for _, out := range [][]byte{e.Write(nil, &q, t0, size, 1232), e.WriteStale(nil, &q, size, 1232)} {
				if len(out) > max(size, 512) {
					t.Fatalf("%d bytes for a %d-byte client", len(out), size)
				}
				if err := wire.CheckMessage(out); err != nil {
					t.Fatalf("a kept entry writes a malformed answer: %v\n%x", err, out)
				}
				if err := wire.CheckMessage(loadbalance.Shuffle(out)); err != nil {
					t.Fatalf("a kept entry's answer shuffles into a malformed one: %v", err)
				}
			}
		}
	}
}

// wireName is the presentation form of an uncompressed wire name.
func wireName(b []byte) (string, error) {
	s, _, err := dns.UnpackDomainName(b, 0)
	return s, err
}
