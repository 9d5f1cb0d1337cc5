package router

import (
	"github.com/troupe-run/troupe/internal/metricsx"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's Prometheus series. The vectors are safe for
// concurrent use; everything else is owned by the router actor.
type metrics struct {
	live     *prometheus.GaugeVec
	tooSlow  *prometheus.GaugeVec
	stale    *prometheus.CounterVec
	evicted  *prometheus.CounterVec
	waiting  prometheus.Gauge
	unrouted prometheus.Gauge
	// staleKeys bounds stale's {topic, worker} pairs: both come from input.
	staleKeys *metricsx.LabelCap
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		live: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "troupe_live_workers",
			Help: "Workers whose last heartbeat is within their liveness window, per pool (updated at every sweep).",
		}, []string{"pool"}),
		tooSlow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "troupe_workers_heartbeat_too_slow",
			Help: "Live workers whose heartbeat interval is over a third of this node's worker TTL, per pool (updated at every sweep): one lost heartbeat gets them evicted or their direct dispatches dropped.",
		}, []string{"pool"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_stale_worker_retry_total",
			Help: "Picks that landed on a worker past its liveness window and were re-picked or given up as stale_worker.",
		}, []string{"topic", "worker"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_workers_evicted_total",
			Help: "Workers removed from the registry by the sweep, per pool.",
		}, []string{"pool"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "troupe_capacity_queue_jobs",
			Help: "Jobs waiting in this node's router for room in their pools.",
		}),
		unrouted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "troupe_workers_unrouted",
			Help: "Live workers whose heartbeat names a pool no topic routes to (they get no jobs).",
		}),
	}
	m.staleKeys = metricsx.NewLabelCap(reg, "stale_worker_retry", 0)
	var err error
	if m.live, err = metricsx.Register(reg, m.live); err != nil {
		return nil, err
	}
	if m.tooSlow, err = metricsx.Register(reg, m.tooSlow); err != nil {
		return nil, err
	}
	if m.stale, err = metricsx.Register(reg, m.stale); err != nil {
		return nil, err
	}
	if m.evicted, err = metricsx.Register(reg, m.evicted); err != nil {
		return nil, err
	}
	if m.waiting, err = metricsx.Register(reg, m.waiting); err != nil {
		return nil, err
	}
	if m.unrouted, err = metricsx.Register(reg, m.unrouted); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) countStale(topic, workerID string) {
	if m.staleKeys.Value(topic+"\x00"+workerID) == metricsx.LabelOverflow {
		topic, workerID = metricsx.LabelOverflow, metricsx.LabelOverflow
	}
	m.stale.WithLabelValues(topic, workerID).Inc()
}
