package policyx

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/metricsx"
)

// inputMetrics are the kernel client's series. Safe for concurrent use.
type inputMetrics struct {
	failOpen *prometheus.CounterVec
	topics   *metricsx.LabelCap // bounds failOpen's topic label (topics come from submits)
	checks   *prometheus.CounterVec
	latency  prometheus.Histogram
	breaker  prometheus.Gauge
}

func newInputMetrics(reg prometheus.Registerer) (*inputMetrics, error) {
	m := &inputMetrics{
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_input_fail_open_total",
			Help: "Jobs allowed without a policy decision because the safety kernel was unavailable and fail mode is open.",
		}, []string{"topic"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_safety_checks_total",
			Help: "Input policy checks by outcome: the decision, cached_<decision>, or unavailable.",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "troupe_safety_check_seconds",
			Help:    "Round trip of input policy checks that reached the kernel.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2},
		}),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "troupe_safety_breaker_state",
			Help: "The safety kernel circuit as this process last saw it: 0 closed, 1 half-open, 2 open.",
		}),
	}
	m.topics = metricsx.NewLabelCap(reg, "input_fail_open_topic", 0)
	if reg == nil {
		return m, nil
	}
	var err error
	if m.failOpen, err = metricsx.Register(reg, m.failOpen); err != nil {
		return nil, err
	}
	if m.checks, err = metricsx.Register(reg, m.checks); err != nil {
		return nil, err
	}
	if m.latency, err = metricsx.Register(reg, m.latency); err != nil {
		return nil, err
	}
	if m.breaker, err = metricsx.Register(reg, m.breaker); err != nil {
		return nil, err
	}
	return m, nil
}
