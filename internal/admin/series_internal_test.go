package admin

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// TestSeriesPointsAreStepDifferences: each point counts the step's ends
// and dispatch latencies only (the counters' differences), takes its
// queue depth from the state counts, and a percentile falls in the bucket
// that holds it.
func TestSeriesPointsAreStepDifferences(t *testing.T) {
	reg := prometheus.NewRegistry()
	done := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricCompleted}, []string{"status"})
	lat := prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricDispatchLatency, Buckets: []float64{0.001, 0.01, 0.1}})
	reg.MustRegister(done, lat)
	counts := func(context.Context) (map[jobstate.State]int64, error) {
		return map[jobstate.State]int64{jobstate.StateScheduled: 3, jobstate.StatePending: 1, jobstate.StateRunning: 2}, nil
	}
	s := newSeries(counts, time.Second)
	t0 := time.Unix(1000, 0)
	done.WithLabelValues("SUCCEEDED").Add(7) // before the first point: not counted
	lat.Observe(0.5)
	s.tick(t0, reg)
	done.WithLabelValues("SUCCEEDED").Add(2)
	done.WithLabelValues("TIMEOUT").Inc()
	done.WithLabelValues("FAILED").Inc()
	done.WithLabelValues("CANCELLED").Inc()
	for range 19 {
		lat.Observe(0.005) // in (1 ms, 10 ms]
	}
	lat.Observe(0.05)
	s.tick(t0.Add(500*time.Millisecond), reg) // within the step: no point
	s.tick(t0.Add(time.Second), reg)
	ps := s.since(t0)
	if len(ps) != 2 {
		t.Fatalf("%d points, want 2", len(ps))
	}
	p := ps[1]
	if p.Succeeded != 2 || p.Failed != 2 || p.Waiting != 4 || p.Running != 2 {
		t.Fatalf("point %+v: want 2 succeeded, 2 failed, 4 waiting, 2 running", p)
	}
	if p.DispatchP50 <= 1 || p.DispatchP50 > 10.001 || p.DispatchP95 <= 1 || p.DispatchP95 > 10.001 {
		t.Fatalf("p50 %.2f ms, p95 %.2f ms: want both in (1, 10]", p.DispatchP50, p.DispatchP95)
	}
	if q := quantile([]bucket{{1, 0}, {math.Inf(1), 0}}, 0.5); q != 0 {
		t.Fatalf("quantile of no observations = %v", q)
	}
}
