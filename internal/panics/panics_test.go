package panics

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestShapeNamesNothing: the shape of a message says its header and the
// question's sizes, type and class, never a byte of the name, whatever
// the bytes.
func TestShapeNamesNothing(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("Secret-Name.example.", dns.TypeAAAA)
	m.CheckingDisabled = true
	b, _ := m.Pack()
	got := Shape(b)
	want := "37 bytes, opcode 0, rcode 0, flags rd cd, counts 1/0/0/0, question: name of 21 bytes in 2 labels, type 28, class 1"
	if got != want {
		t.Errorf("Shape = %q, want %q", got, want)
	}
	for _, msg := range [][]byte{nil, {1, 2}, b[:14], append(b[:12:12], 0xC0, 0x0C, 0, 1, 0, 1)} {
		if s := Shape(msg); strings.Contains(strings.ToLower(s), "secret") || s == "" {
			t.Errorf("Shape(%x) = %q", msg, s)
		}
	}
}

// TestRecoveredCountsAndBoundsTheLog: every panic is counted, one line per
// place per interval is logged, and the next line says how many were not.
func TestRecoveredCountsAndBoundsTheLog(t *testing.T) {
	var buf bytes.Buffer
	SetLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	defer SetLogger(nil)
	ForgetLogged()
	before := Count(Miss)
	for range 5 {
		Recovered(Miss, "test panic", nil)
	}
	if d := Count(Miss) - before; d != 5 {
		t.Errorf("counted %d, want 5", d)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Errorf("%d lines logged, want 1:\n%s", n, buf.String())
	}
	ForgetLogged() // as if the interval had passed
	Recovered(Miss, "test panic", nil)
	if !strings.Contains(buf.String(), "suppressed_since_last=4") || strings.Count(buf.String(), "\n") != 2 {
		t.Errorf("log:\n%s", buf.String())
	}
}
