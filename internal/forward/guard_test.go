package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/panics"
)

// panickyDone panics in its callback (ExchangeDone), after recording it.
type panickyDone struct{ *doneRec }

func (d panickyDone) ExchangeDone(ans []byte, err error) {
	d.doneRec.ExchangeDone(ans, err)
	panic("test: a panic injected in the caller's callback")
}

// panickyTapper panics when the try is accounted for (Tapper.Tried), on the
// upstream's reader, before the exchange is finished.
type panickyTapper struct{ *doneRec }

func (panickyTapper) Tapping() bool { return true }
func (panickyTapper) Tried(string, bool, time.Time, []byte, []byte) {
	panic("test: a panic injected while a try is accounted for")
}

// TestReaderSurvivesPanics: a panic on an upstream's reader, in the
// caller's callback or in the exchange's own steps, does not end the
// process: the exchange is answered exactly once (with errRecovered when
// it had not been), nothing stays in flight, and the reader goes on to
// answer the next queries on the same socket or connection.
func TestReaderSurvivesPanics(t *testing.T) {
	panics.SetLogger(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { panics.SetLogger(nil) })
	for _, proto := range []Proto{UDP, TCP} {
		t.Run(proto.String(), func(t *testing.T) {
			var u upstreams
			if proto == TCP {
				tcpUp(t, &u, servePipelined)
			} else {
				udpUp(t, &u, answering)
			}
			rec := newRecorder()
			g := newGroup(t, GroupConfig{Servers: u.addrs, Proto: proto}, rec)
			if _, err := g.Exchange(context.Background(), query(t, "warm.example.", 1)); err != nil {
				t.Fatal(err)
			}
			before := panics.Count(panics.Upstream)
			var dones []*doneRec

			// The callback panics: the exchange was answered, the reader goes on.
			d := newDoneRec()
			g.ExchangeAsync(query(t, "cb.example.", 2), 5*time.Second, panickyDone{d})
			if _, err := d.wait(t); err != nil {
				t.Fatalf("callback: %v", err)
			}
			dones = append(dones, d)

			// A step of the exchange panics before it is finished: the caller hears
			// errRecovered, once.
			d = newDoneRec()
			g.ExchangeAsync(query(t, "tap.example.", 3), 5*time.Second, panickyTapper{d})
			if _, err := d.wait(t); !errors.Is(err, errRecovered) {
				t.Fatalf("a panicking step: %v, want errRecovered", err)
			}
			dones = append(dones, d)

			// The same reader answers what follows.
			for i := range 5 {
				name := fmt.Sprintf("after%d.example.", i)
				d, ans, err := exchangeAsync(t, g, query(t, name, uint16(10+i)), 5*time.Second)
				if err != nil {
					t.Fatalf("after the panics: %v", err)
				}
				if err := checkTXT(ans, name, uint16(10+i)); err != nil {
					t.Fatal(err)
				}
				dones = append(dones, d)
			}
			if n := rec.inflightNow(); n != 0 {
				t.Errorf("%d in flight after the panics", n)
			}
			if d := panics.Count(panics.Upstream) - before; d != 2 {
				t.Errorf("upstream panics counted %d, want 2", d)
			}
			settleOnce(t, g, nil, dones...)
		})
	}
}

// TestCheckAnswerPanicIsMalformed: a panic while an answer is checked
// (under the UDP mux's lock) makes it a malformed answer, and the lock is
// not left held.
func TestCheckAnswerPanicIsMalformed(t *testing.T) {
	var err error
	func() {
		defer recoverCheck([]byte("x"), &err)
		var b []byte
		_ = b[3] // index out of range, as a walker past its bounds
	}()
	if !errors.Is(err, errMalformed) || !strings.Contains(err.Error(), "recovered a panic") {
		t.Fatalf("err %v, want errMalformed after a recovered panic", err)
	}
}
