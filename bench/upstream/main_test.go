package main

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

var testPolicy = Policy{
	Zone: "cluster.local.", ClusterTTL: 30, ExternalTTL: 300, ClusterNeg: 30, ExternalNeg: 60,
	Stats: func() string { return "udp=1 tcp=2 tcp_conns=3" },
}

func query(t *testing.T, id uint16, name string, qtype dnsmessage.Type, edns bool) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	if edns {
		if err := b.StartAdditionals(); err != nil {
			t.Fatal(err)
		}
		var h dnsmessage.ResourceHeader
		if err := h.SetEDNS0(4096, dnsmessage.RCodeSuccess, true); err != nil {
			t.Fatal(err)
		}
		if err := b.OPTResource(h, dnsmessage.OPTResource{}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAnswer(t *testing.T) {
	tests := []struct {
		name    string
		qname   string
		qtype   dnsmessage.Type
		edns    bool
		rcode   dnsmessage.RCode
		answers int
		ttl     uint32 // of the answer, or of the SOA when there is none
		soa     string // owner of the SOA in authority, "" for none
	}{
		{"cluster A", "kubernetes.default.svc.cluster.local.", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, 1, 30, ""},
		{"external A", "www.example.com.", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, 1, 300, ""},
		{"case kept", "WwW.ExAmple.COM.", dnsmessage.TypeAAAA, true, dnsmessage.RCodeSuccess, 1, 300, ""},
		{"cluster NXDOMAIN", "nxdomain.default.svc.cluster.local.", dnsmessage.TypeA, true, dnsmessage.RCodeNameError, 0, 30, "cluster.local."},
		{"external NXDOMAIN", "nx1.example.org.", dnsmessage.TypeA, false, dnsmessage.RCodeNameError, 0, 60, "example.org."},
		{"NODATA", "svc.cluster.local.", dnsmessage.TypeMX, false, dnsmessage.RCodeSuccess, 0, 30, "cluster.local."},
		{"root", ".", dnsmessage.TypeNS, false, dnsmessage.RCodeSuccess, 0, 60, "."},
		{"stats", "_stats.upstream.bench.", dnsmessage.TypeTXT, false, dnsmessage.RCodeSuccess, 1, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query(t, 0x1234, tt.qname, tt.qtype, tt.edns)
			resp := Answer(nil, q, testPolicy)
			var p dnsmessage.Parser
			h, err := p.Start(resp)
			if err != nil {
				t.Fatalf("unpack: %v", err)
			}
			if h.ID != 0x1234 || !h.Response || !h.Authoritative || !h.RecursionDesired || h.RCode != tt.rcode {
				t.Fatalf("header %+v, want id 0x1234, response, aa, rd, rcode %v", h, tt.rcode)
			}
			qs, err := p.AllQuestions()
			if err != nil || len(qs) != 1 || qs[0].Name.String() != tt.qname || qs[0].Type != tt.qtype {
				t.Fatalf("question %v (%v), want %s %v", qs, err, tt.qname, tt.qtype)
			}
			as, err := p.AllAnswers()
			if err != nil || len(as) != tt.answers {
				t.Fatalf("answers %v (%v), want %d", as, err, tt.answers)
			}
			if len(as) == 1 && (as[0].Header.TTL != tt.ttl || as[0].Header.Name.String() != tt.qname) {
				t.Errorf("answer %v, want TTL %d for %s", as[0].Header, tt.ttl, tt.qname)
			}
			if len(as) == 1 && tt.qtype == dnsmessage.TypeTXT {
				if txt := as[0].Body.(*dnsmessage.TXTResource).TXT; len(txt) != 1 || txt[0] != "udp=1 tcp=2 tcp_conns=3" {
					t.Errorf("stats TXT %q", txt)
				}
			}
			ns, err := p.AllAuthorities()
			if err != nil {
				t.Fatal(err)
			}
			if tt.soa == "" && len(ns) != 0 || tt.soa != "" && len(ns) != 1 {
				t.Fatalf("authority %v, want SOA %q", ns, tt.soa)
			}
			if tt.soa != "" {
				soa, ok := ns[0].Body.(*dnsmessage.SOAResource)
				if !ok || ns[0].Header.Name.String() != tt.soa || ns[0].Header.TTL != tt.ttl || soa.MinTTL != tt.ttl {
					t.Errorf("SOA %v %v, want owner %s TTL/minimum %d", ns[0].Header, ns[0].Body, tt.soa, tt.ttl)
				}
			}
			ad, err := p.AllAdditionals()
			if err != nil {
				t.Fatal(err)
			}
			if tt.edns != (len(ad) == 1) {
				t.Fatalf("additional %v, want OPT: %v", ad, tt.edns)
			}
			if tt.edns && (ad[0].Header.Type != dnsmessage.TypeOPT || !ad[0].Header.DNSSECAllowed() || ad[0].Header.Class != ednsSize) {
				t.Errorf("OPT %v, want DO echoed and size %d", ad[0].Header, ednsSize)
			}
		})
	}
}

func TestAnswerDrops(t *testing.T) {
	q := query(t, 1, "a.example.", dnsmessage.TypeA, false)
	if Answer(nil, q[:5], testPolicy) != nil {
		t.Error("answered a short packet")
	}
	resp := Answer(nil, q, testPolicy)
	if Answer(nil, resp, testPolicy) != nil {
		t.Error("answered a response")
	}
	bad := append([]byte(nil), q...)
	bad[12] = 60 // label runs past the end
	if r := Answer(nil, bad, testPolicy); r == nil || r[3]&0x0f != rcodeFormErr {
		t.Errorf("malformed question: %v, want FORMERR", r)
	}
}

// TestTCPPipelined sends queries back to back on one connection and expects
// every answer, matched by ID, even when jitter reorders them.
func TestTCPPipelined(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := testPolicy
	p.Jitter = 5 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	var wg sync.WaitGroup
	if err := serve(ctx, &wg, addr, p, new(Counters), 1, time.Second); err != nil {
		t.Fatal(err)
	}
	defer wg.Wait()
	defer cancel()

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const n = 50
	var out []byte
	for i := range n {
		q := query(t, uint16(i), "svc.cluster.local.", dnsmessage.TypeA, false)
		out = binary.BigEndian.AppendUint16(out, uint16(len(q)))
		out = append(out, q...)
	}
	if _, err := conn.Write(out); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	seen := map[uint16]bool{}
	for range n {
		var l [2]byte
		if _, err := io.ReadFull(conn, l[:]); err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		m := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(conn, m); err != nil {
			t.Fatal(err)
		}
		seen[binary.BigEndian.Uint16(m)] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct answers, want %d", len(seen), n)
	}
}
