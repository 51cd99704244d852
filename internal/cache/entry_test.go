package cache

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

var (
	t0        = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	clusterP  = Policy{SuccessMax: 30 * time.Second, DenialMax: 5 * time.Second}
	externalP = Policy{SuccessMax: 30 * time.Second, DenialMax: 30 * time.Second}
)

// query packs a client query and parses it the way the server does.
func query(t testing.TB, name string, qtype uint16, edns int, do bool) ([]byte, *wire.Query) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0xBEEF
	if edns > 0 {
		m.SetEdns0(uint16(edns), do)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q := new(wire.Query)
	if err := wire.ParseQuery(b, q); err != nil {
		t.Fatal(err)
	}
	return b, q
}

// answer packs an upstream response to name with the given records.
func answer(t testing.TB, name string, qtype uint16, rcode int, ans, ns []string, opt bool) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(strings.ToLower(name), qtype)
	m.Response = true
	m.RecursionAvailable = true
	m.Authoritative = true
	m.Rcode = rcode
	for _, s := range ans {
		m.Answer = append(m.Answer, mustRR(t, s))
	}
	for _, s := range ns {
		m.Ns = append(m.Ns, mustRR(t, s))
	}
	if opt {
		m.SetEdns0(1232, false)
	}
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustRR(t testing.TB, s string) dns.RR {
	t.Helper()
	rr, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

func unpack(t testing.TB, b []byte) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatalf("unpack answer: %v", err)
	}
	return m
}

func TestBuildTTLPolicy(t *testing.T) {
	soa := func(ttl, minimum int) string {
		return fmt.Sprintf("cluster.local. %d IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 %d", ttl, minimum)
	}
	tests := []struct {
		name     string
		rcode    int
		ans, ns  []string
		pol      Policy
		servfail time.Duration
		kind     Kind
		ttl      time.Duration
	}{
		{"positive min over answers", dns.RcodeSuccess, []string{"a.example. 300 IN A 1.1.1.1", "a.example. 20 IN A 1.1.1.2"}, nil, externalP, 0, Success, 20 * time.Second},
		{"positive capped", dns.RcodeSuccess, []string{"a.example. 300 IN A 1.1.1.1"}, nil, externalP, 0, Success, 30 * time.Second},
		{"authority counts", dns.RcodeSuccess, []string{"a.example. 300 IN A 1.1.1.1"}, []string{"example. 7 IN NS ns.example."}, externalP, 0, Success, 7 * time.Second},
		{"ttl 0 not cached", dns.RcodeSuccess, []string{"a.example. 0 IN A 1.1.1.1"}, nil, externalP, 0, Uncacheable, 0},
		{"min ttl floor", dns.RcodeSuccess, []string{"a.example. 0 IN A 1.1.1.1"}, nil, Policy{SuccessMax: 30 * time.Second, DenialMax: 5 * time.Second, MinTTL: 2 * time.Second}, 0, Success, 2 * time.Second},
		{"nxdomain soa minimum", dns.RcodeNameError, nil, []string{soa(60, 3)}, clusterP, 0, Denial, 3 * time.Second},
		{"nxdomain soa ttl", dns.RcodeNameError, nil, []string{soa(2, 60)}, clusterP, 0, Denial, 2 * time.Second},
		{"nxdomain denial cap", dns.RcodeNameError, nil, []string{soa(60, 60)}, clusterP, 0, Denial, 5 * time.Second},
		{"nodata", dns.RcodeSuccess, nil, []string{soa(60, 4)}, clusterP, 0, Denial, 4 * time.Second},
		{"nxdomain without soa", dns.RcodeNameError, nil, nil, clusterP, 0, Uncacheable, 0},
		{"nodata without soa", dns.RcodeSuccess, nil, nil, clusterP, 0, Uncacheable, 0},
		// A Corefile block keeps them as CoreDNS's cache does: 5 s for an
		// answer with no records (a template's `rcode NOERROR`), else the
		// smallest record TTL, clamped like any denial.
		{"corefile: empty noerror 5s", dns.RcodeSuccess, nil, nil, Policy{SuccessMax: 30 * time.Second, DenialMax: 30 * time.Second, DenialNoSOA: true}, 0, Denial, 5 * time.Second},
		{"corefile: empty nxdomain capped", dns.RcodeNameError, nil, nil, Policy{SuccessMax: 30 * time.Second, DenialMax: 3 * time.Second, DenialNoSOA: true}, 0, Denial, 3 * time.Second},
		{"corefile: nodata with ns", dns.RcodeSuccess, nil, []string{"example. 8 IN NS ns.example."}, Policy{SuccessMax: 30 * time.Second, DenialMax: 30 * time.Second, DenialNoSOA: true}, 0, Denial, 8 * time.Second},
		{"servfail brief", dns.RcodeServerFailure, nil, nil, clusterP, 2 * time.Second, ServFail, 2 * time.Second},
		{"servfail disabled", dns.RcodeServerFailure, nil, nil, clusterP, 0, Uncacheable, 0},
		{"refused never", dns.RcodeRefused, nil, nil, clusterP, 5 * time.Second, Uncacheable, 0},
		{"formerr never", dns.RcodeFormatError, nil, nil, clusterP, 5 * time.Second, Uncacheable, 0},
		{"notimp never", dns.RcodeNotImplemented, nil, nil, clusterP, 5 * time.Second, Uncacheable, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, q := query(t, "a.example.", dns.TypeA, 0, false)
			e, err := Build(answer(t, "a.example.", dns.TypeA, tc.rcode, tc.ans, tc.ns, false), q, tc.pol, tc.servfail, t0)
			if err != nil {
				t.Fatal(err)
			}
			if e.Kind() != tc.kind {
				t.Fatalf("kind %v, want %v", e.Kind(), tc.kind)
			}
			if tc.kind != Uncacheable && e.TTL() != tc.ttl {
				t.Fatalf("ttl %v, want %v", e.TTL(), tc.ttl)
			}
			c := New(Config{})
			if stored := c.Put(e); stored != (tc.kind != Uncacheable) {
				t.Fatalf("Put stored=%v for kind %v", stored, tc.kind)
			}
		})
	}
}

func TestBuildRejectsMismatch(t *testing.T) {
	_, q := query(t, "a.example.", dns.TypeA, 0, false)
	for name, resp := range map[string][]byte{
		"other name": answer(t, "b.example.", dns.TypeA, 0, []string{"b.example. 30 IN A 1.1.1.1"}, nil, false),
		"other type": answer(t, "a.example.", dns.TypeAAAA, 0, nil, nil, false),
	} {
		if _, err := Build(resp, q, externalP, 0, t0); err != ErrMismatch {
			t.Errorf("%s: err %v, want ErrMismatch", name, err)
		}
	}
	good := answer(t, "a.example.", dns.TypeA, 0, []string{"a.example. 30 IN A 1.1.1.1"}, nil, false)
	for i := 0; i < len(good); i++ {
		// Every truncation of a valid answer is rejected, never half-stored.
		if e, err := Build(good[:i], q, externalP, 0, t0); err == nil {
			t.Fatalf("truncated at %d accepted: %+v", i, e)
		}
	}
}

func TestHitPatchesIDCaseAndTTL(t *testing.T) {
	_, q := query(t, "www.example.", dns.TypeA, 0, false)
	resp := answer(t, "www.example.", dns.TypeA, 0, []string{"www.example. 25 IN CNAME web.example.", "web.example. 300 IN A 192.0.2.1"}, nil, true)
	e, err := Build(resp, q, externalP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	c := New(Config{})
	c.Put(e)
	for _, step := range []struct {
		after time.Duration
		ttls  []uint32
	}{{0, []uint32{25, 25}}, {10 * time.Second, []uint32{15, 15}}, {24*time.Second + 999*time.Millisecond, []uint32{1, 1}}} {
		_, cq := query(t, "wWw.ExAmPle.", dns.TypeA, 0, false)
		cq.ID = 0x1234
		now := t0 + int64(step.after)
		hit, _ := c.Get(cq, now)
		if hit == nil {
			t.Fatalf("after %v: miss", step.after)
		}
		m := unpack(t, hit.Write(nil, cq, now, 512, 1232))
		if m.Id != 0x1234 || m.Question[0].Name != "wWw.ExAmPle." {
			t.Fatalf("id %x name %q", m.Id, m.Question[0].Name)
		}
		if m.Authoritative || !m.RecursionAvailable || m.Truncated {
			t.Fatalf("flags: %v", m.MsgHdr)
		}
		if m.IsEdns0() != nil {
			t.Fatal("OPT in answer to a client without EDNS")
		}
		for i, rr := range m.Answer {
			if rr.Header().Ttl != step.ttls[i] {
				t.Fatalf("after %v: rr %d ttl %d, want %d", step.after, i, rr.Header().Ttl, step.ttls[i])
			}
		}
	}
	if get(c, q, t0+int64(25*time.Second)) != nil {
		t.Fatal("entry served past its TTL")
	}
	if st := c.Stats(); st.Entries[Success] != 0 || st.Bytes != 0 {
		t.Fatalf("expired entry still accounted: %+v", st)
	}
}

func TestHitEchoesClientOPT(t *testing.T) {
	_, q := query(t, "a.example.", dns.TypeA, 4096, true)
	e, err := Build(answer(t, "a.example.", dns.TypeA, 0, []string{"a.example. 30 IN A 1.1.1.1"}, nil, true), q, externalP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	m := unpack(t, e.Write(nil, q, t0, 4096, 1232))
	opt := m.IsEdns0()
	if opt == nil || opt.UDPSize() != 1232 || !opt.Do() {
		t.Fatalf("OPT %v", opt)
	}
	if len(m.Extra) != 1 {
		t.Fatalf("additional %v", m.Extra)
	}
}

func TestTruncatesToClientSize(t *testing.T) {
	var ans []string
	for i := 0; i < 60; i++ {
		ans = append(ans, fmt.Sprintf("big.example. 30 IN A 10.0.%d.%d", i/250, i%250))
	}
	_, q := query(t, "big.example.", dns.TypeA, 0, false)
	e, err := Build(answer(t, "big.example.", dns.TypeA, 0, ans, nil, false), q, externalP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	b := e.Write(nil, q, t0, 512, 1232)
	if len(b) > 512 {
		t.Fatalf("%d bytes to a 512-byte client", len(b))
	}
	m := unpack(t, b)
	// 12 header + 17 question, then 16 bytes per record: 30 whole records fit.
	if !m.Truncated || len(m.Answer) != 30 || m.Question[0].Name != "big.example." {
		t.Fatalf("truncated answer: %v", m)
	}
	// The same entry over TCP (no size limit) carries everything.
	m = unpack(t, e.Write(nil, q, t0, 0xFFFF, 1232))
	if m.Truncated || len(m.Answer) != 60 {
		t.Fatalf("full answer: tc=%v %d records", m.Truncated, len(m.Answer))
	}
	// An EDNS client keeps its OPT in the truncated answer.
	_, qe := query(t, "big.example.", dns.TypeA, 600, false)
	m = unpack(t, e.Write(nil, qe, t0, 600, 1232))
	if !m.Truncated || m.IsEdns0() == nil || len(m.Answer) != 35 {
		t.Fatalf("EDNS truncated answer: %v", m)
	}
}

func TestKeySeparatesDOAndCD(t *testing.T) {
	c := New(Config{})
	_, q := query(t, "a.example.", dns.TypeA, 1232, false)
	e, _ := Build(answer(t, "a.example.", dns.TypeA, 0, []string{"a.example. 30 IN A 1.1.1.1"}, nil, true), q, externalP, 0, t0)
	c.Put(e)
	_, qdo := query(t, "a.example.", dns.TypeA, 1232, true)
	if get(c, qdo, t0) != nil {
		t.Fatal("DO query served a non-DO entry")
	}
	_, qcd := query(t, "a.example.", dns.TypeA, 1232, false)
	qcd.Flags |= wire.FlagCD
	if get(c, qcd, t0) != nil {
		t.Fatal("CD query served a non-CD entry")
	}
	_, qaaaa := query(t, "a.example.", dns.TypeAAAA, 1232, false)
	if get(c, qaaaa, t0) != nil {
		t.Fatal("AAAA query served an A entry")
	}
	if get(c, q, t0) == nil {
		t.Fatal("same question missed")
	}
}

func TestDropsOPTAndRecordsAfterIt(t *testing.T) {
	// An OPT in the middle of the additional section: it and what follows
	// are dropped; the records before it stay.
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeMX)
	m.Response = true
	m.Answer = []dns.RR{mustRR(t, "a.example. 30 IN MX 10 mx.example.")}
	m.Extra = []dns.RR{mustRR(t, "mx.example. 30 IN A 192.0.2.1"), &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}, mustRR(t, "mx.example. 30 IN AAAA 2001:db8::1")}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	_, q := query(t, "a.example.", dns.TypeMX, 0, false)
	e, err := Build(b, q, externalP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	out := unpack(t, e.Write(nil, q, t0, 512, 1232))
	if len(out.Extra) != 1 || out.Extra[0].Header().Rrtype != dns.TypeA {
		t.Fatalf("additional: %v", out.Extra)
	}
}
