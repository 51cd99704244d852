package podwatch

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

func metricsText(t *testing.T, w *Watch) string {
	t.Helper()
	r := prometheus.NewRegistry()
	r.MustRegister(w.Collectors()...)
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
