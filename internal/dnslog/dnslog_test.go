package dnslog

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// entry builds the entry of a query for name/qtype answered by resp.
func entry(t *testing.T, name string, qtype uint16, edns bool, resp func(r *dns.Msg)) *Entry {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 4242
	if edns {
		m.SetEdns0(1232, true)
		o := m.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	}
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q := new(wire.Query)
	if err := wire.ParseQuery(raw, q); err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.RecursionAvailable = true
	resp(r)
	out, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return &Entry{Remote: netip.MustParseAddrPort("[2001:db8::1]:5353"), Local: netip.MustParseAddr("169.254.20.10"),
		Q: q, Query: raw, Resp: out, Duration: 1500 * time.Microsecond}
}

func rr(t *testing.T, s string) dns.RR {
	t.Helper()
	x, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestFormats(t *testing.T) {
	e := entry(t, "WWW.Example.org.", dns.TypeA, true, func(r *dns.Msg) {
		r.Answer = append(r.Answer, rr(t, "www.example.org. 30 IN A 192.0.2.1"))
		r.SetEdns0(1232, true)
	})
	for _, tc := range []struct{ format, want string }{
		// The query's size without its OPT options (the cookie), the
		// answer's without OPT and uncompressed, as CoreDNS 1.15 logs.
		{DefaultFormat, `[2001:db8::1]:5353 - 4242 "A IN www.example.org. udp 44 true 1232" NOERROR qr,rd,ra 64 0.0015s`},
		{ExpandFormat("{combined}"), `[2001:db8::1]:5353 - 4242 "A IN www.example.org. udp 44 true 1232" NOERROR qr,rd,ra 64 0.0015s "0"`},
		{"{local} {/meta} {x} y} {", `169.254.20.10 - {x} y} {`},
		{"{{type}} {name}}", `{A} www.example.org.}`},
	} {
		got := string(parseFormat(tc.format).appendLine(nil, e))
		if got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.format, got, tc.want)
		}
	}
	e.TCP = true
	if got := string(parseFormat("{proto} {>bufsize}").appendLine(nil, e)); got != "tcp 65535" {
		t.Errorf("tcp: %s", got)
	}
	e = entry(t, "x.example.", 65280, false, func(r *dns.Msg) { r.Rcode = 15 })
	if got := string(parseFormat("{type} {class} {>bufsize} {size} {rcode}").appendLine(nil, e)); got != "TYPE65280 IN 512 27 15" {
		t.Errorf("unknown type and rcode: %s", got)
	}
}

func TestClassify(t *testing.T) {
	soa := "example.org. 60 IN SOA ns. h. 1 2 3 4 5"
	for _, tc := range []struct {
		name string
		set  func(r *dns.Msg)
		want Class
	}{
		{"answer", func(r *dns.Msg) { r.Answer = append(r.Answer, rr(t, "a.example.org. 1 IN A 192.0.2.1")) }, Success},
		{"empty NOERROR", func(r *dns.Msg) {}, Success},
		{"delegation", func(r *dns.Msg) { r.Ns = append(r.Ns, rr(t, "example.org. 1 IN NS ns.example.org.")) }, Success},
		{"NODATA", func(r *dns.Msg) { r.Ns = append(r.Ns, rr(t, soa)) }, Denial},
		{"NXDOMAIN", func(r *dns.Msg) { r.Rcode = dns.RcodeNameError; r.Ns = append(r.Ns, rr(t, soa)) }, Denial},
		{"NXDOMAIN without SOA", func(r *dns.Msg) { r.Rcode = dns.RcodeNameError }, Denial},
		{"NXDOMAIN with an answer", func(r *dns.Msg) {
			r.Rcode = dns.RcodeNameError
			r.Answer = append(r.Answer, rr(t, "a.example.org. 1 IN CNAME b.example.org."))
		}, Error},
		{"SERVFAIL", func(r *dns.Msg) { r.Rcode = dns.RcodeServerFailure }, Error},
		{"REFUSED", func(r *dns.Msg) { r.Rcode = dns.RcodeRefused }, Error},
	} {
		e := entry(t, "a.example.org.", dns.TypeA, false, tc.set)
		if got := Classify(e.Resp, time.Now()); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if Classify([]byte{1, 2, 3}, time.Now()) != Error {
		t.Error("garbage is not an error")
	}
}

// TestLog: a block's query is logged through the first rule whose scope
// holds it, when its class is logged (which block answers a name is
// internal/blocks' test).
func TestLog(t *testing.T) {
	var out bytes.Buffer
	sink := NewSink(&out)
	cluster := sink.Compile([]Rule{{Scope: "svc.cluster.local", Classes: Denial, Format: "denial {name}"}, {Scope: ".", Classes: All, Format: "all {name}"}})
	root := sink.Compile([]Rule{{Scope: ".", Classes: All, Format: "root {name}"}})
	other := sink.Compile([]Rule{{Scope: ".", Classes: Error, Format: "other {name}"}})
	scoped := sink.Compile([]Rule{{Scope: "example.org", Classes: All, Format: "scoped {name}"}})
	if cluster == nil || root == nil || other == nil || scoped == nil {
		t.Fatal("no log")
	}
	ok := func(r *dns.Msg) { r.Answer = append(r.Answer, rr(t, r.Question[0].Name+" 1 IN A 192.0.2.1")) }
	nx := func(r *dns.Msg) { r.Rcode = dns.RcodeNameError }
	for _, tc := range []struct {
		log  *Log
		name string
		resp func(*dns.Msg)
		want string
	}{
		{cluster, "web.default.svc.cluster.local.", nx, "denial web.default.svc.cluster.local."},
		{cluster, "web.default.svc.cluster.local.", ok, ""}, // the first scope decides
		{cluster, "node.cluster.local.", ok, "all node.cluster.local."},
		{nil, "www.example.org.", ok, ""}, // its block does not log
		{root, "www.example.com.", ok, "root www.example.com."},
		{scoped, "www.EXAMPLE.org.", ok, "scoped www.example.org."},
		{scoped, "notexample.org.", ok, ""}, // outside every scope
		{other, "www.example.com.", nx, ""},
		{other, "www.example.com.", func(r *dns.Msg) { r.Rcode = dns.RcodeServerFailure }, "other www.example.com."},
	} {
		out.Reset()
		e := entry(t, tc.name, dns.TypeA, false, tc.resp)
		tc.log.Log(e)
		want := ""
		if tc.want != "" {
			want = "[INFO] " + tc.want + "\n"
		}
		if out.String() != want {
			t.Errorf("%s: logged %q, want %q", tc.name, out.String(), want)
		}
	}
	if sink.Compile(nil) != nil {
		t.Error("a block without rules has a log")
	}
}

func TestParseClass(t *testing.T) {
	for _, s := range []string{"all", "success", "denial", "error"} {
		c, err := ParseClass(s)
		if err != nil || c.String() != s {
			t.Errorf("%s: %v %v", s, c, err)
		}
	}
	if _, err := ParseClass("frob"); err == nil || !strings.Contains(err.Error(), "frob") {
		t.Errorf("frob: %v", err)
	}
}

// BenchmarkLog: one logged query in the default format.
func BenchmarkLog(b *testing.B) {
	t := &testing.T{}
	e := entry(t, "www.example.org.", dns.TypeA, true, func(r *dns.Msg) {
		r.Answer = append(r.Answer, rr(t, "www.example.org. 30 IN A 192.0.2.1"))
	})
	l := NewSink(discard{}).Compile([]Rule{{Scope: ".", Classes: All, Format: DefaultFormat}})
	b.ReportAllocs()
	for b.Loop() {
		l.Log(e)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestMetadataLabels: with the block's metadata, {/log/type} and
// {/log/class} are the answer's response type and class; other labels,
// and every label without metadata, are "-".
func TestMetadataLabels(t *testing.T) {
	soa := "example.org. 60 IN SOA ns.example.org. h.example.org. 1 2 3 4 60"
	for _, tc := range []struct {
		resp func(r *dns.Msg)
		want string
	}{
		{func(r *dns.Msg) { r.Answer = append(r.Answer, rr(t, "www.example.org. 30 IN A 192.0.2.1")) }, "NOERROR success - -"},
		{func(r *dns.Msg) { r.Rcode = dns.RcodeNameError; r.Ns = append(r.Ns, rr(t, soa)) }, "NXDOMAIN denial - -"},
		{func(r *dns.Msg) { r.Ns = append(r.Ns, rr(t, soa)) }, "NODATA denial - -"},
		{func(r *dns.Msg) { r.Ns = append(r.Ns, rr(t, "example.org. 60 IN NS ns.example.org.")) }, "DELEGATION success - -"},
		{func(r *dns.Msg) { r.Rcode = dns.RcodeServerFailure }, "SERVERERROR error - -"},
		{func(r *dns.Msg) { r.Rcode = dns.RcodeRefused }, "OTHERERROR error - -"},
	} {
		e := entry(t, "www.example.org.", dns.TypeA, false, tc.resp)
		for _, meta := range []bool{true, false} {
			var out bytes.Buffer
			NewSink(&out).Compile([]Rule{{Scope: ".", Classes: All, Format: "{/log/type} {/log/class} {/forward/upstream} {/x/y}", Metadata: meta}}).Log(e)
			want := tc.want
			if !meta {
				want = "- - - -"
			}
			if got := strings.TrimSpace(strings.TrimPrefix(out.String(), "[INFO] ")); got != want {
				t.Errorf("metadata %v: %q, want %q", meta, got, want)
			}
		}
	}
}
