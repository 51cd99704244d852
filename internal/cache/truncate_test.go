package cache

import (
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// truncCase is an upstream answer for the truncation tables.
type truncCase struct {
	name     string
	qname    string
	qtype    uint16
	rcode    int
	ans, ns  []string
	extra    []string
	compress bool
}

func truncCases() []truncCase {
	var headless, aaaa, srv, srvExtra, txt []string
	for i := 0; i < 100; i++ {
		headless = append(headless, fmt.Sprintf("web.default.svc.cluster.local. 30 IN A 10.244.%d.%d", i/50, i%50+1))
	}
	for i := 0; i < 40; i++ {
		aaaa = append(aaaa, fmt.Sprintf("v6.example. 300 IN AAAA 2001:db8::%x", i+1))
	}
	for i := 0; i < 30; i++ {
		host := fmt.Sprintf("web-%d.web.default.svc.cluster.local.", i)
		srv = append(srv, "_http._tcp.web.default.svc.cluster.local. 30 IN SRV 0 3 80 "+host)
		srvExtra = append(srvExtra, host+fmt.Sprintf(" 30 IN A 10.244.0.%d", i+1))
	}
	for i := 0; i < 12; i++ {
		txt = append(txt, fmt.Sprintf("txt.example. 60 IN TXT %q %q", fmt.Sprintf("record %d", i), strings.Repeat("t", 100+10*i)))
	}
	chain := []string{
		"www.example. 300 IN CNAME a.cdn.example.",
		"a.cdn.example. 60 IN CNAME b.edge.example.",
		"b.edge.example. 20 IN CNAME c.edge.example.",
	}
	for i := 0; i < 60; i++ {
		chain = append(chain, fmt.Sprintf("c.edge.example. 20 IN A 198.51.100.%d", i+1))
	}
	var glue []string
	for i := 0; i < 13; i++ {
		glue = append(glue, fmt.Sprintf("%c.ns.example. 3600 IN A 192.0.2.%d", 'a'+i, i+1),
			fmt.Sprintf("%c.ns.example. 3600 IN AAAA 2001:db8::53:%d", 'a'+i, i+1))
	}
	var nsRRs []string
	for i := 0; i < 13; i++ {
		nsRRs = append(nsRRs, fmt.Sprintf("example. 3600 IN NS %c.ns.example.", 'a'+i))
	}
	soa := []string{"cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30"}
	return []truncCase{
		{"headless 100 A", "web.default.svc.cluster.local.", dns.TypeA, 0, headless, nil, nil, true},
		{"headless 100 A uncompressed", "web.default.svc.cluster.local.", dns.TypeA, 0, headless, nil, nil, false},
		{"40 AAAA", "v6.example.", dns.TypeAAAA, 0, aaaa, nil, nil, true},
		{"CNAME chain", "www.example.", dns.TypeA, 0, chain, nil, nil, true},
		{"SRV with additional", "_http._tcp.web.default.svc.cluster.local.", dns.TypeSRV, 0, srv, nil, srvExtra, true},
		{"SRV uncompressed", "_http._tcp.web.default.svc.cluster.local.", dns.TypeSRV, 0, srv, nil, srvExtra, false},
		{"answer, authority, additional", "www.example.", dns.TypeA, 0, []string{"www.example. 300 IN A 192.0.2.80"}, nsRRs, glue, true},
		{"large TXT", "txt.example.", dns.TypeTXT, 0, txt, nil, nil, true},
		{"NXDOMAIN", "nope.default.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil, soa, nil, true},
	}
}

func (tc truncCase) msg(t testing.TB) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(tc.qname, tc.qtype)
	m.Response, m.RecursionAvailable, m.RecursionDesired = true, true, true
	m.Rcode = tc.rcode
	for _, s := range tc.ans {
		m.Answer = append(m.Answer, mustRR(t, s))
	}
	for _, s := range tc.ns {
		m.Ns = append(m.Ns, mustRR(t, s))
	}
	for _, s := range tc.extra {
		m.Extra = append(m.Extra, mustRR(t, s))
	}
	m.Compress = tc.compress
	return m
}

// records lists a message's records in wire order, without the OPT.
func records(m *dns.Msg) []string {
	var out []string
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype != dns.TypeOPT {
				out = append(out, rr.String())
			}
		}
	}
	return out
}

// prefixLen packs the first k records of m in section order with name
// compression (Build stores answers compressed, however they came) and
// returns the length: miekg's packer as an independent oracle of where each
// record ends.
func prefixLen(t testing.TB, m *dns.Msg, k int) int {
	t.Helper()
	p := m.Copy()
	p.Compress = true
	all := append(append(append([]dns.RR{}, m.Answer...), m.Ns...), m.Extra...)
	na, nn := len(m.Answer), len(m.Ns)
	keep := all[:k]
	p.Answer = keep[:min(k, na)]
	p.Ns = keep[min(k, na):min(k, na+nn)]
	p.Extra = keep[min(k, na+nn):]
	b, err := p.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// TestTruncationKeepsWholeRecordsThatFit writes every table answer at
// every client size from 512 bytes to past its full length, with and
// without EDNS, and checks the cut: the answer re-parses, is no larger than
// the size, carries exactly the first records (answer, then authority, then
// additional) that fit whole, sets TC exactly when a record was left out,
// and keeps the client's OPT. Compressed or not as the upstream sent it
// (kube-dns sends its TCP answers uncompressed), it must equal miekg/dns's
// Msg.Truncate on the same records re-packed with compression, which the
// stock node-local-dns (CoreDNS) does.
func TestTruncationKeepsWholeRecordsThatFit(t *testing.T) {
	for _, tc := range truncCases() {
		t.Run(tc.name, func(t *testing.T) {
			up := tc.msg(t)
			resp, err := up.Pack()
			if err != nil {
				t.Fatal(err)
			}
			_, q := query(t, tc.qname, tc.qtype, 0, false)
			e, err := Build(resp, q, externalP, 0, t0)
			if err != nil {
				t.Fatal(err)
			}
			// ends[k] is the length of the message with its first k records.
			ends := make([]int, len(records(up))+1)
			for k := range ends {
				ends[k] = prefixLen(t, up, k)
			}
			for _, edns := range []int{0, 4096} {
				_, q := query(t, tc.qname, tc.qtype, edns, false)
				full := unpack(t, e.Write(nil, q, t0, 0xFFFF, 1232))
				all := records(full)
				if len(all) != len(ends)-1 || full.Truncated {
					t.Fatalf("full answer: tc=%v %d of %d records", full.Truncated, len(all), len(ends)-1)
				}
				optLen := 0
				if edns > 0 {
					optLen = wire.OPTLen
				}
				fullLen := ends[len(all)] + optLen
				for size := 512; size <= fullLen+20; size++ {
					b := e.Write(nil, q, t0, size, 1232)
					if len(b) > size {
						t.Fatalf("edns %d size %d: %d bytes", edns, size, len(b))
					}
					got := unpack(t, b)
					kept := records(got)
					// Expected: the longest prefix whose packing fits.
					want := 0
					for want < len(all) && ends[want+1]+optLen <= size {
						want++
					}
					if len(kept) != want {
						t.Fatalf("edns %d size %d: kept %d records, %d fit", edns, size, len(kept), want)
					}
					for i := range kept {
						if kept[i] != all[i] {
							t.Fatalf("edns %d size %d: record %d is %q, want %q", edns, size, i, kept[i], all[i])
						}
					}
					if got.Truncated != (want < len(all)) {
						t.Fatalf("edns %d size %d: tc=%v with %d of %d records", edns, size, got.Truncated, want, len(all))
					}
					if (got.IsEdns0() != nil) != (edns > 0) {
						t.Fatalf("edns %d size %d: OPT %v", edns, size, got.IsEdns0())
					}
					if got.Rcode != tc.rcode || len(got.Question) != 1 || got.Question[0].Name != tc.qname {
						t.Fatalf("edns %d size %d: rcode %d question %v", edns, size, got.Rcode, got.Question)
					}
					// The oracle CoreDNS uses: miekg's Truncate on the whole answer.
					ref := full.Copy()
					ref.Truncate(size)
					if ref.Truncated != got.Truncated || len(ref.Answer) != len(got.Answer) ||
						len(ref.Ns) != len(got.Ns) || len(ref.Extra) != len(got.Extra) {
						t.Fatalf("edns %d size %d: ours tc=%v %d/%d/%d, miekg Truncate tc=%v %d/%d/%d", edns, size,
							got.Truncated, len(got.Answer), len(got.Ns), len(got.Extra),
							ref.Truncated, len(ref.Answer), len(ref.Ns), len(ref.Extra))
					}
				}
			}
		})
	}
}

// TestTruncationStaleAndCaseKeepCut checks the stale writer cuts the same
// way and that a mixed-case client gets its case in the kept records.
func TestTruncationStaleAndCaseKeepCut(t *testing.T) {
	var ans []string
	for i := 0; i < 100; i++ {
		ans = append(ans, fmt.Sprintf("web.default.svc.cluster.local. 30 IN A 10.244.0.%d", i+1))
	}
	_, q := query(t, "web.default.svc.cluster.local.", dns.TypeA, 0, false)
	resp := answer(t, "web.default.svc.cluster.local.", dns.TypeA, 0, ans, nil, false)
	e, err := Build(resp, q, clusterP, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	_, cq := query(t, "WEB.Default.svc.cluster.local.", dns.TypeA, 0, false)
	fresh := unpack(t, e.Write(nil, cq, t0, 512, 1232))
	stale := unpack(t, e.WriteStale(nil, cq, 512, 1232))
	// 512 - 12 header - 35 question = 465 bytes: one record with the name
	// compressed to a pointer is 16 bytes, so 29 fit (musl gets 29 of 100
	// from kube-dns too).
	if len(fresh.Answer) != 29 || !fresh.Truncated || len(stale.Answer) != 29 || !stale.Truncated {
		t.Fatalf("fresh tc=%v %d records, stale tc=%v %d records", fresh.Truncated, len(fresh.Answer), stale.Truncated, len(stale.Answer))
	}
	for i, rr := range stale.Answer {
		if rr.Header().Ttl != StaleTTL || fresh.Answer[i].Header().Ttl != 30 {
			t.Fatalf("record %d: stale ttl %d fresh ttl %d", i, rr.Header().Ttl, fresh.Answer[i].Header().Ttl)
		}
	}
	if fresh.Question[0].Name != "WEB.Default.svc.cluster.local." {
		t.Fatalf("question %q", fresh.Question[0].Name)
	}
	// A size under 512 is read as 512 (RFC 6891 §6.2.5).
	if small := unpack(t, e.Write(nil, cq, t0, 100, 1232)); len(small.Answer) != 29 {
		t.Fatalf("size 100: %d records", len(small.Answer))
	}
}

// TestUncompressedAnswerStoredCompressed is kube-dns's TCP answer for a
// headless Service (every name written out in full): it is stored with
// names compressed, as small as miekg/dns packs it with compression, and a
// client at 512 (no EDNS), 1232 and 4096 bytes gets as many records, and
// TC exactly when, the stock node-local-dns does (miekg/dns's Truncate of a
// compressed re-pack). Before, the 40 records at 1232 came truncated to 26
// and the 100 records at 512 to 9. Every owner name shows the client's case.
func TestUncompressedAnswerStoredCompressed(t *testing.T) {
	const name = "web.default.svc.cluster.local."
	for _, n := range []int{40, 100} {
		var ans []string
		for i := range n {
			ans = append(ans, fmt.Sprintf("%s 30 IN A 10.244.%d.%d", name, i/200, i%200+1))
		}
		up := truncCase{qname: name, qtype: dns.TypeA, ans: ans}.msg(t)
		up.Compress = false
		resp, err := up.Pack()
		if err != nil {
			t.Fatal(err)
		}
		up.Compress = true
		packed, err := up.Pack()
		if err != nil {
			t.Fatal(err)
		}
		_, q := query(t, name, dns.TypeA, 0, false)
		e, err := Build(resp, q, clusterP, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.msg) != len(packed) || len(e.msg) >= len(resp) {
			t.Fatalf("%d records: stored %d bytes, upstream sent %d, miekg compressed %d", n, len(e.msg), len(resp), len(packed))
		}
		for _, size := range []int{512, 1232, 4096} {
			edns := size
			if size == 512 {
				edns = 0
			}
			_, cq := query(t, "WEB.Default.svc.cluster.local.", dns.TypeA, edns, false)
			got := unpack(t, e.Write(nil, cq, t0, size, 1232))
			ref := unpack(t, packed)
			ref.Id = cq.ID
			if edns > 0 {
				ref.SetEdns0(uint16(edns), false)
			}
			ref.Truncate(size)
			if got.Truncated != ref.Truncated || len(got.Answer) != len(ref.Answer) {
				t.Errorf("%d records at %d bytes: ours tc=%v %d records, stock tc=%v %d records",
					n, size, got.Truncated, len(got.Answer), ref.Truncated, len(ref.Answer))
			}
			for i, rr := range got.Answer {
				if rr.Header().Name != "WEB.Default.svc.cluster.local." {
					t.Fatalf("record %d owner %q", i, rr.Header().Name)
				}
			}
			t.Logf("%d records at %d bytes: tc=%v %d records", n, size, got.Truncated, len(got.Answer))
		}
	}
}
