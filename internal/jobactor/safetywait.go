package jobactor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// SafetyWaiters are the job actors of a node that wait to ask an
// unavailable input policy (the safety kernel down, its circuit open) again.
// Each waits on its own backoff, up to 30 s; without this, jobs would find a
// kernel that came back only at their next retry. Instead every successful
// check on the node wakes up to SafetyWakeBatch waiters, so the backlog
// follows the kernel's recovery at the pace the kernel answers, not at the
// pace of the longest backoff, and not all in one burst: a burst of every
// waiting job at once (tried first, with 64 per success) timed out at the
// kernel, opened its circuit again and made recovery four times slower.
type SafetyWaiters struct {
	n    atomic.Int64 // len(pids), read without the lock on every check
	mu   sync.Mutex
	pids map[string]*actor.PID
}

// SafetyProbeEvery: while jobs wait, one of them is woken this often to ask
// again. Without it a recovery is noticed only when a new job's check, or a
// waiter's own backoff (up to 30 s), happens to come along; with it, within
// a second of the circuit letting calls through again.
const SafetyProbeEvery = time.Second

// SafetyWakeBatch is how many waiters one successful check wakes. Each woken
// job's own check, when it succeeds, wakes as many again, so the backlog
// drains geometrically, paced by the kernel's answers and bounded by
// Env.PolicySlots.
const SafetyWakeBatch = 4

// NewSafetyWaiters returns an empty set.
func NewSafetyWaiters() *SafetyWaiters { return &SafetyWaiters{pids: map[string]*actor.PID{}} }

func (w *SafetyWaiters) add(jobID string, pid *actor.PID) {
	w.mu.Lock()
	if _, ok := w.pids[jobID]; !ok {
		w.pids[jobID] = pid
		w.n.Add(1)
	}
	w.mu.Unlock()
}

func (w *SafetyWaiters) remove(jobID string) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	if _, ok := w.pids[jobID]; ok {
		delete(w.pids, jobID)
		w.n.Add(-1)
	}
	w.mu.Unlock()
}

// Probe wakes one waiter every SafetyProbeEvery until stop is closed.
func (w *SafetyWaiters) Probe(root *actor.RootContext, stop <-chan struct{}) {
	t := time.NewTicker(SafetyProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			w.wake(root, 1)
		}
	}
}

// Len returns how many jobs wait.
func (w *SafetyWaiters) Len() int { return int(w.n.Load()) }

// wake tells up to max waiters that the policy answers again.
func (w *SafetyWaiters) wake(root *actor.RootContext, max int) {
	if w.n.Load() == 0 {
		return
	}
	var batch []*actor.PID
	w.mu.Lock()
	for id, pid := range w.pids {
		if len(batch) == max {
			break
		}
		batch = append(batch, pid)
		delete(w.pids, id)
		w.n.Add(-1)
	}
	w.mu.Unlock()
	for _, pid := range batch {
		root.Send(pid, &lifecycle.PolicyBack{})
	}
}
