package trace

import (
	"io"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The trace directive's handler: each query of the block counts toward
// its sampling, and a sampled one's span is recorded once it is answered
// (answer.Handler).

// setup builds a block's Tracer from its *Config (normalized): one per
// block and loaded Corefile (CoreDNS's count restarts on reload too),
// shared by every view that sees the block; its exporter is the one of
// its endpoint (answer.Env.Shared: kept across reloads that keep it).
func setup(env answer.Env, cfg any) (answer.Handler, error) {
	c, _ := cfg.(*Config)
	if c == nil {
		return nil, nil
	}
	stats := env.Stats("trace", func() any { return &Stats{} }).(*Stats)
	exp, err := env.Shared(ExporterKey(*c), func() (io.Closer, error) {
		return StartExporter(*c, env.Log.With("component", "trace"), stats), nil
	})
	if err != nil {
		return nil, err
	}
	t := NewTracer(*c, Chain(func(n string) bool { return slices.Contains(env.Block.Plugins, n) }), env.Block.Local, exp.(*Exporter))
	return t, nil
}

// Query counts nothing yet: a query is sampled when it is answered.
func (t *Tracer) Query(_ *answer.Request, out []byte) ([]byte, answer.Verdict) {
	return out, answer.Pass
}

// Answer records the span of the query when it is the sampled one: the
// question, the answer's rcode, the transport, the client, whether it
// came from upstream and the time since it arrived. Only a sampled query
// pays more than the count: its name rendered and a span queued.
func (t *Tracer) Answer(r *answer.Request, out []byte, start int) []byte {
	resp := out[start:]
	if !t.Sample() || len(resp) < wire.HeaderLen {
		return out
	}
	t.Record(Span{
		Start: r.Start, Duration: r.Clock.Now().Sub(r.Start),
		Name: wire.NameString(r.Q.Name), QType: r.Q.Type, Rcode: wire.Rcode(resp),
		TCP: r.TCP, Remote: r.Client.Addr(), Miss: r.Source == answer.FromUpstream,
	})
	return out
}
