package jobactor

import (
	"hash/maphash"
	"strings"
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
// A delayed submit not yet due (lifecycle.WaitDelayed: no record yet, only
// its entry in the delayed set) is indexed too, by the node that held it.
//
// An entry is the job id (the string the actor held, not copied) and one
// int64: the retry time in unix ms, the kind's negative for a wait with no
// due time, or -(delayedBase + due ms) for a delayed submit. It is dropped
// when one of this node's actors takes the job's lock again (Hold); a wait
// woken on another replica (a delayed job taken or cancelled anywhere)
// stays until Prune drops it (a retry or delayed job due long enough
// before Redis was last seen intact) or the node's verify finds it moved
// on.
type AloneWaits struct {
	seed    maphash.Seed
	stripes [aloneStripes]aloneStripe
	n       atomic.Int64
}

const aloneStripes = 64

// delayedBase offsets a delayed submit's due time below every kind's
// negative.
const delayedBase = 1 << 8

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
	w.put(id, v)
}

// put sets id's entry to v.
func (w *AloneWaits) put(id string, v int64) {
	s := w.stripe(id)
	s.mu.Lock()
	if _, ok := s.m[id]; !ok {
		w.n.Add(1)
	}
	s.m[id] = v
	s.mu.Unlock()
}

// AddDelayed records that job id, a submit held until due, waits in the
// delayed set. id is copied: the caller's string may share its memory with
// a whole decoded message.
func (w *AloneWaits) AddDelayed(id string, due time.Time) {
	w.put(strings.Clone(id), -(delayedBase + max(due.UnixMilli(), 0)))
}

// dueMS is the due time an entry's value carries (a retry's or a delayed
// submit's), ok false for a wait with none.
func dueMS(v int64) (int64, bool) {
	switch {
	case v >= 0:
		return v, true
	case v <= -delayedBase:
		return -v - delayedBase, true
	}
	return 0, false
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
	Due   time.Time // a retry wait's retry time; a delayed submit's due time
	v     int64
}

func entryOf(id string, v int64) AloneWait {
	switch {
	case v >= 0:
		return AloneWait{JobID: id, Kind: lifecycle.WaitRetry, Due: time.UnixMilli(v), v: v}
	case v <= -delayedBase:
		return AloneWait{JobID: id, Kind: lifecycle.WaitDelayed, Due: time.UnixMilli(-v - delayedBase), v: v}
	}
	return AloneWait{JobID: id, Kind: lifecycle.WaitKind(-v), v: v}
}

// Snapshot returns the waits indexed now, leaving out the retry waits and
// delayed submits due before dueBefore (zero: none left out).
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
			if due, ok := dueMS(v); ok && due < cut {
				continue
			}
			out = append(out, entryOf(id, v))
		}
		s.mu.Unlock()
	}
	return out
}

// Prune drops the retry waits and delayed submits due before t: Redis
// still held their records (intact) after their due poller or a ticker
// woke them, wherever that was. It returns how many it dropped.
func (w *AloneWaits) Prune(t time.Time) int {
	cut, dropped := t.UnixMilli(), 0
	for i := range w.stripes {
		s := &w.stripes[i]
		s.mu.Lock()
		for id, v := range s.m {
			if due, ok := dueMS(v); ok && due < cut {
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

// Undue returns the waits with no due time (approvals, rate parks) and the
// delayed submits of the stripes from `from` on, whole stripes until limit
// is reached, and the stripe to start from next time (0 after the last):
// the entries only a look at Redis can drop before their time.
func (w *AloneWaits) Undue(from, limit int) ([]AloneWait, int) {
	var out []AloneWait
	i := from % aloneStripes
	for ; i < aloneStripes && len(out) < limit; i++ {
		s := &w.stripes[i]
		s.mu.Lock()
		for id, v := range s.m {
			if v < 0 { // no due time, or a delayed submit's
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
