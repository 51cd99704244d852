package blocks

import (
	"context"
	"errors"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// forward's except: a name in an except zone that reaches the block fails
// with ErrExcepted and is not forwarded; the others are.
func TestForwardExceptFails(t *testing.T) {
	s := &corefile.Server{Zones: []string{"."}, Forward: &corefile.Forward{From: ".", Except: []string{"corp.example."}}}
	var asked []string
	next := func(_ context.Context, qname string, query []byte) ([]byte, error) {
		asked = append(asked, qname)
		r := new(dns.Msg)
		if err := r.Unpack(query); err != nil {
			return nil, err
		}
		m := new(dns.Msg)
		m.SetReply(r)
		return m.Pack()
	}
	c, err := BuildChains(ChainEnv{Clock: clock.Real}, []*corefile.Server{s}, nil, next)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		except bool
	}{{"www.corp.example.", true}, {"CORP.example.", true}, {"notcorp.example.", false}, {"www.example.org.", false}} {
		q := new(dns.Msg)
		q.SetQuestion(tc.name, dns.TypeA)
		raw, _ := q.Pack()
		asked = nil
		_, err := RunChain(context.Background(), c.Run("."), tc.name, raw)
		if tc.except != errors.Is(err, ErrExcepted) || tc.except == (len(asked) > 0) {
			t.Errorf("%s: err %v, forwarded %v", tc.name, err, asked)
		}
	}
}
