package forward

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// tapRec is a Tapper recording the tries it hears of.
type tapRec struct {
	mu    sync.Mutex
	tries []string // "upstream tcp answered"
}

func (r *tapRec) Tapping() bool { return true }

func (r *tapRec) Tried(upstream string, tcp bool, start time.Time, query, answer []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := upstream
	if tcp {
		s += " tcp"
	} else {
		s += " udp"
	}
	if answer != nil && !bytes.Equal(answer[2:], answerFor(query)[2:]) {
		s += " wrong-answer"
	} else if answer != nil {
		s += " answered"
	}
	if start.IsZero() {
		s += " no-start"
	}
	r.tries = append(r.tries, s)
}

// doneTap is a doneRec that is also a Tapper (as running's asyncForward is).
type doneTap struct {
	*doneRec
	*tapRec
}

// Every try of an exchange is told to its Tapper: ExchangeAsync's through
// its Done, Exchange's through its ctx; a server that does not answer
// gets a try without answer, and the next server's try follows.
func TestTapperHearsEveryTry(t *testing.T) {
	srv := startUDP(t, func(q []byte, reply func([]byte)) { reply(answerFor(q)) })
	silent := startUDP(t, func(q []byte, reply func([]byte)) {})
	g := newGroup(t, GroupConfig{Servers: []netip.AddrPort{srv.addr}, TryTimeout: time.Second}, nil)

	rec := &tapRec{}
	d := doneTap{newDoneRec(), rec}
	g.ExchangeAsync(query(t, "a.example.", 1), 3*time.Second, d)
	if _, err := d.wait(t); err != nil {
		t.Fatal(err)
	}
	rec2 := &tapRec{}
	ctx, cancel := context.WithTimeout(WithTapper(context.Background(), rec2), 3*time.Second)
	defer cancel()
	if _, err := g.Exchange(ctx, query(t, "b.example.", 2)); err != nil {
		t.Fatal(err)
	}
	want := srv.addr.String() + " udp answered"
	if len(rec.tries) != 1 || rec.tries[0] != want || len(rec2.tries) != 1 || rec2.tries[0] != want {
		t.Errorf("async %q, blocking %q; want [%q] each", rec.tries, rec2.tries, want)
	}

	// The silent server first (sequential), then the answering one.
	g2 := newGroup(t, GroupConfig{Servers: []netip.AddrPort{silent.addr, srv.addr}, TryTimeout: 200 * time.Millisecond}, nil)
	rec3 := &tapRec{}
	d3 := doneTap{newDoneRec(), rec3}
	g2.ExchangeAsync(query(t, "c.example.", 3), 3*time.Second, d3)
	if _, err := d3.wait(t); err != nil {
		t.Fatal(err)
	}
	rec3.mu.Lock()
	defer rec3.mu.Unlock()
	if len(rec3.tries) != 2 || rec3.tries[0] != silent.addr.String()+" udp" || rec3.tries[1] != want {
		t.Errorf("failover: %q", rec3.tries)
	}
}
