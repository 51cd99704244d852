package template

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func forwarded(context.Context, *dns.Msg) (*dns.Msg, error) { return nil, errors.New("forwarded") }

func TestServe(t *testing.T) {
	h, err := New([]Config{
		{Class: dns.ClassINET, Type: dns.TypeAAAA, Zones: []string{"."}},
		{Class: dns.ClassINET, Type: dns.TypeA, Zones: []string{"ex."}, Match: []string{`^(?P<n>[0-9]+)\.ex\.$`},
			Answer: []string{"{{ .Name }} 60 IN A 10.0.0.{{ .Group.n }}"}, Fallthrough: []string{"."}},
		{Class: dns.ClassINET, Type: dns.TypeA, Zones: []string{"strict."}, Match: []string{`^ok\.`}, Answer: []string{"{{ .Name }} IN A 1.1.1.1"}},
		{Class: dns.ClassINET, Type: dns.TypeA, Zones: []string{"sf."}, Rcode: dns.RcodeServerFailure},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hooked := 0
	h.SetHooks(1, Hooks{Match: func() { hooked++ }})
	for _, c := range []struct {
		name  string
		qtype uint16
		want  string // rcode and answer, or "forwarded", or "servfail"
	}{
		{"a.b.", dns.TypeAAAA, "NOERROR []"},
		{"A.B.", dns.TypeA, "forwarded"},
		{"42.ex.", dns.TypeA, "NOERROR [42.ex.\t60\tIN\tA\t10.0.0.42]"},
		{"x.ex.", dns.TypeA, "forwarded"},
		{"ok.strict.", dns.TypeA, "NOERROR [ok.strict.\t3600\tIN\tA\t1.1.1.1]"},
		{"no.strict.", dns.TypeA, "servfail"},
		{"no.strict.", dns.TypeMX, "forwarded"},
		{"x.sf.", dns.TypeA, "servfail"},
	} {
		r := new(dns.Msg)
		r.SetQuestion(c.name, c.qtype)
		m, err := h.Serve(context.Background(), r, forwarded)
		got := ""
		switch {
		case errors.Is(err, ErrServFail):
			got = "servfail"
		case err != nil:
			got = err.Error()
		default:
			if !m.Authoritative || m.Id != r.Id {
				t.Errorf("%s: AA %v id %d", c.name, m.Authoritative, m.Id)
			}
			var rrs []string
			for _, rr := range m.Answer {
				rrs = append(rrs, rr.String())
			}
			got = dns.RcodeToString[m.Rcode] + " [" + strings.Join(rrs, " ") + "]"
		}
		if got != c.want {
			t.Errorf("%s %s: got %s, want %s", c.name, dns.TypeToString[c.qtype], got, c.want)
		}
	}
	if n := h.Stats.Matches.Load(); n != 4 || hooked != 1 {
		t.Errorf("matches %d, want 4; the second template's hook %d, want 1", n, hooked)
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, text := range []string{
		"x. IN TXT {{ .Var.x }}",
		"{{ .Name ",
	} {
		if _, err := Compile("answer", text); err == nil {
			t.Errorf("%q compiled", text)
		}
	}
	if _, err := Compile("answer", `{{ .Name }} IN A {{ index .Match 1 }}`); err != nil {
		t.Error(err)
	}
}

// .Remote is the asker's IP (IPv4-mapped shown as IPv4, IPv6 without
// brackets, as CoreDNS's state.IP()), empty when there is none; a handler
// whose templates use it says so.
func TestRemote(t *testing.T) {
	h, err := New([]Config{{Class: dns.ClassINET, Type: dns.TypeTXT, Zones: []string{"."},
		Answer: []string{`{{ .Name }} 60 IN TXT "at {{ .Remote }}"`}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New([]Config{{Class: dns.ClassINET, Type: dns.TypeAAAA, Zones: []string{"."}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !h.UsesRemote() || plain.UsesRemote() {
		t.Fatalf("UsesRemote %v and %v, want true and false", h.UsesRemote(), plain.UsesRemote())
	}
	type key struct{}
	h.Asker = func(ctx context.Context) netip.Addr { a, _ := ctx.Value(key{}).(netip.Addr); return a }
	for _, c := range []struct {
		from netip.Addr
		want string
	}{
		{netip.MustParseAddr("10.0.0.7"), `"at 10.0.0.7"`},
		{netip.MustParseAddr("::ffff:10.0.0.8"), `"at 10.0.0.8"`},
		{netip.MustParseAddr("fd00::1"), `"at fd00::1"`},
		{netip.Addr{}, `"at "`},
	} {
		r := new(dns.Msg)
		r.SetQuestion("x.example.", dns.TypeTXT)
		m, err := h.Serve(context.WithValue(context.Background(), key{}, c.from), r, forwarded)
		if err != nil || len(m.Answer) != 1 {
			t.Fatalf("%v: %v %v", c.from, m, err)
		}
		if got := m.Answer[0].(*dns.TXT).String(); !strings.HasSuffix(got, c.want) {
			t.Errorf("%v: %s, want ...%s", c.from, got, c.want)
		}
	}
}
