package running

import (
	"bytes"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/wire"
)

// The fetch side gets names as wire.NameString writes them (escapes for
// dots, spaces and bytes outside ASCII inside a label); wireName must give
// back the very wire name, so the block looked up again for a retry is the
// query's own.
func TestWireNameRoundTrip(t *testing.T) {
	for _, w := range [][]byte{
		{3, 'w', 'w', 'w', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0},
		{3, 'a', '.', 'b', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0},
		{4, 'a', ' ', 0xff, '\\', 5, 'l', 'o', 'c', 'a', 'l', 0},
		{0},
	} {
		s := wire.NameString(w)
		got, ok := wireName(s)
		if !ok || !bytes.Equal(got, w) {
			t.Errorf("%q: %v %v, want %v", s, got, ok, w)
		}
	}
	if _, ok := wireName(string(bytes.Repeat([]byte("a"), 64)) + ".example."); ok {
		t.Error("a 64-byte label packed")
	}
}
