package statedir

import (
	"bytes"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/netsetup"
)

// TestOwnershipRecordCorrupt: twins hand over what they added to the link
// in ownership.json. A record that does not decode is an error everywhere:
// recording refuses to overwrite it (what an earlier twin created would be
// lost without a word), and the last instance removes only what it added
// itself, logging one error line that says what may be left.
func TestOwnershipRecordCorrupt(t *testing.T) {
	addr := netip.MustParseAddr("169.254.20.10")
	r, err := Open(t.TempDir(), "1-2", []netip.Addr{addr}, 53)
	if err != nil {
		t.Skip(err) // no network namespace inode to read
	}
	// A good record is merged and read back.
	created := netsetup.Ownership{LinkCreated: true, Addrs: []netip.Addr{addr}}
	if err := r.RecordOwnership(created); err != nil {
		t.Fatal(err)
	}
	if err := r.RecordOwnership(netsetup.Ownership{}); err != nil {
		t.Fatal(err)
	}
	if o, err := r.readOwnership(); err != nil || !o.LinkCreated || len(o.Addrs) != 1 {
		t.Fatalf("recorded %+v, %v; want the link and address", o, err)
	}

	corrupt := []byte(`{"link_created": tru`)
	if err := os.WriteFile(r.ownershipPath(), corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := r.readOwnership(); err == nil || !strings.Contains(err.Error(), "ownership.json") {
		t.Fatalf("corrupt record read as %+v, %v; want an error naming the file", o, err)
	}
	if err := r.RecordOwnership(netsetup.Ownership{Addrs: []netip.Addr{addr}}); err == nil {
		t.Fatal("a corrupt record was overwritten without an error")
	}
	if b, _ := os.ReadFile(r.ownershipPath()); string(b) != string(corrupt) {
		t.Fatalf("the corrupt record was changed to %q", b)
	}
	logs := &logBuffer{}
	o := r.InheritedOwnership(slog.New(slog.NewTextHandler(logs, nil)))
	if o.LinkCreated || len(o.Addrs) != 0 {
		t.Errorf("inherited %+v from a corrupt record; want nothing (remove only our own)", o)
	}
	if l := logs.String(); strings.Count(l, "\n") != 1 || !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "ownership.json") {
		t.Errorf("log %q: want one error line naming the file", l)
	}

	// No record at all is not an error.
	r.ForgetOwnership()
	logs = &logBuffer{}
	if o := r.InheritedOwnership(slog.New(slog.NewTextHandler(logs, nil))); o.LinkCreated || logs.String() != "" {
		t.Errorf("no record: inherited %+v, logged %q", o, logs)
	}
}

// logBuffer is a log destination safe for concurrent writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
