package cache

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// edeAnswer is an answer to a.example. A whose OPT carries opts.
func edeAnswer(t *testing.T, opts ...dns.EDNS0) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	m.Response = true
	rr, _ := dns.NewRR("a.example. 30 IN A 10.1.2.3")
	m.Answer = append(m.Answer, rr)
	m.SetEdns0(4096, true)
	m.IsEdns0().Option = opts
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func edesOf(m *dns.Msg) []string {
	var out []string
	if o := m.IsEdns0(); o != nil {
		for _, x := range o.Option {
			if e, ok := x.(*dns.EDNS0_EDE); ok {
				out = append(out, fmt.Sprintf("%d %s", e.InfoCode, e.ExtraText))
			}
		}
	}
	return out
}

// An answer's Extended DNS Errors reach the fetch's clients from a block
// without cache (Pass), and only the EDE options of its OPT; the entry to
// cache never writes them, nor does any entry behind a cache (CoreDNS's
// cache drops the OPT); a client without EDNS gets no OPT at all.
func TestBuildFetchedEDE(t *testing.T) {
	resp := edeAnswer(t, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6869"},
		&dns.EDNS0_EDE{InfoCode: 17, ExtraText: "filtered"}, &dns.EDNS0_EDE{InfoCode: 3})
	_, q := query(t, "a.example.", dns.TypeA, 1232, false)
	_, plain := query(t, "a.example.", dns.TypeA, 0, false)
	pass := Policy{SuccessMax: time.Minute, DenialMax: time.Minute, NoSuccess: true, NoDenial: true, Pass: true}
	e, fetched, err := BuildFetched(resp, q, pass, 0, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := edesOf(unpack(t, fetched.Write(nil, q, t0, 1232, 1232))); strings.Join(got, ",") != "17 filtered,3 " {
		t.Errorf("fetched: EDE %v", got)
	}
	if got := edesOf(unpack(t, e.Write(nil, q, t0, 1232, 1232))); got != nil {
		t.Errorf("the entry to cache: EDE %v", got)
	}
	if m := unpack(t, fetched.Write(nil, plain, t0, 512, 1232)); m.IsEdns0() != nil || len(m.Answer) != 1 {
		t.Errorf("no EDNS: %v", m)
	}
	// Behind a cache: none, miss or hit.
	e, fetched, err = BuildFetched(resp, q, externalP, 0, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if fetched != e || edesOf(unpack(t, fetched.Write(nil, q, t0, 1232, 1232))) != nil {
		t.Error("an EDE behind a cache")
	}
	// Truncation counts the options: 29 records fit in 512 bytes beside
	// an empty OPT, not beside the options' 20 bytes.
	big := new(dns.Msg)
	if err := big.Unpack(resp); err != nil {
		t.Fatal(err)
	}
	big.Answer = nil
	for i := range 29 {
		rr, _ := dns.NewRR(fmt.Sprintf("a.example. 30 IN A 10.1.2.%d", i))
		big.Answer = append(big.Answer, rr)
	}
	big.Compress = true
	bigResp, err := big.Pack()
	if err != nil {
		t.Fatal(err)
	}
	e, fetched, err = BuildFetched(bigResp, q, pass, 0, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if m := unpack(t, e.Write(nil, q, t0, 512, 1232)); m.Truncated || len(m.Answer) != 29 {
		t.Fatalf("without the options: tc %v, %d records", m.Truncated, len(m.Answer))
	}
	if m := unpack(t, fetched.Write(nil, q, t0, 512, 1232)); !m.Truncated || len(m.Answer) != 28 || len(edesOf(m)) != 2 {
		t.Errorf("with the options: tc %v, %d records, EDE %v", m.Truncated, len(m.Answer), edesOf(m))
	}
}

func TestEDEOptionsMalformedAndBound(t *testing.T) {
	opt := func(rd ...byte) []byte {
		return append([]byte{0, 0, 41, 16, 0, 0, 0, 0, 0, byte(len(rd) >> 8), byte(len(rd))}, rd...)
	}
	for _, tc := range []struct {
		name string
		opt  []byte
		want int // bytes kept; -1: nil
	}{
		{"one", opt(0, 15, 0, 2, 0, 17), 6},
		{"short option", opt(0, 15, 0, 9, 0, 17), -1},
		{"no code", opt(0, 15, 0, 1, 0), -1},
		{"other only", opt(0, 3, 0, 1, 7), -1},
		{"owner not root", append([]byte{1, 'a', 0}, opt(0, 15, 0, 2, 0, 17)[1:]...), -1},
		{"rdlength wrong", append(opt(0, 15, 0, 2, 0, 17), 0), -1},
		{"too long", opt(append([]byte{0, 15, 0x02, 0x02}, make([]byte, 514)...)...), -1},
	} {
		got := edeOptions(tc.opt)
		if (tc.want < 0) != (got == nil) || (tc.want >= 0 && len(got) != tc.want) {
			t.Errorf("%s: %v", tc.name, got)
		}
	}
}
