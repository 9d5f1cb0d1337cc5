package saga

import (
	"errors"
	"github.com/troupe-run/troupe/internal/metricsx"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the saga runner's series. Safe for concurrent use.
type metrics struct {
	recorded   prometheus.Counter
	triggered  prometheus.Counter
	dispatched prometheus.Counter
	failed     prometheus.Counter
	skipped    *prometheus.CounterVec
	unmarshal  prometheus.Counter
	duration   prometheus.Histogram
	active     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		recorded: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_saga_recorded_total",
			Help: "Compensation templates read from workflow stacks for the first time by a rollback."}),
		triggered: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_saga_rollback_triggered_total",
			Help: "Rollback runs started (a resumed rollback counts again)."}),
		dispatched: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_saga_compensation_dispatched_total",
			Help: "Compensation jobs published on the submit subject."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_saga_compensation_failed_total",
			Help: "Compensation jobs that ended in a state other than SUCCEEDED, or not within the step budget."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_saga_compensation_skipped_total",
			Help: "Compensations not dispatched, by outcome (denied, unmarshal_failed)."}, []string{"outcome"}),
		unmarshal: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_saga_unmarshal_error_total",
			Help: "Compensation templates that did not decode (each one is dead-lettered)."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "troupe_saga_rollback_duration_seconds",
			Help: "Time from a rollback's first start to its outcome.",
			// A step waits up to its budget (30 s by default); workflows have a handful of steps.
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "troupe_saga_active",
			Help: "Rollbacks this node is running (holding the workflow's saga lock)."}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	reg1 := func(c prometheus.Counter) prometheus.Counter {
		var e error
		c, e = metricsx.Register(reg, c)
		err = errors.Join(err, e)
		return c
	}
	m.recorded, m.triggered = reg1(m.recorded), reg1(m.triggered)
	m.dispatched, m.failed, m.unmarshal = reg1(m.dispatched), reg1(m.failed), reg1(m.unmarshal)
	var e1, e2, e3 error
	m.skipped, e1 = metricsx.Register(reg, m.skipped)
	m.duration, e2 = metricsx.Register(reg, m.duration)
	m.active, e3 = metricsx.Register(reg, m.active)
	if err = errors.Join(err, e1, e2, e3); err != nil {
		return nil, err
	}
	return m, nil
}
