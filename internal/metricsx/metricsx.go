// Package metricsx holds the Prometheus helper the node's components share.
package metricsx

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c, or returns the collector already registered under
// the same description, so that two instances of a component (two nodes in
// one test binary, a client rebuilt on reload) can share a Registerer.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register metrics: %w", err)
}

// LabelOverflow is the label value a LabelCap gives every value past its
// bound.
const LabelOverflow = "_other"

// MaxLabelValuesDefault bounds the distinct values of one label taken from
// input (a topic, a worker id): each value is a series kept for the
// process's life, so values made up by a client would grow /metrics and
// the scraper's storage without end.
const MaxLabelValuesDefault = 256

// LabelCap bounds the distinct values of one metric label. The first max
// values pass; later new values become LabelOverflow and are counted in
// troupe_metric_label_overflow_total{metric}. Safe for concurrent use.
type LabelCap struct {
	max      int
	overflow prometheus.Counter // nil: not counted

	mu   sync.Mutex
	seen map[string]struct{}
}

// NewLabelCap returns a cap of max values (≤ 0: MaxLabelValuesDefault) for
// the label of metric, counting overflow on reg (nil: not counted).
func NewLabelCap(reg prometheus.Registerer, metric string, max int) *LabelCap {
	if max <= 0 {
		max = MaxLabelValuesDefault
	}
	c := &LabelCap{max: max, seen: map[string]struct{}{}}
	if reg != nil {
		vec, err := Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "troupe_metric_label_overflow_total",
			Help: "Label values past a metric's bound, recorded as " + LabelOverflow + " instead, by metric.",
		}, []string{"metric"}))
		if err == nil {
			c.overflow = vec.WithLabelValues(metric)
		}
	}
	return c
}

// Value returns v, or LabelOverflow once max other values have been seen.
func (c *LabelCap) Value(v string) string {
	if c == nil {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; ok {
		return v
	}
	if len(c.seen) >= c.max {
		if c.overflow != nil {
			c.overflow.Inc()
		}
		return LabelOverflow
	}
	c.seen[v] = struct{}{}
	return v
}
