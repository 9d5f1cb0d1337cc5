package bench

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCountersOfReadsTheNodesOutcomeCounters: the report's per-node figures
// come from the node's own registry; the lock renewer's "lost" outcome is
// the job locks lost (#33 item 5), its other outcomes are not, and the
// forwarding outcomes split by label.
func TestCountersOfReadsTheNodesOutcomeCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	renewals := prometheus.NewCounterVec(prometheus.CounterOpts{Name: renewalsMetric}, []string{"outcome"})
	forwarded := prometheus.NewCounterVec(prometheus.CounterOpts{Name: forwardedMetric}, []string{"outcome"})
	completed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: completedMetric}, []string{"state"})
	reg.MustRegister(renewals, forwarded, completed)
	renewals.WithLabelValues("renewed").Add(1000)
	renewals.WithLabelValues("refused").Add(7)
	renewals.WithLabelValues("lost").Add(3)
	forwarded.WithLabelValues("taken").Add(5)
	forwarded.WithLabelValues("returned").Add(2)
	completed.WithLabelValues("SUCCEEDED").Add(90)
	completed.WithLabelValues("FAILED").Add(10)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	_, nc := countersOf(mfs)
	if nc.LocksLost != 3 || nc.ForwardTaken != 5 || nc.ForwardReturned != 2 || nc.Completed != 100 {
		t.Fatalf("counters %+v: want 3 locks lost, 5 forwards taken, 2 returned, 100 completed", nc)
	}
	sum := nc.add(*nc)
	if d := sum.sub(*nc); d != *nc || sum.LocksLost != 6 {
		t.Fatalf("add then sub: %+v from sum %+v, want %+v back and 6 locks lost summed", d, sum, *nc)
	}
}
