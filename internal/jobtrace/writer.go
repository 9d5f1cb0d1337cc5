package jobtrace

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// segment is the ring of one stopped actor on its way to Redis.
type segment struct {
	jobID    string
	entries  []Entry
	terminal bool
}

func (t *Tracer) addPending(s *segment) {
	t.pendingMu.Lock()
	t.pending[s.jobID] = append(t.pending[s.jobID], s)
	t.pendingMu.Unlock()
}

func (t *Tracer) removePending(s *segment) {
	t.pendingMu.Lock()
	defer t.pendingMu.Unlock()
	segs := t.pending[s.jobID]
	for i, p := range segs {
		if p == s {
			segs = append(segs[:i], segs[i+1:]...)
			break
		}
	}
	if len(segs) == 0 {
		delete(t.pending, s.jobID)
	} else {
		t.pending[s.jobID] = segs
	}
}

func (t *Tracer) pendingOf(jobID string) []Entry {
	t.pendingMu.Lock()
	defer t.pendingMu.Unlock()
	var out []Entry
	for _, s := range t.pending[jobID] {
		out = append(out, s.entries...)
	}
	return out
}

// writer persists stopped rings, a pipeline per batch, until Close; then
// it writes what is queued and returns.
func (t *Tracer) writer() {
	defer close(t.done)
	batch := make([]*segment, 0, writeBatch)
	for {
		select {
		case s := <-t.queue:
			batch = append(batch[:0], s)
		fill:
			for len(batch) < writeBatch {
				select {
				case s := <-t.queue:
					batch = append(batch, s)
				default:
					break fill
				}
			}
			t.write(batch)
		case <-t.closing:
			for {
				batch = batch[:0]
			drain:
				for len(batch) < writeBatch {
					select {
					case s := <-t.queue:
						batch = append(batch, s)
					default:
						break drain
					}
				}
				if len(batch) == 0 {
					return
				}
				t.write(batch)
			}
		}
	}
}

// write appends each segment to its job's list, trims the list to
// PersistMax and sets its TTL: the retention of a terminal job's record,
// OpenTTL otherwise.
func (t *Tracer) write(batch []*segment) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	pipe := t.cfg.Redis.Pipeline()
	for _, s := range batch {
		if len(s.entries) == 0 {
			continue
		}
		key := t.cfg.Keys.Trace(s.jobID)
		vals := make([]interface{}, 0, len(s.entries))
		for i := range s.entries {
			b, err := json.Marshal(&s.entries[i])
			if err != nil {
				continue
			}
			vals = append(vals, b)
		}
		pipe.RPush(ctx, key, vals...)
		pipe.LTrim(ctx, key, -t.cfg.PersistMax, -1)
		ttl := t.cfg.OpenTTL
		if s.terminal {
			ttl = t.cfg.Retention
		}
		if ttl > 0 {
			pipe.Expire(ctx, key, ttl)
		}
	}
	_, err := pipe.Exec(ctx)
	for _, s := range batch {
		t.removePending(s)
	}
	if err != nil {
		t.metrics.dropped.Add(float64(len(batch)))
		t.log.Warn("job traces not persisted", "jobs", len(batch), "err", err)
		return
	}
	t.metrics.persisted.Add(float64(len(batch)))
}

func decodeEntry(s string) (Entry, error) {
	var e Entry
	err := json.Unmarshal([]byte(s), &e)
	return e, err
}

// tracerMetrics are the tracer's own counters.
type tracerMetrics struct {
	persisted prometheus.Counter
	dropped   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, rings *atomic.Int64) tracerMetrics {
	m := tracerMetrics{
		persisted: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_job_traces_persisted_total",
			Help: "Job mailbox traces written to Redis when their actor stopped."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_job_traces_dropped_total",
			Help: "Job mailbox traces lost: persist queue full, tracer closed, or the Redis write failed."}),
	}
	if reg != nil {
		// Registration errors are ignored, as the node does for its own
		// collectors: a second tracer on one registry (a node restarted in
		// the same process) must not take the node down over a metric.
		for _, c := range []prometheus.Collector{m.persisted, m.dropped, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "troupe_job_traces_live", Help: "Job actors whose mailbox is being traced on this node.",
		}, func() float64 { return float64(rings.Load()) })} {
			_ = reg.Register(c)
		}
	}
	return m
}
