package cache

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestAnswering: the entries that answer their question, as CoreDNS 1.15's
// cache decides for serve_stale_policy prefer_positive.
func TestAnswering(t *testing.T) {
	pp := Policy{SuccessMax: time.Hour, DenialMax: time.Hour, PreferPositive: true}
	for _, tc := range []struct {
		name  string
		qtype uint16
		ans   []string
		want  bool
	}{
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN A 192.0.2.1"}, true},
		{"A.Example.", dns.TypeA, []string{"a.EXAMPLE. 60 IN A 192.0.2.1"}, true},
		{"a.example.", dns.TypeA, []string{"b.example. 60 IN A 192.0.2.1"}, false},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN TXT \"x\""}, false},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN CNAME b.example.", "b.example. 60 IN A 192.0.2.1"}, true},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN CNAME b.example.", "b.example. 60 IN CNAME c.other.", "c.other. 60 IN A 192.0.2.1"}, true},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN CNAME b.example."}, false},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN CNAME b.example.", "a.example. 60 IN A 192.0.2.1"}, false},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN CNAME b.example.", "a.example. 60 IN CNAME c.example.", "b.example. 60 IN A 192.0.2.1"}, false},
		{"a.example.", dns.TypeA, []string{"a.example. 60 IN CNAME b.example.", "b.example. 60 IN CNAME a.example."}, false},
		{"a.example.", dns.TypeCNAME, []string{"a.example. 60 IN CNAME b.example."}, true},
		{"a.example.", dns.TypeANY, []string{"a.example. 60 IN TXT \"x\""}, true},
		{"a.example.", dns.TypeANY, []string{"b.example. 60 IN TXT \"x\""}, false},
		{"a.example.", dns.TypeMX, []string{"a.example. 60 IN MX 10 a.example."}, true},
	} {
		_, q := query(t, tc.name, tc.qtype, 0, false)
		e, err := Build(answer(t, tc.name, tc.qtype, dns.RcodeSuccess, tc.ans, nil, false), q, pp, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		if e.Answering() != tc.want {
			t.Errorf("%s %s %q: answering %v, want %v", tc.name, dns.TypeToString[tc.qtype], tc.ans, e.Answering(), tc.want)
		}
		// Without the policy nothing is marked.
		if e, _ := Build(answer(t, tc.name, tc.qtype, dns.RcodeSuccess, tc.ans, nil, false), q, clusterP, 0, t0); e.Answering() {
			t.Errorf("%s: answering without the policy", tc.name)
		}
	}
	// Denials and empty answers never answer.
	_, q := query(t, "a.example.", dns.TypeA, 0, false)
	soa := []string{"example. 60 IN SOA ns.example. h.example. 1 2 3 4 60"}
	for _, rc := range []int{dns.RcodeSuccess, dns.RcodeNameError} {
		e, _ := Build(answer(t, "a.example.", dns.TypeA, rc, nil, soa, false), q, pp, 0, t0)
		if e.Answering() {
			t.Errorf("rcode %d without answers: answering", rc)
		}
	}
}

// TestStaleTTLPerPolicy: a stale answer carries the policy's response TTL
// (serve_stale RESPONSE_TTL, 0 included), else 30 s.
func TestStaleTTLPerPolicy(t *testing.T) {
	_, q := query(t, "a.example.", dns.TypeA, 0, false)
	resp := answer(t, "a.example.", dns.TypeA, dns.RcodeSuccess, []string{"a.example. 60 IN A 192.0.2.1"}, nil, false)
	for _, tc := range []struct {
		pol  Policy
		want uint32
	}{
		{externalP, StaleTTL},
		{Policy{SuccessMax: time.Hour, StaleTTLSet: true, StaleTTL: 0}, 0},
		{Policy{SuccessMax: time.Hour, StaleTTLSet: true, StaleTTL: 7}, 7},
	} {
		e, err := BuildStale(resp, q, tc.pol, 0, time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(e.WriteStale(nil, q, 512, 0)); err != nil {
			t.Fatal(err)
		}
		if got := m.Answer[0].Header().Ttl; got != tc.want {
			t.Errorf("%+v: stale TTL %d, want %d", tc.pol, got, tc.want)
		}
	}
}

// TestKeptEntryHitsCounted: hits on an entry kept over a refresh count as
// answers served because of the policy; other hits do not.
func TestKeptEntryHitsCounted(t *testing.T) {
	c := LastKnownGoodCounter("kept-hits.test.")
	pp := Policy{SuccessMax: time.Hour, PreferPositive: true, LastKnownGood: c}
	ca := New(Config{})
	_, q := query(t, "a.example.", dns.TypeA, 0, false)
	e, _ := Build(answer(t, "a.example.", dns.TypeA, dns.RcodeSuccess, []string{"a.example. 60 IN A 192.0.2.1"}, nil, false), q, pp, 0, t0)
	ca.Put(e)
	if got, _ := ca.Get(q, t0+1); got != e || c.Served.Load() != 0 {
		t.Fatalf("hit %p, served %d", got, c.Served.Load())
	}
	if !e.Keep() || e.Keep() {
		t.Fatal("Keep: first should be true once")
	}
	ca.Get(q, t0+2)
	if c.Served.Load() != 1 || c.Kept.Load() != 2 {
		t.Fatalf("served %d kept %d, want 1 and 2", c.Served.Load(), c.Kept.Load())
	}
	var found bool
	for _, s := range LastKnownGoodStats() {
		found = found || s.Zone == "kept-hits.test." && s.Served == 1
	}
	if !found {
		t.Fatal("LastKnownGoodStats misses the zone")
	}
}

// TestExportKeepsLastKnownGood: a cache handed to a twin keeps what the
// prefer_positive policy knows of an entry (answering, kept, stale TTL,
// its zone's counters), and a policy's %+v (the daemon's fingerprint)
// shows the counters' zone, not an address.
func TestExportKeepsLastKnownGood(t *testing.T) {
	ctr := LastKnownGoodCounter("export.test.")
	pp := Policy{SuccessMax: time.Hour, PreferPositive: true, LastKnownGood: ctr, StaleTTLSet: true, StaleTTL: 7}
	if s := fmt.Sprintf("%+v", pp); !strings.Contains(s, "LastKnownGood:export.test.") {
		t.Fatalf("%%+v of a policy: %s", s)
	}
	old := New(Config{})
	_, q := query(t, "a.example.", dns.TypeA, 0, false)
	e, _ := Build(answer(t, "a.example.", dns.TypeA, dns.RcodeSuccess, []string{"a.example. 60 IN A 192.0.2.1"}, nil, false), q, pp, 0, t0)
	e.Keep()
	old.Put(e)
	var stream bytes.Buffer
	fp := func([]byte, uint8) (uint64, uint16) { return 1, 0 }
	if n, err := old.Export(&stream, t0+1, fp, 1<<20); err != nil || n != 1 {
		t.Fatalf("export %d %v", n, err)
	}
	nw := New(Config{})
	if st, err := nw.Import(&stream, t0+2, fp); err != nil || st.Kept != 1 {
		t.Fatalf("import %+v %v", st, err)
	}
	got, _, _ := nw.Lookup(q, t0+2)
	if got == nil || !got.Answering() || !got.Kept() || got.staleTTL != 7 || got.lkg != ctr {
		t.Fatalf("imported %+v", got)
	}
}
