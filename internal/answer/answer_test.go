package answer

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// recorder is a handler that notes its calls in a shared log and, when
// answers, answers the query itself.
type recorder struct {
	name    string
	log     *[]string
	answers Verdict // what Query returns
}

func (h recorder) Query(_ *Request, out []byte) ([]byte, Verdict) {
	*h.log = append(*h.log, "query "+h.name)
	if h.answers == Answered {
		out = append(out, h.name...)
	}
	return out, h.answers
}

func (h recorder) Answer(_ *Request, out []byte, start int) []byte {
	*h.log = append(*h.log, "answer "+h.name+" sees "+string(out[start:]))
	return out
}

// The one sequence: Query in the chain's order until one answers or
// drops; Answer in reverse, for the handlers that let the query pass
// (as CoreDNS's response writers wrap each other).
func TestChainOrder(t *testing.T) {
	var log []string
	mk := func(n string, v Verdict) Handler { return recorder{name: n, log: &log, answers: v} }
	c := NewChain([]string{"log", "dnstap", "whoami"}, []Handler{mk("log", Pass), mk("dnstap", Pass), mk("whoami", Answered)})
	out, v, depth := c.Query(&Request{}, []byte("hdr:"))
	if v != Answered || depth != 2 || string(out) != "hdr:whoami" {
		t.Fatalf("Query: %q %v %d", out, v, depth)
	}
	c.Answer(&Request{}, out, 4, depth)
	want := []string{"query log", "query dnstap", "query whoami", "answer dnstap sees whoami", "answer log sees whoami"}
	if !slices.Equal(log, want) {
		t.Fatalf("calls\n%s\nwant\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
	log = nil
	pass := NewChain([]string{"log", "dnstap"}, []Handler{mk("log", Pass), mk("dnstap", Pass)})
	out, v, depth = pass.Query(&Request{}, nil)
	if v != Pass || depth != 2 || len(out) != 0 {
		t.Fatalf("passed: %q %v %d", out, v, depth)
	}
	pass.Answer(&Request{}, []byte("cached"), 0, depth)
	if want := []string{"query log", "query dnstap", "answer dnstap sees cached", "answer log sees cached"}; !slices.Equal(log, want) {
		t.Fatalf("calls %q", log)
	}
	log = nil
	drop := NewChain([]string{"dnstap", "acl"}, []Handler{mk("dnstap", Pass), mk("acl", Drop)})
	if _, v, depth := drop.Query(&Request{}, nil); v != Drop || depth != 1 {
		t.Fatalf("dropped: %v %d", v, depth)
	}
	var none *Chain
	if out, v, depth := none.Query(&Request{}, []byte("x")); v != Pass || depth != 0 || string(out) != "x" || none.Len() != 0 {
		t.Fatal("the empty chain does something")
	}
}

// Replace keeps the answer when the handler changed it in place, takes a
// repacking no longer than it, and drops a longer one.
func TestReplace(t *testing.T) {
	out := []byte("head:answer")
	if got := Replace(out, 5, out[5:]); string(got) != "head:answer" {
		t.Errorf("in place: %q", got)
	}
	if got := Replace(slices.Clone(out), 5, []byte("short")); string(got) != "head:short" {
		t.Errorf("shorter: %q", got)
	}
	if got := Replace(slices.Clone(out), 5, []byte("much longer")); string(got) != "head:answer" {
		t.Errorf("longer: %q", got)
	}
}

// The chain's forward observers are its handlers that see forward tries.
func TestForwarders(t *testing.T) {
	c := NewChain([]string{"a"}, []Handler{fwd{}})
	if len(c.Forwarders()) != 1 || len(NewChain([]string{"b"}, []Handler{recorder{log: new([]string)}}).Forwarders()) != 0 {
		t.Fatal("forward observers")
	}
}

type fwd struct {
	Passer
	Keeper
}

func (fwd) Forwarded(netip.AddrPort, string, bool, time.Time, []byte, []byte) {}
