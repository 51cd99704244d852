package autopath

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// metricValues maps "name{label="value"}" to each sample's value.
func metricValues(t *testing.T, a *Autopath) map[string]float64 {
	t.Helper()
	r := prometheus.NewRegistry()
	r.MustRegister(a.Collectors()...)
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[name] = m.Gauge.GetValue()
			}
		}
	}
	return out
}
