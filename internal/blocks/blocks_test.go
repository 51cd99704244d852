package blocks

import (
	"bytes"
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/cache"
	"github.com/nodelocaldns/nodelocaldns/internal/clock"
	"github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	"github.com/nodelocaldns/nodelocaldns/internal/forward"
	"github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	"github.com/nodelocaldns/nodelocaldns/internal/resolve"
	"github.com/nodelocaldns/nodelocaldns/internal/whoami"
	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func wireName(t testing.TB, s string) []byte {
	t.Helper()
	w, ok := wire.AppendNameWire(nil, s)
	if !ok {
		t.Fatalf("bad name %q", s)
	}
	return w
}

// The longest zone holding a name decides, whatever the order given; the
// match is case-insensitive and on label boundaries; a name in no zone
// gets the default; each block the resolver sees (View.Block) is the
// block's own, and fetches through it.
func TestLookupLongestZone(t *testing.T) {
	ttl := func(z string) resolve.Policy {
		return resolve.Policy{TTL: cache.Policy{SuccessMax: time.Duration(len(z)) * time.Second}}
	}
	v, err := Compile([]string{"example.", "corp.example.", "corp.example.", "in-addr.arpa."}, Block{Block: resolve.Block{Policy: ttl("")}}, nopForwarder{},
		func(z string) (Block, error) {
			return Block{Block: resolve.Block{Policy: ttl(z)}, Route: Route{Refused: z == "in-addr.arpa."}}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Zones(); !slices.Equal(got, []string{"corp.example.", "in-addr.arpa.", "example."}) {
		t.Fatalf("zones %v", got)
	}
	for name, want := range map[string]string{
		"a.B.Corp.Example.":      "corp.example.",
		"corp.example.":          "corp.example.",
		"xcorp.example.":         "example.",
		"example.":               "example.",
		"1.0.0.10.in-addr.arpa.": "in-addr.arpa.",
		"example.org.":           "",
		".":                      "",
	} {
		b := v.Lookup(wireName(t, name))
		if b.Zone != want {
			t.Errorf("%s: block %q, want %q", name, b.Zone, want)
		}
		if rb := v.Block(wireName(t, name)); rb != &b.Block || rb.Fetcher != b || rb.Policy.TTL.SuccessMax != time.Duration(len(want))*time.Second {
			t.Errorf("%s: block %+v is not its block's, or does not fetch through it", name, rb)
		}
	}
	if !v.Lookup(wireName(t, "4.3.2.1.in-addr.arpa.")).Refused {
		t.Error("in-addr.arpa. not refused")
	}
}

func TestRootZoneHoldsEverything(t *testing.T) {
	v, err := Compile([]string{".", "cluster.local."}, Block{}, nil, func(z string) (Block, error) { return Block{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if b := v.Lookup(wireName(t, "example.org.")); b.Zone != "." {
		t.Fatalf("example.org.: %q", b.Zone)
	}
	if b := v.Lookup(wireName(t, "a.cluster.local.")); b.Zone != "cluster.local." {
		t.Fatalf("a.cluster.local.: %q", b.Zone)
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	v, err := Compile([]string{"cluster.local.", "in-addr.arpa.", "ip6.arpa.", "."}, Block{}, nil, func(string) (Block, error) { return Block{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	name := wireName(t, "my-svc.my-ns.svc.cluster.local.")
	if n := testing.AllocsPerRun(100, func() { v.Lookup(name) }); n != 0 {
		t.Fatalf("%v allocations per lookup", n)
	}
}

// A compiled view decides everything per name: the shared route table's
// group of the longest route zone (the last of a zone listed twice), the
// view's own group or refusal before it, and the CoreDNS metric zone (the
// first of a zone listed twice, the last root; -1 outside every one;
// "dropped" for a refused zone).
func TestCompileViewDecidesGroupAndMetric(t *testing.T) {
	node, kube, stub, stub2, own := &forward.Group{}, &forward.Group{}, &forward.Group{}, &forward.Group{}, &forward.Group{}
	pol := resolve.Policy{}
	v, err := CompileView(Sources{
		Default: pol, Policy: func([]byte) *resolve.Policy { return &pol },
		Shared: []forward.Route{{Zone: ".", Group: node}, {Zone: "cluster.local.", Group: kube},
			{Zone: "stub.example.", Group: stub}, {Zone: "stub.example.", Group: stub2}},
		Own:     &Routes{Zones: []string{"corp.example.", "secret.example."}, Groups: map[string]*forward.Group{"corp.example.": own}, Refused: map[string]bool{"secret.example.": true}},
		Metrics: []string{"cluster.local.", ".", "svc.cluster.local.", "cluster.local.", "."},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		g       *forward.Group
		refused bool
		metric  int
	}{
		"a.svc.cluster.local.": {kube, false, 2},
		"x.cluster.local.":     {kube, false, 0},
		"www.example.org.":     {node, false, 4},
		"a.stub.example.":      {stub2, false, 4},
		"a.corp.example.":      {own, false, 4},
		"a.secret.example.":    {node, true, resolve.MetricDropped}, // refused: CoreDNS counts it as dropped
	} {
		b := v.Lookup(wireName(t, name))
		if b.Group != want.g || b.Refused != want.refused || b.Metric != want.metric {
			t.Errorf("%s: group %p refused %v metric %d, want %p %v %d", name, b.Group, b.Refused, b.Metric, want.g, want.refused, want.metric)
		}
	}
	none, err := CompileView(Sources{Default: pol, Policy: func([]byte) *resolve.Policy { return &pol }, Metrics: []string{"cluster.local."}})
	if err != nil {
		t.Fatal(err)
	}
	if b := none.Lookup(wireName(t, "example.org.")); b.Metric != -1 || b.Group != nil {
		t.Errorf("a name in no zone: metric %d group %p", b.Metric, b.Group)
	}
}

// What a block does to its answers (its answer-side handlers) is the
// block's: the longest zone of the blocks the view sees decides, one view
// differs from another, and a block without handlers has none (the
// server then runs nothing). The lines are those of the block's own
// rules.
func TestCompileViewAnswers(t *testing.T) {
	var out bytes.Buffer
	sink := dnslog.NewSink(&out)
	pol := resolve.Policy{}
	logs := func(format string, classes dnslog.Class) *answer.Chain {
		return answer.NewChain([]string{"log"}, []answer.Handler{dnslog.Handler{Log: sink.Compile([]dnslog.Rule{{Scope: ".", Classes: classes, Format: format}})}})
	}
	shuffle := answer.NewChain([]string{"loadbalance"}, []answer.Handler{loadbalance.Handler{}})
	src := func(a []Answers) Sources {
		return Sources{Default: pol, Policy: func([]byte) *resolve.Policy { return &pol }, Answers: a,
			Shared: []forward.Route{{Zone: "cluster.local.", Group: &forward.Group{}}}}
	}
	one, err := CompileView(src([]Answers{
		{Zone: "cluster.local.", Chain: logs("cluster {name}", dnslog.All)},
		{Zone: "example.org.", Chain: shuffle},
		{Zone: "sub.example.org."},
		{Zone: ".", Chain: logs("root {name}", dnslog.All)},
	}))
	if err != nil {
		t.Fatal(err)
	}
	other, err := CompileView(src([]Answers{{Zone: ".", Chain: logs("other {name}", dnslog.Error)}}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v       *View
		name    string
		log     string // the line of a SERVFAIL answer; "": none
		shuffle bool
	}{
		{one, "a.svc.cluster.local.", "cluster a.svc.cluster.local.", false},
		{one, "www.example.org.", "", true},
		{one, "www.sub.example.org.", "", false},
		{one, "www.example.net.", "root www.example.net.", false},
		{one, "notexample.org.", "root notexample.org.", false},
		{other, "www.example.org.", "other www.example.org.", false},
		{other, "a.svc.cluster.local.", "other a.svc.cluster.local.", false},
	} {
		b := tc.v.Lookup(wireName(t, tc.name))
		if got := slices.Contains(b.Answer.Names(), "loadbalance"); got != tc.shuffle {
			t.Errorf("%s: shuffle %v", tc.name, got)
		}
		m := new(dns.Msg)
		m.SetQuestion(tc.name, dns.TypeA)
		raw, _ := m.Pack()
		m.Rcode = dns.RcodeServerFailure
		m.Response = true
		resp, _ := m.Pack()
		q := new(wire.Query)
		if err := wire.ParseQuery(raw, q); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		if slices.Contains(b.Answer.Names(), "log") {
			b.Answer.Answer(&answer.Request{Q: q, Raw: raw, Clock: clock.Real}, resp, 0, b.Answer.Len())
		}
		want := ""
		if tc.log != "" {
			want = "[INFO] " + tc.log + "\n"
		}
		if out.String() != want {
			t.Errorf("%s: logged %q, want %q", tc.name, out.String(), want)
		}
	}
	none, err := CompileView(src([]Answers{{Zone: "."}}))
	if err != nil {
		t.Fatal(err)
	}
	if b := none.Lookup(wireName(t, "example.org.")); b.Answer != nil {
		t.Errorf("a view whose blocks do nothing: %v", b.Answer.Names())
	}
	who := answer.NewChain([]string{"whoami"}, []answer.Handler{whoami.Handler{}})
	v, err := CompileView(src([]Answers{{Zone: "who.example.", Chain: who}, {Zone: "."}}))
	if err != nil {
		t.Fatal(err)
	}
	if v.Lookup(wireName(t, "a.Who.example.")).Answer != who || v.Lookup(wireName(t, "example.")).Answer != nil {
		t.Error("whoami is not the who.example. block's alone")
	}
}

// nopForwarder fetches nothing.
type nopForwarder struct{}

func (nopForwarder) Start(*Block, []byte, []byte, netip.AddrPort, time.Duration, resolve.FetchDone) bool {
	return false
}

func (nopForwarder) Fetch(context.Context, *Block, string, []byte) ([]byte, error) { return nil, nil }
