package wire

import (
	"testing"

	"github.com/miekg/dns"
)

// flagsQuery packs a query with the given opcode and header bits set (and one
// question), parses it as the server does, and returns the raw query and
// its parse.
func flagsQuery(t *testing.T, opcode int, bits uint16, edns bool) ([]byte, *Query, error) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	m.Id = 0x1234
	m.Opcode = opcode
	m.RecursionDesired = false
	if edns {
		m.SetEdns0(1232, false)
	}
	b := pack(t, m)
	b[2], b[3] = byte(bits>>8)|byte(opcode<<3), byte(bits)
	var q Query
	err := ParseQuery(b, &q)
	return b, &q, err
}

// The header of an error answer (AppendError), rule by rule: the ID,
// opcode, RD and CD are the query's (RFC 1035 §4.1.1, RFC 4035 §3.2.2,
// RFC 6895 §2); RA only on an answer to a QUERY that parsed (FORMERR and
// NOTIMP carry none, as the stock node-cache's and Unbound's); AA, TC, Z
// and AD never, whatever the query's header held (every bit set below).
func TestErrorAnswerHeader(t *testing.T) {
	const every = FlagAA | FlagTC | FlagRD | FlagRA | 1<<6 | FlagAD | FlagCD
	tests := []struct {
		name   string
		opcode int
		bits   uint16
		rcode  int
		err    error
		want   uint16 // besides QR, the opcode and rcode
	}{
		{"opcode 15, every flag", 15, every, RcodeNotImp, ErrNotImp, FlagRD | FlagCD},
		{"opcode 15, RD", 15, FlagRD, RcodeNotImp, ErrNotImp, FlagRD},
		{"opcode 15, none", 15, 0, RcodeNotImp, ErrNotImp, 0},
		{"opcode 1 (IQUERY), every flag", 1, every, RcodeNotImp, ErrNotImp, FlagRD | FlagCD},
		{"opcode 2 (STATUS), RD CD", 2, FlagRD | FlagCD, RcodeNotImp, ErrNotImp, FlagRD | FlagCD},
		{"opcode 4 (NOTIFY), every flag", 4, every, RcodeNotImp, ErrNotImp, FlagRD | FlagCD},
		{"opcode 5 (UPDATE), AD", 5, FlagAD, RcodeNotImp, ErrNotImp, 0},
		{"FORMERR, every flag", 0, every, RcodeFormErr, nil, FlagRD | FlagCD},
		{"REFUSED, every flag", 0, every, RcodeRefused, nil, FlagRD | FlagCD | FlagRA},
		{"SERVFAIL, RD AD", 0, FlagRD | FlagAD, RcodeServFail, nil, FlagRD | FlagRA},
		{"SERVFAIL, no RD", 0, 0, RcodeServFail, nil, FlagRA},
		{"BADVERS, every flag", 0, every, RcodeBadVers, nil, FlagRD | FlagCD | FlagRA},
		{"NOERROR (health), every flag", 0, every, RcodeSuccess, nil, FlagRD | FlagCD | FlagRA},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, q, err := flagsQuery(t, tc.opcode, tc.bits, tc.rcode == RcodeBadVers)
			if err != tc.err {
				t.Fatalf("ParseQuery: %v, want %v", err, tc.err)
			}
			out := AppendError(nil, raw, q, tc.rcode, 1232)
			want := FlagQR | uint16(tc.opcode)<<opcodeShift | tc.want | uint16(tc.rcode&rcodeMask)
			if got := Flags(out); got != want {
				t.Errorf("flags %016b, want %016b", got, want)
			}
			if ID(out) != 0x1234 {
				t.Errorf("ID %#x", ID(out))
			}
			r := new(dns.Msg)
			if err := r.Unpack(out); err != nil {
				t.Fatal(err)
			}
			if len(r.Question) != 1 || r.Rcode != tc.rcode {
				t.Errorf("question %v rcode %d, want the question echoed and %d", r.Question, r.Rcode, tc.rcode)
			}
		})
	}
}
