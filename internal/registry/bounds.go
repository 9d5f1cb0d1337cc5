package registry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/metricsx"
)

// Bounds on what heartbeats may add to a registry. Every heartbeat is
// untrusted input: without a bound, 100,000 made-up worker ids cost 120 MB
// and a 32 MB /v1/workers answer, and 3,000 pool names left 3,000
// troupe_live_workers series behind after their workers were gone.
const (
	// MaxWorkersDefault bounds the workers known at once. Far above any
	// real fleet a node routes for (each worker costs about 1 KiB).
	MaxWorkersDefault = 10_000
	// MaxPoolsDefault bounds the distinct pool names a registry ever
	// admits: each becomes a metric series that outlives its workers (an
	// empty pool reports 0), so the bound is on names seen, not on pools
	// alive now.
	MaxPoolsDefault = 256
)

// Reasons a heartbeat is refused by the bounds (label "reason" of
// troupe_heartbeats_refused_total).
const (
	RefusedTooManyWorkers = "too_many_workers"
	RefusedTooManyPools   = "too_many_pools"
)

// Bounds caps a registry. Zero fields take their defaults.
type Bounds struct {
	// MaxWorkers bounds the workers known at once: a heartbeat from an
	// unknown worker beyond it is refused (known workers keep beating).
	MaxWorkers int
	// MaxPools bounds the distinct pool names admitted since start: a
	// heartbeat naming a new pool beyond it is refused.
	MaxPools int
}

// WithDefaults returns b with zero fields set to their defaults.
func (b Bounds) WithDefaults() Bounds {
	if b.MaxWorkers <= 0 {
		b.MaxWorkers = MaxWorkersDefault
	}
	if b.MaxPools <= 0 {
		b.MaxPools = MaxPoolsDefault
	}
	return b
}

// limits is a registry's bounds and what they refused. Confined to the
// registry's goroutine, like the registry.
type limits struct {
	Bounds
	seenPools map[string]struct{}
	refused   map[string]int64
	counter   *prometheus.CounterVec // nil: counted in refused only
}

func newLimits(b Bounds) limits {
	return limits{Bounds: b.WithDefaults(), seenPools: map[string]struct{}{}, refused: map[string]int64{}}
}

// SetBounds replaces the registry's bounds, and counts refusals in
// troupe_heartbeats_refused_total{reason} on reg when reg is not nil.
// Pools seen so far stay seen.
func (r *Registry) SetBounds(b Bounds, reg prometheus.Registerer) error {
	r.lim.Bounds = b.WithDefaults()
	if reg == nil {
		return nil
	}
	c, err := metricsx.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "troupe_heartbeats_refused_total",
		Help: "Heartbeats refused because the registry is at a bound (too_many_workers, too_many_pools).",
	}, []string{"reason"}))
	if err != nil {
		return err
	}
	r.lim.counter = c
	return nil
}

// Refused returns how many heartbeats each bound refused.
func (r *Registry) Refused() map[string]int64 {
	out := make(map[string]int64, len(r.lim.refused))
	for k, v := range r.lim.refused {
		out[k] = v
	}
	return out
}

// admit reports whether a heartbeat from workerID naming pool fits the
// bounds, counting a refusal; an admitted pool name is remembered.
func (r *Registry) admit(workerID, pool string) bool {
	if _, known := r.workers[workerID]; !known && len(r.workers) >= r.lim.MaxWorkers {
		r.lim.refuse(RefusedTooManyWorkers)
		return false
	}
	if _, seen := r.lim.seenPools[pool]; !seen {
		if len(r.lim.seenPools) >= r.lim.MaxPools {
			r.lim.refuse(RefusedTooManyPools)
			return false
		}
		r.lim.seenPools[pool] = struct{}{}
	}
	return true
}

func (l *limits) refuse(reason string) {
	l.refused[reason]++
	if l.counter != nil {
		l.counter.WithLabelValues(reason).Inc()
	}
}
