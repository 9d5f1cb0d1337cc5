package jobactor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// Wheel is the node's one timer for all job actors: a hashed timing wheel.
// A job waiting for a retry or a deadline costs one small entry here instead
// of a runtime timer of its own (one timer per actor is
// what a million in-flight jobs cannot afford, and protoactor's receive
// timeouts are one-shot and reset by every message).
//
// Slots are WheelTick apart; an entry further away than one rotation waits
// its remaining rounds in its slot. When an entry is due, the wheel sends
// &lifecycle.Timer{Epoch} to the job; the job drops wakes whose epoch it no longer
// waits for, so a late or cancelled entry is harmless. Cancel removes the
// entry so long deadlines of finished jobs do not pile up.
type Wheel struct {
	root *actor.RootContext

	mu    sync.Mutex // guards everything below
	slots []*wheelEntry
	pos   int
	n     int
	// free keeps the entries of stopped job actors (Release) for the next
	// actors' first timers: an entry a job otherwise.
	free []*wheelEntry

	// wake tells an idle run loop (no entries: it stops ticking, so an
	// idle node does not wake 100 times a second) that an entry came.
	wake  chan struct{}
	ticks atomic.Uint64 // ticks taken, for tests and metrics
	stop  chan struct{}
	done  chan struct{}
}

const (
	// WheelTick is the wheel's resolution. Backoff jitter is drawn in
	// milliseconds, but 10 ms is far below anything a job waits for.
	WheelTick = 10 * time.Millisecond
	// WheelSlots per rotation: 1024 × 10 ms ≈ 10 s, so most retries fire
	// in their first rotation and a 300 s deadline is visited 30 times.
	WheelSlots = 1024
	// wheelFreeMax bounds the entries kept for reuse: a burst of stopped
	// actors keeps at most this many (64 B each) for good.
	wheelFreeMax = 4096
)

// TimerRef identifies a scheduled entry, for Cancel.
type TimerRef = *wheelEntry

type wheelEntry struct {
	pid        *actor.PID
	epoch      uint64
	rounds     int
	slot       int
	prev, next *wheelEntry
	live       bool
}

// NewWheel starts a wheel that delivers through root.
func NewWheel(root *actor.RootContext) *Wheel {
	w := &Wheel{root: root, slots: make([]*wheelEntry, WheelSlots), wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// Schedule sends &lifecycle.Timer{Epoch} to pid after d.
func (w *Wheel) Schedule(d time.Duration, pid *actor.PID, epoch uint64) TimerRef {
	return w.Reschedule(nil, d, pid, epoch)
}

// Reschedule is Schedule that reuses e (nil: none), an entry of the
// caller's own: e is cancelled if still scheduled and scheduled again for
// d, with epoch. A job actor keeps its one entry from one timer to the
// next, so arming a timer allocates nothing. The wheel reads an entry only
// under its lock (a due entry's pid and epoch are copied out before it is
// sent), so the caller may reuse it as soon as it fired.
func (w *Wheel) Reschedule(e TimerRef, d time.Duration, pid *actor.PID, epoch uint64) TimerRef {
	// The next tick may come at any moment of the current period, so one
	// tick more than d needs: an entry never fires early, at most one tick
	// late.
	ticks := int((d+WheelTick-1)/WheelTick) + 1
	if ticks < 1 {
		ticks = 1
	}
	w.mu.Lock()
	if e == nil {
		if k := len(w.free); k > 0 {
			e, w.free[k-1] = w.free[k-1], nil
			w.free = w.free[:k-1]
		} else {
			e = &wheelEntry{}
		}
	}
	if e.live {
		w.unlink(e)
	}
	e.pid, e.epoch, e.live = pid, epoch, true
	e.slot = (w.pos + ticks) % WheelSlots
	e.rounds = (ticks - 1) / WheelSlots
	e.next = w.slots[e.slot]
	if e.next != nil {
		e.next.prev = e
	}
	w.slots[e.slot] = e
	w.n++
	first := w.n == 1
	w.mu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return e
}

// Cancel removes an entry; cancelling a fired or cancelled entry is a no-op.
func (w *Wheel) Cancel(e TimerRef) {
	if e == nil {
		return
	}
	w.mu.Lock()
	if e.live {
		w.unlink(e)
	}
	w.mu.Unlock()
}

// Release cancels e and keeps it for a later Schedule or Reschedule(nil):
// its owner (a stopping job actor) gives it up and never uses it again.
// The wheel reads entries only under its lock, so one released while its
// wake is being sent is not read again.
func (w *Wheel) Release(e TimerRef) {
	if e == nil {
		return
	}
	w.mu.Lock()
	if e.live {
		w.unlink(e)
	}
	if len(w.free) < wheelFreeMax {
		*e = wheelEntry{}
		w.free = append(w.free, e)
	}
	w.mu.Unlock()
}

// Len returns the number of scheduled entries.
func (w *Wheel) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (w *Wheel) unlink(e *wheelEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		w.slots[e.slot] = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	}
	e.prev, e.next, e.live = nil, nil, false
	w.n--
}

// Ticks returns how many ticks the wheel has taken: an idle wheel (no
// entries) takes none.
func (w *Wheel) Ticks() uint64 { return w.ticks.Load() }

// Stop ends the wheel; pending entries never fire.
func (w *Wheel) Stop() {
	close(w.stop)
	<-w.done
}

func (w *Wheel) run() {
	defer close(w.done)
	t := time.NewTicker(WheelTick)
	defer t.Stop()
	// due: the entries that fired in a tick, copied out under the lock.
	type dueTimer struct {
		pid   *actor.PID
		epoch uint64
	}
	var due []dueTimer
	for {
		w.mu.Lock()
		idle := w.n == 0
		w.mu.Unlock()
		if idle {
			// Nothing scheduled: stop ticking until Schedule adds an
			// entry. Positions are relative, so the wheel resumes from
			// where it stood.
			t.Stop()
			select {
			case <-w.stop:
				return
			case <-w.wake:
			}
			t.Reset(WheelTick)
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.ticks.Add(1)
		w.mu.Lock()
		w.pos = (w.pos + 1) % WheelSlots
		for e := w.slots[w.pos]; e != nil; {
			next := e.next
			if e.rounds > 0 {
				e.rounds--
			} else {
				w.unlink(e)
				due = append(due, dueTimer{pid: e.pid, epoch: e.epoch})
			}
			e = next
		}
		w.mu.Unlock()
		for i, e := range due {
			w.root.Send(e.pid, &lifecycle.Timer{Epoch: e.epoch})
			due[i] = dueTimer{}
		}
		due = due[:0]
	}
}
