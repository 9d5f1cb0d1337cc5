package bench

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// tracker holds the harness's per-job timestamps. Every time is read from one
// monotonic clock (time.Since(base)), on the submitting goroutine and on the
// workers' goroutines of this same process, so submit → receipt needs no
// clock agreement between processes. Slots are indexed by the job's number;
// the arrays are allocated once, so recording is a few atomic stores and no
// allocation or lock on the hot path.
type tracker struct {
	// Immutable after newTracker.
	base   time.Time
	prefix string // job ids are prefix + decimal index
	warm   string // warm-up job ids start with it
	n      int

	// Shared; written atomically.
	submitNs   []atomic.Int64 // first publish of job i, ns since base (0 = never)
	receiptNs  []atomic.Int64 // first receipt by any worker
	answerNs   []atomic.Int64 // when the worker published its result
	receipts   []atomic.Int32 // receipts by any worker
	submitted  atomic.Int64
	received   atomic.Int64 // distinct jobs received
	answered   atomic.Int64
	warmSeen   atomic.Int64 // receipts of warm-up jobs (not tracked per job)
	foreign    atomic.Int64 // receipts of ids that are not this run's
	badPackets atomic.Int64
}

func newTracker(prefix, warm string, n int) *tracker {
	return &tracker{
		base: time.Now(), prefix: prefix, warm: warm, n: n,
		submitNs: make([]atomic.Int64, n), receiptNs: make([]atomic.Int64, n),
		answerNs: make([]atomic.Int64, n), receipts: make([]atomic.Int32, n),
	}
}

// now is the tracker clock: ns since base, never 0 (0 means "not yet").
func (t *tracker) now() int64 { return max(1, int64(time.Since(t.base))) }

// id returns job i's id.
func (t *tracker) id(i int) string { return t.prefix + strconv.Itoa(i) }

// index returns the slot of id, or -1 when id is not one of this run's jobs.
func (t *tracker) index(id string) int {
	if !strings.HasPrefix(id, t.prefix) {
		return -1
	}
	i, err := strconv.Atoi(id[len(t.prefix):])
	if err != nil || i < 0 || i >= t.n {
		return -1
	}
	return i
}

// wallNs converts a tracker time to unix ns (for comparing with the node's
// wall-clock history timestamps).
func (t *tracker) wallNs(ns int64) int64 { return t.base.UnixNano() + ns }

func (t *tracker) markSubmitted(i int) {
	if t.submitNs[i].CompareAndSwap(0, t.now()) {
		t.submitted.Add(1)
	}
}

// markReceived records a worker's receipt of id at ns; it returns the slot,
// or -1 for an id that is not this run's.
func (t *tracker) markReceived(id string, ns int64) int {
	i := t.index(id)
	if i < 0 {
		if strings.HasPrefix(id, t.warm) {
			t.warmSeen.Add(1)
		} else {
			t.foreign.Add(1)
		}
		return -1
	}
	if t.receipts[i].Add(1) == 1 {
		t.receiptNs[i].Store(ns)
		t.received.Add(1)
	}
	return i
}

func (t *tracker) markAnswered(i int) {
	if t.answerNs[i].CompareAndSwap(0, t.now()) {
		t.answered.Add(1)
	}
}

// duplicates counts jobs received more than once, and jobs never received.
func (t *tracker) duplicates() (dup, never int) {
	for i := range t.receipts {
		switch n := t.receipts[i].Load(); {
		case n > 1:
			dup++
		case n == 0:
			never++
		}
	}
	return dup, never
}
