package dnstap

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// Moved from internal/corefile with the directive's reading.
// TestDnstapForms: every form CoreDNS 1.13 (the stock's) and 1.15 read.
func TestDnstapForms(t *testing.T) {
	srv, err := loadCorefile(t, ".:53 {\ndnstap /tmp/a.sock\ndnstap unix:///tmp/b.sock full\ndnstap tcp://127.0.0.1:6000 full 8 2 {\n identity node-a\n version v9\n extra hello\n}\ndnstap tls://collector.example:6000 {\n skipverify\n}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	d := srv[0].Config("dnstap").([]Config)
	if len(d) != 4 {
		t.Fatalf("got %d taps", len(d))
	}
	want := []Config{
		{Network: "unix", Address: "/tmp/a.sock", WriteBufferMiB: 1, QueueMultiple: 1, Identity: Hostname(), Version: DefaultVersion()},
		{Network: "unix", Address: "/tmp/b.sock", Full: true, WriteBufferMiB: 1, QueueMultiple: 1, Identity: Hostname(), Version: DefaultVersion()},
		{Network: "tcp", Address: "127.0.0.1:6000", Full: true, WriteBufferMiB: 8, QueueMultiple: 2, Identity: "node-a", Version: "v9", Extra: "hello"},
		{Network: "tls", Address: "collector.example:6000", WriteBufferMiB: 1, QueueMultiple: 1, Identity: Hostname(), Version: DefaultVersion(), SkipVerify: true},
	}
	for i := range want {
		if d[i] != want[i] {
			t.Errorf("tap %d: got %+v, want %+v", i, d[i], want[i])
		}
	}
}

// loadCorefile reads Corefile text as the daemon does (corefile.Load): the
// directive is read by this package (corefile.Register).
func loadCorefile(t *testing.T, text string) ([]*corefile.Server, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return corefile.Load(path, nil, corefile.Options{})
}
