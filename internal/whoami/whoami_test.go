package whoami

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func query(t testing.TB, name string, qtype, class uint16, edns bool) ([]byte, *wire.Query) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Question[0].Qclass = class
	m.Id = 777
	m.CheckingDisabled = true
	if edns {
		m.SetEdns0(1232, true)
	}
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q := new(wire.Query)
	if err := wire.ParseQuery(raw, q); err != nil {
		t.Fatal(err)
	}
	return raw, q
}

// The answer is CoreDNS's whoami's: no answer records; the client's
// address (A or AAAA) under the name as asked and an SRV of its port
// under _udp. or _tcp. in the additional section, TTL 0, the question's
// class, AA set and RA not, for any type; an OPT when the client sent one.
func TestAppend(t *testing.T) {
	for _, tc := range []struct {
		name   string
		qtype  uint16
		class  uint16
		client string
		tcp    bool
		edns   bool
		addr   string // the address record as miekg prints it
		srv    string
	}{
		{"Who.Example.ORG.", dns.TypeA, dns.ClassINET, "10.1.2.3:40001", false, true,
			"Who.Example.ORG.\t0\tIN\tA\t10.1.2.3", "_udp.Who.Example.ORG.\t0\tIN\tSRV\t0 0 40001 ."},
		{"x.example.", dns.TypeMX, dns.ClassINET, "[2001:db8::7]:53", true, false,
			"x.example.\t0\tIN\tAAAA\t2001:db8::7", "_tcp.x.example.\t0\tIN\tSRV\t0 0 53 ."},
		{".", dns.TypeTXT, dns.ClassCHAOS, "[::ffff:192.0.2.9]:1", false, false,
			".\t0\tCH\tA\t192.0.2.9", "_udp.\t0\tCH\tSRV\t0 0 1 ."},
	} {
		raw, q := query(t, tc.name, tc.qtype, tc.class, tc.edns)
		out := Append([]byte{0xAA}, raw, q, netip.MustParseAddrPort(tc.client), tc.tcp, 1232)
		if out[0] != 0xAA {
			t.Fatal("dst overwritten")
		}
		m := new(dns.Msg)
		if err := m.Unpack(out[1:]); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if m.Id != 777 || !m.Response || !m.Authoritative || m.RecursionAvailable || !m.RecursionDesired || !m.CheckingDisabled || m.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: header %+v", tc.name, m.MsgHdr)
		}
		if len(m.Question) != 1 || m.Question[0].Name != tc.name || len(m.Answer) != 0 || len(m.Ns) != 0 {
			t.Errorf("%s: %v", tc.name, m)
		}
		var extra []string
		for _, rr := range m.Extra {
			if rr.Header().Rrtype != dns.TypeOPT {
				extra = append(extra, rr.String())
			}
		}
		if len(extra) != 2 || extra[0] != tc.addr || extra[1] != tc.srv {
			t.Errorf("%s: additional %q, want %q %q", tc.name, extra, tc.addr, tc.srv)
		}
		if o := m.IsEdns0(); (o != nil) != tc.edns || o != nil && (!o.Do() || o.UDPSize() != 1232) {
			t.Errorf("%s: OPT %v", tc.name, o)
		}
	}
}

func TestAppendAllocatesNothing(t *testing.T) {
	raw, q := query(t, "who.example.org.", dns.TypeA, dns.ClassINET, true)
	buf := make([]byte, 0, 512)
	c := netip.MustParseAddrPort("10.1.2.3:4000")
	if n := testing.AllocsPerRun(100, func() { Append(buf[:0], raw, q, c, false, 1232) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// FuzzAppend: for any query the server parses, the answer is a message
// miekg/dns reads, with the question echoed and two records besides OPT.
func FuzzAppend(f *testing.F) {
	for _, edns := range []bool{false, true} {
		raw, _ := query(f, "who.example.", dns.TypeA, dns.ClassINET, edns)
		f.Add(raw, true)
	}
	root, _ := query(f, ".", dns.TypeTXT, dns.ClassCHAOS, false)
	f.Add(root, false)
	f.Fuzz(func(t *testing.T, raw []byte, tcp bool) {
		q := new(wire.Query)
		if wire.ParseQuery(raw, q) != nil || !q.HasQ {
			return
		}
		for _, c := range []string{"192.0.2.1:53", "[2001:db8::1]:65535"} {
			out := Append(nil, raw, q, netip.MustParseAddrPort(c), tcp, 1232)
			m := new(dns.Msg)
			if err := m.Unpack(out); err != nil {
				t.Fatalf("%x: answer %x does not unpack: %v", raw, out, err)
			}
			n := 0
			for _, rr := range m.Extra {
				if rr.Header().Rrtype != dns.TypeOPT {
					n++
				}
			}
			if len(m.Question) != 1 || n != 2 || m.Id != q.ID {
				t.Fatalf("%x: %v", raw, m)
			}
		}
	})
}
