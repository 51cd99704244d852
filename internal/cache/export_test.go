package cache

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

func exportEntry(t *testing.T, name string, ttl uint32, now int64, pol Policy) *Entry {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	qb, _ := m.Pack()
	var q wire.Query
	if err := wire.ParseQuery(qb, &q); err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	rr, _ := dns.NewRR(fmt.Sprintf("%s %d IN A 192.0.2.1", name, ttl))
	r.Answer = append(r.Answer, rr)
	b, _ := r.Pack()
	e, err := BuildStale(b, &q, pol, time.Second, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestExportImport: a handed-over cache answers every question the old one
// did, with the same bytes and remaining lifetimes; entries whose policy
// changed or that expired are dropped and counted.
func TestExportImport(t *testing.T) {
	now := time.Now().UnixNano()
	pol := Policy{SuccessMax: time.Hour, DenialMax: time.Hour}
	old := New(Config{})
	for i := range 1000 {
		if !old.Put(exportEntry(t, fmt.Sprintf("n%d.example.", i), 300, now-int64(i)*int64(time.Millisecond), pol)) {
			t.Fatal("put")
		}
	}
	// One whose stale window is over by the time it is imported.
	old.Put(exportEntry(t, "gone.example.", 1, now-int64(2*time.Hour), pol))
	changed := "n7.example."
	fpOld := func(name []byte, view uint8) (uint64, uint16) { return 1, 0 }
	fpNew := func(name []byte, view uint8) (uint64, uint16) {
		if wire.NameString(name) == changed {
			return 2, 0 // its block's policy changed
		}
		return 1, 0
	}
	var stream bytes.Buffer
	n, err := old.Export(&stream, now, fpOld, 64<<20)
	if err != nil || n != 1000 {
		t.Fatalf("exported %d, %v; want 1000 (the expired one left out)", n, err)
	}
	later := now + int64(time.Second)
	nw := New(Config{})
	st, err := nw.Import(bytes.NewReader(stream.Bytes()), later, fpNew)
	if err != nil {
		t.Fatal(err)
	}
	if st.Kept != 999 || st.Changed != 1 || st.Expired != 0 || st.Rejected != 0 {
		t.Fatalf("import %+v", st)
	}
	for i := range 1000 {
		name := fmt.Sprintf("N%d.Example.", i)
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		qb, _ := m.Pack()
		var q wire.Query
		_ = wire.ParseQuery(qb, &q)
		a, _ := old.Get(&q, later)
		b, _ := nw.Get(&q, later)
		if fmt.Sprintf("n%d.example.", i) == changed {
			if b != nil {
				t.Fatal("the entry whose policy changed was kept")
			}
			continue
		}
		if a == nil || b == nil {
			t.Fatalf("%s: old %v new %v", name, a != nil, b != nil)
		}
		wa := a.Write(nil, &q, later, 4096, 1232)
		wb := b.Write(nil, &q, later, 4096, 1232)
		if !bytes.Equal(wa, wb) {
			t.Fatalf("%s: answers differ\nold %x\nnew %x", name, wa, wb)
		}
	}
	// A stream cut by maxBytes is still a stream.
	var small bytes.Buffer
	if n, err := old.Export(&small, now, fpOld, 4096); err != nil || n == 0 || n >= 1000 || small.Len() > 4096+4 {
		t.Fatalf("bounded export: %d entries, %d bytes, %v", n, small.Len(), err)
	}
	if st, err := New(Config{}).Import(&small, later, fpOld); err != nil || st.Kept == 0 {
		t.Fatalf("bounded import: %+v %v", st, err)
	}
}

// TestImportRefusesOtherVersionsAndGarbage: another layout is refused
// whole; an entry cut short is dropped and counted, a stream cut short
// ends the import with an error; nothing panics.
func TestImportRefusesOtherVersionsAndGarbage(t *testing.T) {
	fp := func([]byte, uint8) (uint64, uint16) { return 0, 0 }
	if _, err := New(Config{}).Import(bytes.NewReader([]byte{0, 0, 0, 99, 0, 0, 0, 0}), 0, fp); !errors.Is(err, ErrExportVersion) {
		t.Fatalf("another version: %v", err)
	}
	now := time.Now().UnixNano()
	e := exportEntry(t, "a.example.", 300, now, Policy{SuccessMax: time.Hour})
	rec := appendEntry(nil, e, 0)
	for cut := 5; cut < len(rec); cut += 3 {
		bad := append([]byte(nil), rec[:cut]...)
		bad[0], bad[1], bad[2], bad[3] = 0, 0, byte((cut-4)>>8), byte(cut-4)
		stream := append([]byte{0, 0, 0, byte(ExportVersion)}, bad...)
		stream = append(stream, 0, 0, 0, 0)
		if st, err := New(Config{}).Import(bytes.NewReader(stream), now, fp); err != nil || st.Kept != 0 || st.Invalid != 1 {
			t.Fatalf("an entry cut at %d bytes: %+v %v", cut, st, err)
		}
		if _, err := New(Config{}).Import(bytes.NewReader(stream[:len(stream)-5]), now, fp); err == nil {
			t.Fatalf("a stream cut inside an entry of %d bytes was read", cut)
		}
	}
}

// TestExportCoversEntry: Entry has the fields the export layout was
// written for; a new field must be exported (or said to be the shard's)
// and ExportVersion changed.
func TestExportCoversEntry(t *testing.T) {
	// 27 exported, and ede, which no cached entry has (BuildFetched), and
	// the shard's own and clients (owner.go: an imported entry is the
	// importer's to count; it is nobody's until its clients hit it).
	if n := reflect.TypeOf(Entry{}).NumField(); n != 30 {
		t.Fatalf("Entry has %d fields, the export layout (export.go, version %d) was written for 27, ede, own and clients: export the new one and change ExportVersion", n, ExportVersion)
	}
}
