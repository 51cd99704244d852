package whoami

import "github.com/nodelocaldns/nodelocaldns/internal/answer"

// The whoami directive's handler: every query of the block answered with
// its client's own address (answer.Handler), before the cache, so never
// cached, coalesced or forwarded.

// setup: cfg says whether whoami answers the block's queries (false: a
// forward answers every name first, as in CoreDNS: never reached).
func setup(_ answer.Env, cfg any) (answer.Handler, error) {
	if on, _ := cfg.(bool); !on {
		return nil, nil
	}
	return Handler{}, nil
}

// Handler answers whoami.
type Handler struct{ answer.Keeper }

// Query answers the query with its client's address and port.
func (Handler) Query(r *answer.Request, out []byte) ([]byte, answer.Verdict) {
	return Append(out, r.Raw, r.Q, r.Client, r.TCP, r.EDNSSize), answer.Answered
}
