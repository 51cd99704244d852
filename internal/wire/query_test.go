package wire

import (
	"testing"

	"github.com/miekg/dns"
)

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseQuery(t *testing.T) {
	plain := new(dns.Msg)
	plain.SetQuestion("Www.Example.COM.", dns.TypeAAAA)
	plain.Id = 77
	edns := plain.Copy()
	edns.SetEdns0(4096, true)
	small := plain.Copy()
	small.SetEdns0(100, false)
	two := plain.Copy()
	two.Question = append(two.Question, two.Question[0])
	none := plain.Copy()
	none.Question = nil
	notify := plain.Copy()
	notify.Opcode = dns.OpcodeNotify
	resp := plain.Copy()
	resp.Response = true
	v1 := edns.Copy()
	v1.IsEdns0().SetVersion(1)
	twoOPT := edns.Copy()
	twoOPT.Extra = append(twoOPT.Extra, twoOPT.Extra[0])

	tests := []struct {
		name string
		b    []byte
		err  error
		size uint16
		do   bool
	}{
		{"plain", pack(t, plain), nil, 512, false},
		{"edns", pack(t, edns), nil, 4096, true},
		{"edns size below 512 counts as 512", pack(t, small), nil, 512, false},
		{"two questions", pack(t, two), ErrFormat, 0, false},
		{"no question", pack(t, none), ErrFormat, 0, false},
		{"notify", pack(t, notify), ErrNotImp, 0, false},
		{"response", pack(t, resp), ErrDrop, 0, false},
		{"edns version 1", pack(t, v1), ErrBadVers, 0, false},
		{"two OPT", pack(t, twoOPT), ErrFormat, 0, false},
		{"short header", []byte{1, 2, 3, 4, 5}, ErrDrop, 0, false},
		{"truncated question", pack(t, plain)[:20], ErrFormat, 0, false},
		{"pointer in question", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1}, ErrFormat, 0, false},
		{"label over 63", append(append([]byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 64}, make([]byte, 64)...), 0, 0, 1, 0, 1), ErrFormat, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var q Query
			err := ParseQuery(tc.b, &q)
			if err != tc.err {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if q.ID != 77 || q.Type != dns.TypeAAAA || q.Class != dns.ClassINET || NameString(q.Name) != "www.example.com." {
				t.Fatalf("parsed %+v", q)
			}
			if q.Size != tc.size || q.DO != tc.do || q.EDNS != (tc.size != 512 || tc.name != "plain") {
				t.Fatalf("edns: size %d do %v edns %v", q.Size, q.DO, q.EDNS)
			}
		})
	}
}

func TestErrorAnswerEchoesQuestion(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("A.example.", dns.TypeA)
	m.SetEdns0(1232, true)
	m.RecursionDesired = true
	b := pack(t, m)
	var q Query
	if err := ParseQuery(b, &q); err != nil {
		t.Fatal(err)
	}
	out := AppendError(nil, b, &q, RcodeServFail, 1232)
	r := new(dns.Msg)
	if err := r.Unpack(out); err != nil {
		t.Fatal(err)
	}
	if r.Id != m.Id || r.Rcode != dns.RcodeServerFailure || !r.RecursionDesired || !r.Response ||
		r.Question[0].Name != "A.example." || r.IsEdns0() == nil || !r.IsEdns0().Do() {
		t.Fatalf("%v", r)
	}
}

func TestInZone(t *testing.T) {
	w := func(s string) []byte { b, _ := AppendNameWire(nil, s); return b }
	tests := []struct {
		name, zone string
		want       bool
	}{
		{"x.default.svc.cluster.local.", "cluster.local.", true},
		{"CLUSTER.LOCAL.", "cluster.local", true},
		{"xcluster.local.", "cluster.local.", false},
		{"local.", "cluster.local.", false},
		{"example.com.", ".", true},
		{"1.0.96.10.in-addr.arpa.", "in-addr.arpa.", true},
	}
	for _, tc := range tests {
		if got := InZone(w(tc.name), w(tc.zone)); got != tc.want {
			t.Errorf("InZone(%q, %q) = %v", tc.name, tc.zone, got)
		}
	}
	if _, ok := AppendNameWire(nil, "a..b"); ok {
		t.Error("empty label accepted")
	}
}

func FuzzParseQuery(f *testing.F) {
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	m.SetEdns0(1232, true)
	b, _ := m.Pack()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var q Query
		err := ParseQuery(b, &q)
		if err == nil && (len(q.Name) == 0 || q.QEnd > len(b)) {
			t.Fatalf("accepted %+v", q)
		}
		_ = NameString(q.Name)
		var a Answer
		_ = ParseAnswer(b, &a)
	})
}
