package ratelimit

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/metricsx"
)

// Metrics are the limiter's Prometheus metrics, labelled by bucket (a
// declared name: the label's values are bounded by the config; a
// template's key buckets count under the template's name, and have no
// waiting or level gauge).
type Metrics struct {
	Waiting   *prometheus.GaugeVec
	Level     *prometheus.GaugeVec
	Granted   *prometheus.CounterVec
	Calls     *prometheus.CounterVec
	Wait      *prometheus.HistogramVec
	StateLost *prometheus.CounterVec
	Overflow  *prometheus.CounterVec
	Dropped   *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "troupe_rate_limit_waiting",
			Help: "Jobs of this node waiting for a rate limit bucket's tokens."}, []string{"bucket"}),
		Level: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "troupe_rate_limit_level",
			Help: "A bucket's tokens in Redis after this node's last call."}, []string{"bucket"}),
		Granted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_rate_limit_granted_units_total",
			Help: "Units of a bucket handed to this node's jobs."}, []string{"bucket"}),
		Calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_rate_limit_redis_calls_total",
			Help: "Calls of the bucket script by this node (result ok or error): they follow buckets, not waiting jobs."},
			[]string{"bucket", "result"}),
		Wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "troupe_rate_limit_wait_seconds",
			Help:    "How long a job waited for its tokens (granted waits only).",
			Buckets: []float64{.001, .01, .05, .1, .5, 1, 5, 10, 60, 300, 3600}}, []string{"bucket"}),
		StateLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_rate_limit_state_lost_total",
			Help: "A bucket's Redis key was gone while in use (Redis lost its data): the bucket started full again."},
			[]string{"bucket"}),
		Overflow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_rate_limit_key_overflow_total",
			Help: "Jobs of a template's new key sent to its shared overflow bucket: the template had max_keys buckets live on this node."},
			[]string{"bucket"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_rate_limit_keys_dropped_total",
			Help: "A template's key buckets dropped from this node's memory after a minute idle."},
			[]string{"bucket"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.Waiting, err = metricsx.Register(reg, m.Waiting); err != nil {
		return nil, err
	}
	if m.Level, err = metricsx.Register(reg, m.Level); err != nil {
		return nil, err
	}
	if m.Granted, err = metricsx.Register(reg, m.Granted); err != nil {
		return nil, err
	}
	if m.Calls, err = metricsx.Register(reg, m.Calls); err != nil {
		return nil, err
	}
	if m.Wait, err = metricsx.Register(reg, m.Wait); err != nil {
		return nil, err
	}
	if m.StateLost, err = metricsx.Register(reg, m.StateLost); err != nil {
		return nil, err
	}
	if m.Overflow, err = metricsx.Register(reg, m.Overflow); err != nil {
		return nil, err
	}
	if m.Dropped, err = metricsx.Register(reg, m.Dropped); err != nil {
		return nil, err
	}
	return m, nil
}
