package forward

import (
	"errors"
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/internal/panics"
)

// A panic on an upstream's reader must not end the process, nor leave an
// exchange unanswered (issue 41): its caller (a flight of
// internal/resolve) would wait forever, and with it every client asking
// the same question. Each place recovers where it still owns what it must
// answer, reports to package panics, and fails what it owns:
//
//   - checking an answer (checkAnswer, matchAnswer, under a lock in the
//     UDP reader): the answer is malformed;
//   - an asynchronous exchange's steps while it owns the exchange
//     (udpAnswer, tcpAnswer, tried, the resume goroutines): it ends with
//     errRecovered;
//   - the caller's callback (finish): its panic is its own, the exchange is
//     over;
//   - the rest of a reader (its bookkeeping): the socket or connection is
//     ended as after a read error, its pending queries failed (they go on
//     to the next try).

// errRecovered is the error of what was failed after a recovered panic.
var errRecovered = errors.New("recovered a panic (logged)")

// recoverCheck, deferred by an answer's check, makes a panic in it the
// answer's fault: malformed.
func recoverCheck(ans []byte, err *error) {
	if p := recover(); p != nil {
		panics.Recovered(panics.Upstream, p, ans)
		*err = fmt.Errorf("%w: %w", errMalformed, errRecovered)
	}
}

// recoverTry, deferred by a step of an asynchronous exchange that owns a,
// ends a with errRecovered after a panic. Every step hands a on last (to
// finish, whose callback cannot panic out of it, or to a goroutine as its
// final statement), so a recovered panic means a is still the step's.
func (a *asyncExchange) recoverTry() {
	if p := recover(); p != nil {
		panics.Recovered(panics.Upstream, p, nil)
		a.finish(nil, errRecovered)
	}
}

// exchangeDone calls the caller's callback; a panic in it is reported and
// goes no further (the exchange is over, the reader goes on).
func exchangeDone(done Done, ans []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			panics.Recovered(panics.Upstream, p, ans)
		}
	}()
	done.ExchangeDone(ans, err)
}

// recoverReader, deferred by an upstream's reader, ends its socket or
// connection with end after a panic, as after a read error.
func recoverReader(end func(error)) {
	if p := recover(); p != nil {
		panics.Recovered(panics.Upstream, p, nil)
		end(errRecovered)
	}
}
