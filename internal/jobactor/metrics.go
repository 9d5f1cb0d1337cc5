package jobactor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/metricsx"
	"github.com/troupe-run/troupe/internal/outputgate"
)

// Metrics are the job actors' counters. They are plain atomics behind
// client_golang collectors: a job pays a few atomic adds, never a lock or an
// allocation. protoactor's built-in metrics stay off (measured: they
// cost 15× message throughput).
type Metrics struct {
	Received        prometheus.Counter
	Dispatched      prometheus.Counter
	Completed       *prometheus.CounterVec // status
	Absorbed        *prometheus.CounterVec // kind: submit, result, cancel, progress
	FailClosed      *prometheus.CounterVec // topic
	Fenced          prometheus.Counter
	IdemDuplicates  prometheus.Counter
	Timeouts        *prometheus.CounterVec // reason
	Retries         *prometheus.CounterVec // reason
	LiveActors      prometheus.Gauge
	ActivationDelay prometheus.Histogram
	Forwarded       *prometheus.CounterVec // outcome: taken, returned
	DispatchLatency prometheus.Histogram
	OrphanReplayed  *prometheus.CounterVec // topic
	Parked          prometheus.Counter
	Unparked        prometheus.Counter
	Resent          prometheus.Counter
	AdoptionLatency prometheus.Histogram
	Held            prometheus.Counter
	// Busy counts activations that found the job's lock held by another
	// owner (store.ActivateBusy): with replicas, a job whose result or
	// cancel reached a node other than the one running it.
	Busy prometheus.Counter
	// CapacityWaits counts the writes that put a job in SCHEDULED to wait
	// for room in its pool (reason pool_overloaded or no_workers): one when
	// it joins the router's wait queue, one per safety-net recheck of a
	// no_workers wait. The bench reports it per job.
	CapacityWaits *prometheus.CounterVec // reason
	// UnwrittenWaits counts the waits for room begun within the capacity
	// grace, with no record (lifecycle.Grace +1); those that outlast the
	// grace are counted in CapacityWaits too when written.
	UnwrittenWaits prometheus.Counter

	// topics bounds the topic label of FailClosed and OrphanReplayed:
	// topics come from submits.
	topics *metricsx.LabelCap

	// RunnerUnknown counts started jobs whose picked worker was lost while
	// NATS chose their runner (a pool subject): the runner may be lost
	// too, and only the job's deadline ends it. Such a job's record says
	// so (reason worker_lost_runner_unknown, field lost_detail).
	RunnerUnknown prometheus.Counter

	// AttemptRetries counts failed attempts run again under a retry
	// policy, by what failed them (worker_failed, worker_timeout,
	// worker_lost); StaleAttempts the results of attempts a job was past,
	// ignored.
	AttemptRetries *prometheus.CounterVec // cause
	StaleAttempts  prometheus.Counter
}

// NewMetrics creates the job metrics and registers them on reg (nil: not
// registered, still counted).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Received: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_jobs_received_total",
			Help: "Jobs created from a submit."}),
		Dispatched: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_jobs_dispatched_total",
			Help: "Job requests published to a worker (after DISPATCHED was durable)."}),
		Completed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_jobs_completed_total",
			Help: "Jobs that reached a terminal state, by state."}, []string{"status"}),
		Absorbed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_duplicates_absorbed_total",
			Help: "Submits, results and cancels for finished jobs (or duplicate submits of live ones), absorbed without effect."},
			[]string{"kind"}),
		FailClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_state_read_fail_closed_total",
			Help: "Job state reads or writes that failed; the job did nothing and retried."}, []string{"topic"}),
		Fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_transitions_fenced_total",
			Help: "Writes refused because another owner holds the job's lock."}),
		IdemDuplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_idempotent_duplicates_total",
			Help: "Submits whose idempotency key was already claimed by another job."}),
		Timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_job_timeouts_total",
			Help: "Jobs timed out, by reason."}, []string{"reason"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_scheduling_retries_total",
			Help: "Scheduling attempts that backed off, by reason."}, []string{"reason"}),
		LiveActors: prometheus.NewGauge(prometheus.GaugeOpts{Name: "troupe_live_job_actors",
			Help: "Job actors alive on this node."}),
		ActivationDelay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "troupe_job_lock_wait_seconds",
			Help:    "Time from a job actor's first event to owning the job's lock.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}),
		Forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_events_forwarded_total",
			Help: "Results and cancels passed to the node owning their job: taken by it, or returned to JetStream."},
			[]string{"outcome"}),
		DispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "troupe_dispatch_latency_seconds",
			Help:    "From a job's first event on this node (its submit) to its request being published to a worker.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}),
		OrphanReplayed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_orphan_replayed_total",
			Help: "Jobs the due poller woke and this node adopted (their owner died, or their wait was due)."},
			[]string{"topic"}),
		Parked: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_jobs_parked_total",
			Help: "Jobs parked while waiting for their worker or rate limit tokens: actor stopped, lock held through the node lease."}),
		Unparked: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_jobs_unparked_total",
			Help: "Parked jobs activated again (a result, cancel, progress, deadline, eviction or adoption)."}),
		AdoptionLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "troupe_adoption_latency_seconds",
			Help:    "From the moment a dead owner's lock lapsed to another activation adopting its job (orphans the due poller woke).",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 14)}),
		Resent: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_dispatch_resent_total",
			Help: "Direct dispatches repeated to a deduping worker because the job showed no sign of arriving."}),
		CapacityWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_capacity_waits_total",
			Help: "Jobs written SCHEDULED to wait for room in their pool (pool_overloaded, no_workers)."}, []string{"reason"}),
		UnwrittenWaits: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_capacity_waits_unwritten_total",
			Help: "Jobs that began to wait for room within their capacity grace, with no record (their submit held in JetStream)."}),
		Held: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_unknown_job_events_held_total",
			Help: "Results and cancels for a job with no record handed back to JetStream to wait for the record (a replica that lost it with Redis recreates it)."}),
		RunnerUnknown: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_jobs_runner_unknown_total",
			Help: "Started jobs whose picked worker was lost on a pool subject: their runner is unknown and may be lost; each ends at its deadline unless a result comes (GET /v1/jobs?state=DISPATCHED, reason worker_lost_runner_unknown)."}),
		AttemptRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_job_attempt_retries_total",
			Help: "Failed attempts run again under the job's retry policy, by cause (worker_failed, worker_timeout, worker_lost)."},
			[]string{"cause"}),
		StaleAttempts: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_job_stale_attempt_results_total",
			Help: "Results of an attempt the job had moved past (a retry was already under way), ignored."}),
		Busy: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_job_activations_busy_total",
			Help: "Job activations that found the job's lock held by another owner (its results and cancels go to that owner or back to JetStream; its submits are duplicates)."}),
	}
	m.topics = metricsx.NewLabelCap(reg, "job_topic", 0)
	if reg != nil {
		reg.MustRegister(m.Received, m.Dispatched, m.Completed, m.Absorbed, m.FailClosed, m.Fenced,
			m.IdemDuplicates, m.Timeouts, m.Retries, m.LiveActors, m.ActivationDelay, m.Forwarded,
			m.DispatchLatency, m.OrphanReplayed, m.Parked, m.Unparked, m.Resent, m.AdoptionLatency, m.CapacityWaits,
			m.Held, m.Busy, m.UnwrittenWaits, m.RunnerUnknown,
			m.AttemptRetries, m.StaleAttempts)
	}
	return m
}

// count adds one to the counter the core names.
func (m *Metrics) count(c lifecycle.Count, output *outputgate.Gate) {
	switch c.M {
	case lifecycle.MAbsorbed:
		m.Absorbed.WithLabelValues(c.Label).Inc()
	case lifecycle.MIdemDuplicates:
		m.IdemDuplicates.Inc()
	case lifecycle.MReceived:
		m.Received.Inc()
	case lifecycle.MCompleted:
		m.Completed.WithLabelValues(c.Label).Inc()
	case lifecycle.MUnparked:
		m.Unparked.Inc()
	case lifecycle.MOrphanReplayed:
		m.OrphanReplayed.WithLabelValues(m.topics.Value(c.Label)).Inc()
	case lifecycle.MRetries:
		m.Retries.WithLabelValues(c.Label).Inc()
	case lifecycle.MDispatched:
		m.Dispatched.Inc()
	case lifecycle.MResent:
		m.Resent.Inc()
	case lifecycle.MParked:
		m.Parked.Inc()
	case lifecycle.MTimeouts:
		m.Timeouts.WithLabelValues(c.Label).Inc()
	case lifecycle.MCapacityWaits:
		m.CapacityWaits.WithLabelValues(c.Label).Inc()
	case lifecycle.MFenced:
		m.Fenced.Inc()
	case lifecycle.MFailClosed:
		m.FailClosed.WithLabelValues(m.topics.Value(c.Label)).Inc()
	case lifecycle.MHeld:
		m.Held.Inc()
	case lifecycle.MBusy:
		m.Busy.Inc()
	case lifecycle.MRunnerUnknown:
		m.RunnerUnknown.Inc()
	case lifecycle.MRetried:
		m.AttemptRetries.WithLabelValues(c.Label).Inc()
	case lifecycle.MStaleAttempt:
		m.StaleAttempts.Inc()
	case lifecycle.MQuarantined:
		if output != nil {
			output.Metrics.Quarantined(c.Label)
		}
	}
}

// observe records a value in the histogram the core names.
func (m *Metrics) observe(o lifecycle.Observe) {
	if h := m.histogram(o.M); h != nil {
		h.Observe(o.Value)
	}
}

// observeTraced is observe with an exemplar naming the job's span (trace
// and span id, hex), so a slow bucket leads to the trace that landed in it.
// Exemplars are exposed to scrapers that ask for OpenMetrics. Empty
// traceID: a plain observation.
func (m *Metrics) observeTraced(o lifecycle.Observe, traceID, spanID string) {
	h := m.histogram(o.M)
	if h == nil {
		return
	}
	if eo, ok := h.(prometheus.ExemplarObserver); ok && traceID != "" {
		eo.ObserveWithExemplar(o.Value, prometheus.Labels{"trace_id": traceID, "span_id": spanID})
		return
	}
	h.Observe(o.Value)
}

// histogram is the histogram the core names (nil: none).
func (m *Metrics) histogram(metric lifecycle.Metric) prometheus.Histogram {
	switch metric {
	case lifecycle.MActivationDelay:
		return m.ActivationDelay
	case lifecycle.MDispatchLatency:
		return m.DispatchLatency
	case lifecycle.MAdoptionLatency:
		return m.AdoptionLatency
	}
	return nil
}
