package cache

import (
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The header of an answer written from an entry, rule by rule, for an
// upstream whose header says the opposite of what the client should get:
// it does not copy CD (Knot, NSD), sets AA and Z, clears RA, sets AD. The
// client's header decides: ID, opcode, RD and CD copied (RFC 1035 §4.1.1,
// RFC 4035 §3.2.2); RA always (the cache resolves every name for its
// client); AA and Z never; TC only when cut here; AD only from an
// upstream that set it, and only for a client that asked about DNSSEC
// (DO or AD: RFC 6840 §5.8). Fresh, stale and truncated answers alike.
func TestEntryHeaderFollowsQuery(t *testing.T) {
	up := new(dns.Msg)
	up.SetQuestion("a.example.", dns.TypeA)
	up.Response, up.Authoritative, up.Zero, up.AuthenticatedData = true, true, true, true
	up.RecursionAvailable, up.CheckingDisabled, up.RecursionDesired = false, false, false
	for i := range 40 {
		up.Answer = append(up.Answer, mustRR(t, "a.example. 300 IN A 192.0.2."+string(rune('0'+i%10))))
	}
	resp, err := up.Pack()
	if err != nil {
		t.Fatal(err)
	}
	const zBit = 1 << 6
	tests := []struct {
		name  string
		bits  uint16 // the query's header bits
		edns  int
		do    bool
		stale bool
		size  int
		want  uint16 // besides QR and RA
	}{
		{"RD", wire.FlagRD, 0, false, false, 0xFFFF, wire.FlagRD},
		{"no RD", 0, 0, false, false, 0xFFFF, 0},
		{"RD CD", wire.FlagRD | wire.FlagCD, 0, false, false, 0xFFFF, wire.FlagRD | wire.FlagCD},
		{"CD AD", wire.FlagCD | wire.FlagAD, 0, false, false, 0xFFFF, wire.FlagCD | wire.FlagAD},
		{"DO", wire.FlagRD, 1232, true, false, 0xFFFF, wire.FlagRD | wire.FlagAD},
		{"AA TC Z RA set in the query", wire.FlagAA | wire.FlagTC | zBit | wire.FlagRA | wire.FlagRD, 0, false, false, 0xFFFF, wire.FlagRD},
		{"stale, RD CD", wire.FlagRD | wire.FlagCD, 0, false, true, 0xFFFF, wire.FlagRD | wire.FlagCD},
		{"stale, DO", wire.FlagCD, 1232, true, true, 0xFFFF, wire.FlagCD | wire.FlagAD},
		{"truncated, RD CD", wire.FlagRD | wire.FlagCD, 0, false, false, 512, wire.FlagRD | wire.FlagCD | wire.FlagTC},
		{"truncated stale, CD", wire.FlagCD, 0, false, true, 512, wire.FlagCD | wire.FlagTC},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, q := query(t, "A.example.", dns.TypeA, tc.edns, tc.do)
			q.Flags = q.Flags&^0x7FF0 | tc.bits
			e, err := Build(resp, q, externalP, 0, t0)
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			if tc.stale {
				out = e.WriteStale(nil, q, tc.size, 1232)
			} else {
				out = e.Write(nil, q, t0, tc.size, 1232)
			}
			want := wire.FlagQR | wire.FlagRA | tc.want
			if got := wire.Flags(out); got != want {
				t.Errorf("flags %016b, want %016b", got, want)
			}
			if wire.ID(out) != q.ID {
				t.Errorf("ID %#x, want %#x", wire.ID(out), q.ID)
			}
		})
	}
}
