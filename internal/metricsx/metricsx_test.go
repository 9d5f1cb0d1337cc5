package metricsx_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/metricsx"
)

func TestLabelCapBoundsValues(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := metricsx.NewLabelCap(reg, "topic", 3)
	for i := range 10 {
		want := fmt.Sprint(i)
		if i >= 3 {
			want = metricsx.LabelOverflow
		}
		if got := c.Value(fmt.Sprint(i)); got != want {
			t.Fatalf("value %d: %q, want %q", i, got, want)
		}
	}
	if got := c.Value("1"); got != "1" {
		t.Fatalf("a seen value after overflow: %q", got)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "troupe_metric_label_overflow_total" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("overflow metrics %v %v", mfs, err)
	}
	if v := mfs[0].GetMetric()[0].GetCounter().GetValue(); v != 7 {
		t.Fatalf("overflow counted %v, want 7", v)
	}
	// A second cap on the same registry shares the counter.
	if metricsx.NewLabelCap(reg, "other", 1).Value("x") != "x" {
		t.Fatal("second cap")
	}
}
