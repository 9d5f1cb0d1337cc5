package jobactor

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
)

// AloneWaits is a node's index of the jobs it left waiting alone
// (lifecycle.Alone): a parked retry wait, an approval, a rate-limited
// park. Their records — and the due entry or parked-set entry kept with
// them — are their only home, so when Redis loses its data nothing would
// ever wake them: the node wakes each one it still knows
// (lifecycle.Wake{Lost}) and the job ends visibly, state_lost.
//
// An entry is the job id (the string the actor held, not copied) and one
// int64: the retry time in unix ms, or the kind's negative for a wait
// with no due time. It is dropped when one of this node's actors takes
// the job's lock again (Hold); a wait woken on another replica stays until
// Prune drops it (a retry due long enough before Redis was last seen
// intact) or Verify finds its record moved on.
type AloneWaits struct {
	seed    maphash.Seed
	stripes [aloneStripes]aloneStripe
	n       atomic.Int64
}

const aloneStripes = 64

type aloneStripe struct {
	mu sync.Mutex
	m  map[string]int64
}

// NewAloneWaits makes an empty index.
func NewAloneWaits() *AloneWaits {
	w := &AloneWaits{seed: maphash.MakeSeed()}
	for i := range w.stripes {
		w.stripes[i].m = map[string]int64{}
	}
	return w
}

func (w *AloneWaits) stripe(id string) *aloneStripe {
	return &w.stripes[maphash.String(w.seed, id)%aloneStripes]
}

// Add records that job id waits alone (kind, due: a retry's time).
func (w *AloneWaits) Add(id string, kind lifecycle.WaitKind, due time.Time) {
	v := -int64(kind)
	if kind == lifecycle.WaitRetry && !due.IsZero() {
		v = due.UnixMilli()
	}
	s := w.stripe(id)
	s.mu.Lock()
	if _, ok := s.m[id]; !ok {
		w.n.Add(1)
	}
	s.m[id] = v
	s.mu.Unlock()
}

// Remove forgets job id (its lock is held here again). Cheap when the
// index is empty: one atomic load.
func (w *AloneWaits) Remove(id string) {
	if w.n.Load() == 0 {
		return
	}
	s := w.stripe(id)
	s.mu.Lock()
	if _, ok := s.m[id]; ok {
		delete(s.m, id)
		w.n.Add(-1)
	}
	s.mu.Unlock()
}

// Len is the number of waits indexed.
func (w *AloneWaits) Len() int { return int(w.n.Load()) }

// AloneWait is one entry of the index.
type AloneWait struct {
	JobID string
	Kind  lifecycle.WaitKind
	Due   time.Time // a retry wait's retry time
	v     int64
}

func entryOf(id string, v int64) AloneWait {
	if v >= 0 {
		return AloneWait{JobID: id, Kind: lifecycle.WaitRetry, Due: time.UnixMilli(v), v: v}
	}
	return AloneWait{JobID: id, Kind: lifecycle.WaitKind(-v), v: v}
}

// Snapshot returns the waits indexed now, leaving out the retry waits due
// before dueBefore (zero: none left out).
func (w *AloneWaits) Snapshot(dueBefore time.Time) []AloneWait {
	out := make([]AloneWait, 0, w.Len())
	cut := int64(-1)
	if !dueBefore.IsZero() {
		cut = dueBefore.UnixMilli()
	}
	for i := range w.stripes {
		s := &w.stripes[i]
		s.mu.Lock()
		for id, v := range s.m {
			if v >= 0 && v < cut {
				continue
			}
			out = append(out, entryOf(id, v))
		}
		s.mu.Unlock()
	}
	return out
}

// Prune drops the retry waits due before t: Redis still held their
// records (intact) after their due poller woke them, wherever that was.
// It returns how many it dropped.
func (w *AloneWaits) Prune(t time.Time) int {
	cut, dropped := t.UnixMilli(), 0
	for i := range w.stripes {
		s := &w.stripes[i]
		s.mu.Lock()
		for id, v := range s.m {
			if v >= 0 && v < cut {
				delete(s.m, id)
				dropped++
			}
		}
		s.mu.Unlock()
	}
	w.n.Add(-int64(dropped))
	return dropped
}

// Drop forgets the waits of ids whose entry is still the one given (a
// wait re-added since is kept).
func (w *AloneWaits) Drop(waits []AloneWait) {
	for _, e := range waits {
		s := w.stripe(e.JobID)
		s.mu.Lock()
		if v, ok := s.m[e.JobID]; ok && v == e.v {
			delete(s.m, e.JobID)
			w.n.Add(-1)
		}
		s.mu.Unlock()
	}
}

// Undue returns the waits with no due time (approvals, rate parks) of the
// stripes from `from` on, whole stripes until limit is reached, and the
// stripe to start from next time (0 after the last).
func (w *AloneWaits) Undue(from, limit int) ([]AloneWait, int) {
	var out []AloneWait
	i := from % aloneStripes
	for ; i < aloneStripes && len(out) < limit; i++ {
		s := &w.stripes[i]
		s.mu.Lock()
		for id, v := range s.m {
			if v < 0 {
				out = append(out, entryOf(id, v))
			}
		}
		s.mu.Unlock()
	}
	return out, i % aloneStripes
}

// StillWaiting reports whether a record whose state and reason are s
// ("<state> <reason>") is still in the wait w names.
func (w AloneWait) StillWaiting(s string) bool {
	switch w.Kind {
	case lifecycle.WaitApproval:
		return s == string(jobstate.StateApprovalRequired)+" "+string(jobstate.ReasonApprovalRequired)
	case lifecycle.WaitRate:
		return s == string(jobstate.StateScheduled)+" "+string(jobstate.ReasonRateLimited)
	}
	return s == string(jobstate.StateScheduled)+" "+string(jobstate.ReasonRetryWait)
}
