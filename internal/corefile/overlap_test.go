package corefile_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// A zone and port served without bind and with one are refused, as CoreDNS
// refuses them, naming the first block that binds it whatever the order.
func TestBindOverlapRefused(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"a.example {\n bind 10.0.0.1\n}\na.example {\n bind 10.0.0.2\n}\na.example {\n}\n",
			":7: zone a.example. port 53 without bind overlaps the block at "},
		{"a.example {\n}\na.example {\n bind 10.0.0.1\n}\n",
			":3: zone a.example. port 53 on 10.0.0.1 overlaps the block at "},
		{"a.example {\n bind 10.0.0.1\n}\na.example {\n bind 10.0.0.1\n}\n",
			":4: zone a.example. port 53 on 10.0.0.1 is already served by the block at "},
	} {
		_, err := load(t, tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
			continue
		}
		if strings.Contains(tc.want, "without bind") && !strings.Contains(err.Error(), "Corefile:1, which binds it") {
			t.Errorf("%q: %v: not the first block that binds it", tc.text, err)
		}
	}
	for _, ok := range []string{
		"a.example:53 {\n bind 10.0.0.1\n}\na.example:54 {\n}\n",
		"a.example {\n bind 10.0.0.1\n}\nb.example {\n}\n",
	} {
		if _, err := load(t, ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

// BenchmarkBuildManyBlocks: typing a Corefile of 5,000 forward blocks
// without bind (each zone checked against the others on its port).
func BenchmarkBuildManyBlocks(b *testing.B) {
	var sb strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&sb, "z%d.example.com:53 {\n    cache 30\n    forward . 10.0.%d.%d\n}\n", i, i/250, i%250+1)
	}
	bs, err := corefile.Parse("Corefile", []byte(sb.String()), nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := corefile.Build("Corefile", bs, corefile.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
