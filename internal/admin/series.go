package admin

import (
	"context"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// The series behind the dashboard's charts (GET /v1/series): queue depth,
// dispatch latency and outcomes per step. The sampler (throughput.go)
// takes a point every SeriesStep: the waiting and running counts are the
// cluster's (the Redis state indexes and the submit stream, as /v1/stats:
// one pipeline of a ZCARD per counted state (seriesStates) and shard, and
// one consumer info);
// the dispatch latency and the outcomes are this node's (its
// troupe_dispatch_latency_seconds and troupe_jobs_completed_total over the
// step).
const (
	// SeriesStep is the time between two points.
	SeriesStep = 10 * time.Second
	// SeriesPoints is how many points are kept: an hour of SeriesStep.
	SeriesPoints = 360
	// seriesWindowDefault is what GET /v1/series returns without ?window=.
	seriesWindowDefault = 15 * time.Minute
	// seriesCountTimeout bounds one point's state count.
	seriesCountTimeout = 2 * time.Second
)

const metricDispatchLatency = "troupe_dispatch_latency_seconds"

// seriesStates are the states a point counts (Waiting and Running): a
// point reads only their indexes, 5 × 64 ZCARDs, not every state's 11 ×
// 64 (on an idle node those were a third of its Redis commands).
var seriesStates = []jobstate.State{jobstate.StatePending, jobstate.StateScheduled, jobstate.StateApprovalRequired,
	jobstate.StateDispatched, jobstate.StateRunning}

// SeriesPoint is one step: the queue's depth at its end, and what
// happened during it.
type SeriesPoint struct {
	T int64 `json:"t"` // unix seconds
	// Waiting: PENDING, SCHEDULED and APPROVAL_REQUIRED jobs (with those
	// waiting with no record yet); Running: DISPATCHED and RUNNING.
	Waiting int64 `json:"waiting"`
	Running int64 `json:"running"`
	// Dispatch latency percentiles of the step's dispatches (0 when none).
	DispatchP50 float64 `json:"dispatch_p50_ms"`
	DispatchP95 float64 `json:"dispatch_p95_ms"`
	// Succeeded and Failed (FAILED and TIMEOUT) count the step's ends.
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
}

// Series is GET /v1/series.
type Series struct {
	StepS  int           `json:"step_s"`
	Points []SeriesPoint `json:"points"`
}

// series keeps the ring of points; the sampler calls tick.
type series struct {
	count func(context.Context) (map[jobstate.State]int64, error)
	step  time.Duration

	mu     sync.Mutex
	points []SeriesPoint // oldest first, at most SeriesWindow/step
	last   time.Time
	prev   seriesCounters
	primed bool
}

// seriesCounters are the cumulative values a point is the difference of.
type seriesCounters struct {
	succeeded, failed float64
	buckets           []bucket
}

type bucket struct {
	upper float64 // seconds
	count float64 // cumulative
}

func newSeries(count func(context.Context) (map[jobstate.State]int64, error), step time.Duration) *series {
	return &series{count: count, step: step, points: make([]SeriesPoint, 0, SeriesPoints)}
}

// tick takes a point when a step has passed since the last one.
func (s *series) tick(now time.Time, reg *prometheus.Registry) {
	s.mu.Lock()
	due := s.last.IsZero() || now.Sub(s.last) >= s.step
	s.mu.Unlock()
	if !due {
		return
	}
	cur, err := seriesCountersOf(reg)
	if err != nil {
		return
	}
	p := SeriesPoint{T: now.Unix()}
	if s.count != nil {
		ctx, cancel := context.WithTimeout(context.Background(), seriesCountTimeout)
		counts, err := s.count(ctx)
		cancel()
		if err == nil {
			p.Waiting = counts[jobstate.StatePending] + counts[jobstate.StateScheduled] + counts[jobstate.StateApprovalRequired]
			p.Running = counts[jobstate.StateDispatched] + counts[jobstate.StateRunning]
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.primed {
		p.Succeeded = int64(math.Round(cur.succeeded - s.prev.succeeded))
		p.Failed = int64(math.Round(cur.failed - s.prev.failed))
		d := bucketDelta(cur.buckets, s.prev.buckets)
		p.DispatchP50, p.DispatchP95 = 1000*quantile(d, 0.5), 1000*quantile(d, 0.95)
	}
	s.prev, s.primed, s.last = cur, true, now
	if len(s.points) == cap(s.points) {
		copy(s.points, s.points[1:])
		s.points = s.points[:len(s.points)-1]
	}
	s.points = append(s.points, p)
}

// since returns the points at or after from, oldest first.
func (s *series) since(from time.Time) []SeriesPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []SeriesPoint{}
	for _, p := range s.points {
		if p.T >= from.Unix() {
			out = append(out, p)
		}
	}
	return out
}

func seriesCountersOf(reg *prometheus.Registry) (seriesCounters, error) {
	var c seriesCounters
	mfs, err := reg.Gather()
	if err != nil {
		return c, err
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricCompleted:
			sumCounter(mf, func(m *dto.Metric, v float64) {
				for _, l := range m.GetLabel() {
					switch {
					case l.GetName() != "status":
					case l.GetValue() == string(jobstate.StateSucceeded):
						c.succeeded += v
					case l.GetValue() == string(jobstate.StateFailed), l.GetValue() == string(jobstate.StateTimeout):
						c.failed += v
					}
				}
			})
		case metricDispatchLatency:
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					c.buckets = append(c.buckets, bucket{upper: b.GetUpperBound(), count: float64(b.GetCumulativeCount())})
				}
				c.buckets = append(c.buckets, bucket{upper: math.Inf(1), count: float64(h.GetSampleCount())})
			}
		}
	}
	return c, nil
}

// bucketDelta is cur minus prev, bucket by bucket (prev empty: cur).
func bucketDelta(cur, prev []bucket) []bucket {
	out := make([]bucket, len(cur))
	for i, b := range cur {
		out[i] = b
		if i < len(prev) && prev[i].upper == b.upper {
			out[i].count -= prev[i].count
		}
	}
	return out
}

// quantile estimates the q-quantile of cumulative buckets, interpolating
// linearly within the bucket it falls in (the last finite bound for the
// +Inf bucket); 0 when there are no observations.
func quantile(bs []bucket, q float64) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.upper, 1) {
				return lower
			}
			in := b.count - below
			if in <= 0 {
				return b.upper
			}
			return lower + (b.upper-lower)*(rank-below)/in
		}
		lower, below = b.upper, b.count
	}
	return lower
}

// series serves GET /v1/series?window=15m (at most the points kept).
func (s *Server) series(w http.ResponseWriter, r *http.Request, _ principal) error {
	window := seriesWindowDefault
	if v := r.URL.Query().Get("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errBadRequest("window must be a positive duration (15m, 1h)")
		}
		window = d
	}
	writeJSON(w, http.StatusOK, Series{StepS: max(1, int(s.sampler.series.step/time.Second)),
		Points: s.sampler.series.since(time.Now().Add(-window))})
	return nil
}
