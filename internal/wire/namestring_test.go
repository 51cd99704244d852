package wire

import "testing"

func TestNameStringEscapesAndAllocs(t *testing.T) {
	for _, tc := range []struct {
		wire []byte
		want string
	}{
		{[]byte{0}, "."},
		{[]byte{3, 'W', 'w', 'W', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0}, "www.example."},
		{[]byte{4, 'a', '.', ' ', 0xff, 2, '_', '-', 0}, `a\046\032\255._-.`},
	} {
		if got := NameString(tc.wire); got != tc.want {
			t.Errorf("NameString(%v) = %q, want %q", tc.wire, got, tc.want)
		}
	}
	name := []byte{2, 'u', '1', 7, 'd', 'e', 'f', 'a', 'u', 'l', 't', 3, 's', 'v', 'c', 0}
	if n := testing.AllocsPerRun(100, func() { _ = NameString(name) }); n != 1 {
		t.Errorf("%.0f allocations per NameString, want 1 (the miss path calls it per miss)", n)
	}
}
