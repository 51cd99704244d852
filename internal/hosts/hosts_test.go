package hosts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
)

func forwarded(context.Context, *dns.Msg) (*dns.Msg, error) { return nil, errors.New("forwarded") }

func ask(t *testing.T, h *Handler, name string, qtype uint16) string {
	t.Helper()
	r := new(dns.Msg)
	r.SetQuestion(name, qtype)
	m, err := h.Serve(context.Background(), r, forwarded)
	switch {
	case errors.Is(err, ErrServFail):
		return "servfail"
	case err != nil:
		return err.Error()
	}
	if !m.Authoritative {
		t.Errorf("%s: not authoritative", name)
	}
	var rrs []string
	for _, rr := range m.Answer {
		rrs = append(rrs, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	return dns.RcodeToString[m.Rcode] + " [" + strings.Join(rrs, ", ") + "]"
}

func TestServe(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hosts")
	if err := os.WriteFile(path, []byte("10.0.0.2 File.example # c\nfd00::2 file.example\n10.0.0.3 *.wild.example\nbogus x.example\n10.0.0.9 outside.other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(1e9, 0))
	h := New(Config{Path: path, Zones: []string{"example."}, Inline: []string{"10.0.0.1 inline.example"}, TTL: 60, Reload: 5 * time.Second}, clk, nil)
	var entries, reload, skipped atomic.Int64
	h.Report(&entries, &reload, &skipped)
	// file: 2 names with PTRs, 1 wildcard; inline: 1 name with its PTR;
	// "bogus x.example" skipped
	if entries.Load() != 7 || reload.Load() == 0 || skipped.Load() != 1 {
		t.Fatalf("entries %d reload %d skipped %d", entries.Load(), reload.Load(), skipped.Load())
	}
	for _, c := range []struct {
		name  string
		qtype uint16
		want  string
	}{
		{"file.example.", dns.TypeA, "NOERROR [file.example. 60 IN A 10.0.0.2]"},
		{"FILE.example.", dns.TypeAAAA, "NOERROR [FILE.example. 60 IN AAAA fd00::2]"},
		{"file.example.", dns.TypeMX, "NOERROR []"},
		{"inline.example.", dns.TypeAAAA, "NOERROR []"},
		{"a.wild.example.", dns.TypeA, "NOERROR [a.wild.example. 60 IN A 10.0.0.3]"},
		{"x.example.", dns.TypeA, "servfail"},
		{"outside.other.", dns.TypeA, "forwarded"},
		{"2.0.0.10.in-addr.arpa.", dns.TypePTR, "NOERROR [2.0.0.10.in-addr.arpa. 60 IN PTR file.example.]"},
		{"1.0.0.10.in-addr.arpa.", dns.TypePTR, "NOERROR [1.0.0.10.in-addr.arpa. 60 IN PTR inline.example.]"},
		{"2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR, "NOERROR [2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. 60 IN PTR file.example.]"},
		{"9.0.0.10.in-addr.arpa.", dns.TypePTR, "forwarded"},
	} {
		if got := ask(t, h, c.name, c.qtype); got != c.want {
			t.Errorf("%s %s: got %s, want %s", c.name, dns.TypeToString[c.qtype], got, c.want)
		}
	}
	// Reload: the change is seen once the interval has passed.
	if err := os.WriteFile(path, []byte("10.0.0.7 new.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ask(t, h, "new.example.", dns.TypeA); got != "servfail" {
		t.Fatalf("before the interval: %s", got)
	}
	clk.Advance(5 * time.Second)
	if got := ask(t, h, "new.example.", dns.TypeA); got != "NOERROR [new.example. 60 IN A 10.0.0.7]" {
		t.Fatalf("after the interval: %s", got)
	}
	if got := ask(t, h, "file.example.", dns.TypeA); got != "servfail" {
		t.Fatalf("removed entry: %s", got)
	}
	if n := h.Stats.Reloads.Load(); n != 2 || entries.Load() != 4 {
		t.Fatalf("reloads %d, entries %d", n, entries.Load())
	}
}

func TestFallthroughAndNoReverse(t *testing.T) {
	h := New(Config{Zones: []string{"."}, Inline: []string{"10.0.0.1 a.example"}, TTL: 1, NoReverse: true, Fallthrough: []string{"example."}}, nil, nil)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  string
	}{
		{"b.example.", dns.TypeA, "forwarded"},
		{"b.other.", dns.TypeA, "servfail"},
		{"1.0.0.10.in-addr.arpa.", dns.TypePTR, "forwarded"},
	} {
		if got := ask(t, h, c.name, c.qtype); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}
