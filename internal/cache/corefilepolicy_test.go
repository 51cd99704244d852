package cache

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// ttls returns the TTLs of the answer and authority records of a written
// entry.
func ttls(t *testing.T, e *Entry, now int64) []uint32 {
	t.Helper()
	_, wq := query(t, "x.example.", dns.TypeA, 0, false)
	m := unpack(t, e.Write(nil, wq, now, 4096, 1232))
	var out []uint32
	for _, rr := range append(m.Answer, m.Ns...) {
		out = append(out, rr.Header().Ttl)
	}
	return out
}

// A Corefile's cache shows every record the entry's lifetime, floored and
// capped, as CoreDNS does; without Uniform a record keeps its own TTL.
func TestPolicyUniformFloor(t *testing.T) {
	_, q := query(t, "x.example.", dns.TypeA, 0, false)
	for _, tc := range []struct {
		name string
		pol  Policy
		ans  []string
		want []uint32
		kind Kind
	}{
		{"ttl0 floored", Policy{SuccessMax: time.Hour, MinTTL: 5 * time.Second, Uniform: true}, []string{"x.example. 0 IN A 10.0.0.1"}, []uint32{5}, Success},
		{"ttl2 floored", Policy{SuccessMax: time.Hour, MinTTL: 5 * time.Second, Uniform: true}, []string{"x.example. 2 IN A 10.0.0.1"}, []uint32{5}, Success},
		{"ttl2 flags mode", Policy{SuccessMax: time.Hour, MinTTL: 5 * time.Second}, []string{"x.example. 2 IN A 10.0.0.1"}, []uint32{2}, Success},
		{"ttl0 flags mode", Policy{SuccessMax: time.Hour}, []string{"x.example. 0 IN A 10.0.0.1"}, []uint32{0}, Uncacheable},
		{"uniform min of records", Policy{SuccessMax: time.Hour, Uniform: true}, []string{"x.example. 300 IN CNAME y.example.", "y.example. 120 IN A 10.0.0.1"}, []uint32{120, 120}, Success},
		{"capped", Policy{SuccessMax: 30 * time.Second, Uniform: true}, []string{"x.example. 300 IN A 10.0.0.1"}, []uint32{30}, Success},
		{"disable success: capped, not stored", Policy{SuccessMax: time.Minute, NoSuccess: true, Uniform: true}, []string{"x.example. 300 IN A 10.0.0.1"}, []uint32{60}, Uncacheable},
		{"no cache: passed through", Policy{SuccessMax: time.Second, NoSuccess: true, NoDenial: true, Pass: true}, []string{"x.example. 300 IN CNAME y.example.", "y.example. 120 IN A 10.0.0.1"}, []uint32{300, 120}, Uncacheable},
	} {
		e, err := Build(answer(t, "x.example.", dns.TypeA, dns.RcodeSuccess, tc.ans, nil, false), q, tc.pol, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind() != tc.kind {
			t.Errorf("%s: kind %v, want %v", tc.name, e.Kind(), tc.kind)
		}
		if got := ttls(t, e, t0); len(got) != len(tc.want) || got[0] != tc.want[0] || got[len(got)-1] != tc.want[len(got)-1] {
			t.Errorf("%s: TTLs %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Denials have their own floor when the Corefile gives one, and may be
// kept out of the cache.
func TestPolicyDenialFloorAndDisable(t *testing.T) {
	_, q := query(t, "x.example.", dns.TypeA, 0, false)
	nx := answer(t, "x.example.", dns.TypeA, dns.RcodeNameError, nil, []string{"example. 1 IN SOA ns.example. h.example. 1 2 3 4 1"}, false)
	e, err := Build(nx, q, Policy{DenialMax: time.Hour, MinTTL: 5 * time.Second, DenialMinSet: true, DenialMinTTL: 20 * time.Second, Uniform: true}, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind() != Denial || e.TTL() != 20*time.Second {
		t.Errorf("denial floor: kind %v TTL %v, want Denial 20s", e.Kind(), e.TTL())
	}
	e, _ = Build(nx, q, Policy{DenialMax: time.Hour, MinTTL: 5 * time.Second, NoDenial: true}, 0, t0)
	if e.Kind() != Uncacheable {
		t.Errorf("disable denial: kind %v", e.Kind())
	}
}

// keepttl: the stored TTL is shown however old the entry is.
func TestPolicyKeepTTL(t *testing.T) {
	_, q := query(t, "x.example.", dns.TypeA, 0, false)
	resp := answer(t, "x.example.", dns.TypeA, dns.RcodeSuccess, []string{"x.example. 300 IN A 10.0.0.1"}, nil, false)
	for _, keep := range []bool{false, true} {
		e, _ := Build(resp, q, Policy{SuccessMax: time.Hour, KeepTTL: keep, Uniform: true}, 0, t0)
		got := ttls(t, e, t0+int64(100*time.Second))[0]
		want := uint32(200)
		if keep {
			want = 300
		}
		if got != want {
			t.Errorf("keepttl %v: TTL %d after 100 s, want %d", keep, got, want)
		}
	}
}

// An entry with its own prefetch rule is refreshed on its own terms: after
// AMOUNT hits with PERCENT % of its life left, or never when AMOUNT is 0.
func TestPolicyPrefetch(t *testing.T) {
	_, q := query(t, "x.example.", dns.TypeA, 0, false)
	resp := answer(t, "x.example.", dns.TypeA, dns.RcodeSuccess, []string{"x.example. 100 IN A 10.0.0.1"}, nil, false)
	for _, tc := range []struct {
		name     string
		pol      Policy
		at       time.Duration // when the hits come
		hits     int
		prefetch bool
	}{
		{"off in block", Policy{SuccessMax: time.Hour, PrefetchSet: true}, 95 * time.Second, 5, false},
		{"amount 1 at 50%", Policy{SuccessMax: time.Hour, PrefetchSet: true, PrefetchHits: 1, PrefetchPercent: 50}, 55 * time.Second, 1, true},
		{"amount 1 too early", Policy{SuccessMax: time.Hour, PrefetchSet: true, PrefetchHits: 1, PrefetchPercent: 50}, 45 * time.Second, 1, false},
		{"amount 3 needs 3 hits", Policy{SuccessMax: time.Hour, PrefetchSet: true, PrefetchHits: 3, PrefetchPercent: 10}, 95 * time.Second, 2, false},
		{"cache default", Policy{SuccessMax: time.Hour}, 95 * time.Second, 2, true},
	} {
		c := New(Config{PrefetchHits: 2})
		e, _ := Build(resp, q, tc.pol, 0, t0)
		c.Put(e)
		got := false
		for i := 0; i < tc.hits; i++ {
			_, p := c.Get(q, t0+int64(tc.at))
			got = got || p
		}
		if got != tc.prefetch {
			t.Errorf("%s: prefetch %v, want %v", tc.name, got, tc.prefetch)
		}
	}
}
