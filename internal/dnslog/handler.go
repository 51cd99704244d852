package dnslog

import (
	"io"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
)

// The log directive's handler: the block's Log, on every answer the block
// sends (answer.Handler; CoreDNS's log writes its line once the response
// is written).

// setup builds a block's log from its rules ([]Rule, metadata flags
// set); the lines go to the one Sink of the Corefile (env.Out).
func setup(env answer.Env, cfg any) (answer.Handler, error) {
	rules, _ := cfg.([]Rule)
	if len(rules) == 0 {
		return nil, nil
	}
	c, err := env.Shared("dnslog:sink", func() (io.Closer, error) { return NewSink(env.Out), nil })
	if err != nil {
		return nil, err
	}
	return Handler{Log: c.(*Sink).Compile(rules)}, nil
}

// Handler logs the answers of a block (Log).
type Handler struct {
	answer.Passer
	Log *Log
}

// Answer writes the answer's line when a rule of the block logs it.
func (h Handler) Answer(r *answer.Request, out []byte, start int) []byte {
	h.Log.Log(&Entry{Remote: r.Client, Local: r.Local, TCP: r.TCP, Q: r.Q, Query: r.Raw, Resp: out[start:], Duration: r.Clock.Now().Sub(r.Start)})
	return out
}

// Close lets a Sink be a shared resource (answer.Env.Shared): its writer
// is the process's, not the Sink's to close.
func (s *Sink) Close() error { return nil }
