package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dnstap's bounds: a queue longer than dnstap.MaxQueueLen is cut to it,
// said in the mapping; more than dnstap.MaxTaps distinct directives are
// refused in one line.
func TestDnstapBounds(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	write := func(text string) {
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".:53 {\n  bind 169.254.25.10\n  dnstap tcp://127.0.0.1:6000 full 1 4096\n  forward . 10.0.0.1\n}\n")
	c, err := Parse(base(t, dir, "-localip", "169.254.25.10", "-conf", conf), stockEnv(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if m := strings.Join(c.DropIn.Corefile.Mapping, "\n"); !strings.Contains(m, "a queue of 20000 messages (QUEUE asks for 40960000: at most 20000 here") {
		t.Errorf("mapping does not say the queue is cut:\n%s", m)
	}
	var b strings.Builder
	b.WriteString(".:53 {\n  bind 169.254.25.10\n")
	for i := range 17 {
		fmt.Fprintf(&b, "  dnstap tcp://127.0.0.1:%d\n", 6000+i)
	}
	b.WriteString("  forward . 10.0.0.1\n}\n")
	write(b.String())
	if _, err := Parse(base(t, dir, "-localip", "169.254.25.10", "-conf", conf), stockEnv(), io.Discard); err == nil || !strings.Contains(err.Error(), "more than 16 distinct dnstap directives") {
		t.Errorf("17 dnstap directives: %v", err)
	}
}
