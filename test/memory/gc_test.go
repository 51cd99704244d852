package memory

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// metric returns the value of an unlabelled series on the daemon's /metrics.
func (d *daemon) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := d.metrics2(t, name)[name]
	if !ok {
		t.Fatalf("no %s on /metrics", name)
	}
	return v
}

// metrics2 returns the values of the unlabelled series names on the
// daemon's /metrics (absent: not served, an older build's).
func (d *daemon) metrics2(t *testing.T, names ...string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for _, name := range names {
			if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				out[name] = f
			}
		}
	}
	return out
}

// The binary's garbage-collector policy (internal/gcfloor, set in main):
// without GOGC in the environment the heap goal leaves at least the floor
// (16 MiB) over a live heap of a few MiB, so GOGC is far above the base 50;
// GOGC in the environment wins, whatever it says.
func TestGCPolicyAndGOGCFromEnv(t *testing.T) {
	nodeIP, kube, _, _ := silentUpstreams(t)
	for _, c := range []struct {
		env  []string
		want func(float64) bool
		says string
	}{
		{nil, func(p float64) bool { return p > 100 }, "above 100 (the floor over a small live heap)"},
		{[]string{"GOGC=80"}, func(p float64) bool { return p == 80 }, "80"},
		{[]string{"GOGC=50"}, func(p float64) bool { return p == 50 }, "50"},
	} {
		d := startDaemon(t, nodeIP, kube, c.env...)
		p := d.metric(t, "go_gc_gogc_percent")
		t.Logf("env %v: go_gc_gogc_percent %v", c.env, p)
		if !c.want(p) {
			t.Errorf("env %v: go_gc_gogc_percent %v, want %s", c.env, p, c.says)
		}
		if l := d.metric(t, "go_gc_gomemlimit_bytes"); l != 168<<20 {
			t.Errorf("env %v: go_gc_gomemlimit_bytes %v, want 168 MiB", c.env, l)
		}
		_ = d.cmd.Process.Kill()
	}
}
