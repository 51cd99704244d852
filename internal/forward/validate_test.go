package forward

import (
	"errors"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func TestCheckAnswer(t *testing.T) {
	q := query(t, "www.Example.com.", 1234)
	pq, err := parseQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	reply := func(edit func(m *dns.Msg)) []byte {
		m := new(dns.Msg)
		if err := m.Unpack(q); err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		r.SetReply(m)
		edit(r)
		b, err := r.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		ans  []byte
		want error
	}{
		{"valid", reply(func(*dns.Msg) {}), nil},
		{"name case differs (0x20)", reply(func(m *dns.Msg) { m.Question[0].Name = "WWW.example.COM." }), nil},
		{"short", []byte{4, 210, 0x80}, errMalformed},
		{"QR clear", reply(func(m *dns.Msg) { m.Response = false }), errMalformed},
		{"wrong ID", reply(func(m *dns.Msg) { m.Id = 4321 }), errMismatch},
		{"other opcode", reply(func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }), errMismatch},
		{"no question", reply(func(m *dns.Msg) { m.Question = nil }), errMismatch},
		{"two questions", reply(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), errMismatch},
		{"other name", reply(func(m *dns.Msg) { m.Question[0].Name = "www.example.org." }), errMismatch},
		{"other type", reply(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeA }), errMismatch},
		{"other class", reply(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), errMismatch},
		{"compressed question", append([]byte{4, 210, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0}, 0xC0, 12, 0, 16, 0, 1), errMalformed},
		{"question cut short", reply(func(*dns.Msg) {})[:20], errMalformed},
		{"pointer loop in a record", loopAnswer(q), errMalformed},
	}
	for _, tt := range tests {
		err := checkAnswer(tt.ans, 1234, pq)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%s: checkAnswer = %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestParseQuery(t *testing.T) {
	good := query(t, "a.example.", 7)
	tests := []struct {
		name string
		msg  []byte
		ok   bool
	}{
		{"good", good, true},
		{"empty", nil, false},
		{"header only", good[:12], false},
		{"no type", good[:len(good)-2], false},
		{"zero questions", append([]byte{0, 7, 1, 0, 0, 0}, good[6:]...), false},
	}
	for _, tt := range tests {
		q, err := parseQuery(tt.msg)
		if (err == nil) != tt.ok {
			t.Errorf("%s: err = %v", tt.name, err)
		}
		if err != nil && !errors.Is(err, ErrBadQuery) {
			t.Errorf("%s: %v does not wrap ErrBadQuery", tt.name, err)
		}
		if tt.ok && (q.id != 7 || q.qtype != dns.TypeTXT || q.qclass != dns.ClassINET) {
			t.Errorf("%s: parsed %+v", tt.name, q)
		}
	}
}

// FuzzCheckAnswer: no input panics, and anything accepted has our ID and question.
func FuzzCheckAnswer(f *testing.F) {
	q := query(f, "www.example.com.", 99)
	f.Add(answerFor(q))
	f.Add(q)
	f.Add([]byte{0, 99, 0x80, 0, 0, 1})
	pq, _ := parseQuery(q)
	f.Fuzz(func(t *testing.T, ans []byte) {
		if checkAnswer(ans, 99, pq) == nil {
			name, _, _, _, err := wire.ReadQuestion(ans)
			if err != nil || wire.ID(ans) != 99 || !wire.EqualNameFold(name, pq.name) {
				t.Fatalf("accepted an answer for another question (%v)", err)
			}
			if wire.CheckMessage(ans) != nil {
				t.Fatal("accepted an answer wire.CheckMessage rejects")
			}
		}
	})
}

func FuzzParseQuery(f *testing.F) {
	f.Add(query(f, "a.b.", 1))
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 63})
	f.Fuzz(func(t *testing.T, msg []byte) {
		q, err := parseQuery(msg)
		if err == nil && len(q.name) > wire.MaxNameLen {
			t.Fatalf("name of %d bytes accepted", len(q.name))
		}
	})
}
