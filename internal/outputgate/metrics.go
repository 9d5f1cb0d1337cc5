package outputgate

import (
	"github.com/troupe-run/troupe/internal/metricsx"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the output policy's series: checks and their decisions,
// quarantines, skipped checks and latency, each by phase ("meta" for phase
// 1, "content" for phase 2). Safe for concurrent use.
type Metrics struct {
	checked     *prometheus.CounterVec
	quarantined *prometheus.CounterVec
	skipped     *prometheus.CounterVec
	latency     *prometheus.HistogramVec
}

// Phase names used as the "phase" label.
const (
	PhaseMeta    = "meta"
	PhaseContent = "content"
)

// NewMetrics registers the output policy series on reg (nil: the
// series exist but are exported nowhere).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		checked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_output_policy_checked_total",
			Help: "Output policy checks by phase and decision (error: the checker failed and the result was released).",
		}, []string{"phase", "decision"}),
		quarantined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_output_policy_quarantined_total",
			Help: "Results moved to OUTPUT_QUARANTINED, by phase.",
		}, []string{"phase"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_output_policy_skipped_total",
			Help: "Output checks not run, by phase and why (no_pointer, fetch_failed, allowed_by_rule, job_not_succeeded, ...).",
		}, []string{"phase", "why"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "troupe_output_policy_check_seconds",
			Help:    "Output policy check latency by phase (phase 2 includes fetching the content).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .01, .05, .25, 1, 5, 30},
		}, []string{"phase"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.checked, err = metricsx.Register(reg, m.checked); err != nil {
		return nil, err
	}
	if m.quarantined, err = metricsx.Register(reg, m.quarantined); err != nil {
		return nil, err
	}
	if m.skipped, err = metricsx.Register(reg, m.skipped); err != nil {
		return nil, err
	}
	if m.latency, err = metricsx.Register(reg, m.latency); err != nil {
		return nil, err
	}
	return m, nil
}

// Checked counts a check's decision ("error" when the checker failed).
func (m *Metrics) Checked(phase, decision string) {
	if m != nil {
		m.checked.WithLabelValues(phase, decision).Inc()
	}
}

// Quarantined counts a result moved to OUTPUT_QUARANTINED.
func (m *Metrics) Quarantined(phase string) {
	if m != nil {
		m.quarantined.WithLabelValues(phase).Inc()
	}
}

// Skipped counts a check not run, and why.
func (m *Metrics) Skipped(phase, why string) {
	if m != nil {
		m.skipped.WithLabelValues(phase, why).Inc()
	}
}

// Observe records a check's latency in seconds.
func (m *Metrics) Observe(phase string, seconds float64) {
	if m != nil {
		m.latency.WithLabelValues(phase).Observe(seconds)
	}
}
