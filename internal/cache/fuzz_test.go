package cache

import (
	"testing"
	"time"

	"github.com/miekg/dns"

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
		// re-packed or not (records past its OPT are dropped).
		if wire.CheckMessage(resp) == nil {
			if err := wire.CheckMessage(e.Write(nil, q, t0, 0xFFFF, 1232)); err != nil {
				t.Fatalf("valid answer stored as an invalid one: %v", err)
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
