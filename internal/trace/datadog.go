package trace

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// datadogEncoder writes the trace agent's v0.4 payload (msgpack: an array
// of traces, each an array of spans), as dd-trace-go 2.4 posts it to
// /v0.4/traces: one trace per query, its one span "servedns" (resource
// "servedns", service the configured one) with the coredns.io@ tags and
// the global tag dns=true that plugin/trace sets, and the sampling
// metrics that keep the agent from dropping it (priority 1, kept by
// the client).
type datadogEncoder struct {
	service   string
	runtimeID string
	pid       float64
}

// DatadogMaxBatch: traces per POST at most (dd-trace-go flushes every 2 s
// or when its payload grows past its size limit; this bounds a payload to
// ~1 MiB).
const DatadogMaxBatch = 1000

func newDatadog(cfg Config) *datadogEncoder {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	id := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	return &datadogEncoder{service: cfg.Service, runtimeID: id, pid: float64(os.Getpid())}
}

func (*datadogEncoder) path() string { return "/v0.4/traces" }

func (*datadogEncoder) header(h http.Header, n int) {
	h.Set("Content-Type", "application/msgpack")
	h.Set("X-Datadog-Trace-Count", strconv.Itoa(n))
	h.Set("Datadog-Meta-Lang", "go")
	h.Set("Datadog-Meta-Lang-Version", strings.TrimPrefix(runtime.Version(), "go"))
	h.Set("Datadog-Meta-Lang-Interpreter", runtime.Compiler+"-"+runtime.GOARCH+"-"+runtime.GOOS)
	h.Set("Datadog-Meta-Tracer-Version", "nodelocaldns")
	h.Set("Datadog-Client-Computed-Top-Level", "yes")
}

func (d *datadogEncoder) encode(b *bytes.Buffer, spans []Span) {
	mpArray(b, len(spans))
	for i := range spans {
		s := &spans[i]
		mpArray(b, 1)
		id := nonzero()
		mpMap(b, 13)
		mpStr(b, "name")
		mpStr(b, defaultTopLevelSpanName)
		mpStr(b, "service")
		mpStr(b, d.service)
		mpStr(b, "resource")
		mpStr(b, defaultTopLevelSpanName)
		mpStr(b, "type")
		mpStr(b, "")
		mpStr(b, "start")
		mpInt(b, s.Start.UnixNano())
		mpStr(b, "duration")
		mpInt(b, max(s.Duration.Nanoseconds(), 1))
		meta := [][2]string{
			{"coredns.io@name", s.Name},
			{"coredns.io@type", typeString(s.QType)},
			{"coredns.io@proto", proto(s.TCP)},
			{"coredns.io@remote", s.Remote.String()},
			{"coredns.io@rcode", rcodeString(s.Rcode)},
			{"dns", "true"},
			{"language", "go"},
			{"runtime-id", d.runtimeID},
			{"_dd.p.dm", "-1"},
			// The upper 64 bits of the 128-bit trace id: its start in
			// seconds, as dd-trace-go makes them.
			{"_dd.p.tid", tid(s.Start.Unix())},
		}
		mpStr(b, "meta")
		mpMap(b, len(meta))
		for _, kv := range meta {
			mpStr(b, kv[0])
			mpStr(b, kv[1])
		}
		mpStr(b, "meta_struct")
		mpMap(b, 0)
		mpStr(b, "metrics")
		mpMap(b, 4)
		mpStr(b, "_sampling_priority_v1")
		mpFloat(b, 1)
		mpStr(b, "_dd.agent_psr")
		mpFloat(b, 1)
		mpStr(b, "_dd.top_level")
		mpFloat(b, 1)
		mpStr(b, "process_id")
		mpFloat(b, d.pid)
		mpStr(b, "span_id")
		mpUint(b, id)
		mpStr(b, "trace_id")
		mpUint(b, id)
		mpStr(b, "parent_id")
		mpUint(b, 0)
		mpStr(b, "error")
		mpInt(b, 0)
	}
}

func tid(sec int64) string {
	s := strconv.FormatUint(uint64(sec)<<32, 16)
	return strings.Repeat("0", 16-len(s)) + s
}

// msgpack, the few kinds the payload uses.

func mpArray(b *bytes.Buffer, n int) {
	if n < 16 {
		b.WriteByte(0x90 | byte(n))
		return
	}
	b.WriteByte(0xdd)
	b.Write(binary.BigEndian.AppendUint32(nil, uint32(n)))
}

func mpMap(b *bytes.Buffer, n int) {
	if n < 16 {
		b.WriteByte(0x80 | byte(n))
		return
	}
	b.WriteByte(0xdf)
	b.Write(binary.BigEndian.AppendUint32(nil, uint32(n)))
}

func mpStr(b *bytes.Buffer, s string) {
	switch n := len(s); {
	case n < 32:
		b.WriteByte(0xa0 | byte(n))
	case n < 256:
		b.WriteByte(0xd9)
		b.WriteByte(byte(n))
	case n < 65536:
		b.WriteByte(0xda)
		b.Write(binary.BigEndian.AppendUint16(nil, uint16(n)))
	default:
		b.WriteByte(0xdb)
		b.Write(binary.BigEndian.AppendUint32(nil, uint32(n)))
	}
	b.WriteString(s)
}

func mpInt(b *bytes.Buffer, v int64) {
	b.WriteByte(0xd3)
	b.Write(binary.BigEndian.AppendUint64(nil, uint64(v)))
}

func mpUint(b *bytes.Buffer, v uint64) {
	b.WriteByte(0xcf)
	b.Write(binary.BigEndian.AppendUint64(nil, v))
}

func mpFloat(b *bytes.Buffer, v float64) {
	b.WriteByte(0xcb)
	b.Write(binary.BigEndian.AppendUint64(nil, math.Float64bits(v)))
}
