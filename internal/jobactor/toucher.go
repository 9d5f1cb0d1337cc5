package jobactor

import (
	"sync"
	"time"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// TouchEvery is how often the submit of a job waiting for room within its
// capacity grace is told to JetStream as in progress, and TouchFirst how
// soon after its wait begins. The submit consumer's first redelivery wait
// is bus.RedeliveryBackoff[0] (5 s) from the delivery, which must not pass
// between two touches (the message would be offered again, to this node or
// a replica, while its job waits here); the first touch leaves the time
// from delivery to the wait's start (the node's own backlog, bounded by
// MaxAdmitting) up to 2.75 s. Each touch costs nats-server an ack-progress
// message, so they are as sparse as that allows: at full speed a job
// waits for a slot well under TouchFirst and is never touched. A touch
// that comes too late only costs a redelivery, which the waiting job
// absorbs (or, on a replica, a second wait that loses the create).
//
// A submit pulled from JetStream by the node's fetch loops is kept in
// progress by those loops from its fetch until it is settled
// (bus.KeepInProgress), so Add leaves it out: the Toucher touches the
// deliveries that come another way.
const (
	TouchEvery = 4 * time.Second
	TouchFirst = 2 * time.Second
	touchTick  = 250 * time.Millisecond
)

// Toucher keeps the submits of the node's unwritten waits (jobs waiting for
// room within their capacity grace, with no record yet) un-acked but not
// redelivered: one goroutine tells JetStream each of them is in progress
// (TouchFirst after the wait begins, then every TouchEvery), however many
// wait — no timer, activation or Redis command per waiting job. A job's
// actor adds its deliveries when its wait begins (lifecycle.Grace +1) and
// removes them when it ends (−1).
//
// Waits sit in two FIFO queues, each in order of its next touch: new ones
// (due TouchFirst after they were added) and touched ones (due TouchEvery
// after their last touch). A tick pops what is due from the head of each,
// so its cost follows the touches, not the waits. A removed wait is marked
// and dropped when it reaches a head.
type Toucher struct {
	// maxAge bounds how long one wait is touched: a wait whose actor died
	// without removing it (a bug) must not keep its submit from JetStream
	// for ever; past it, JetStream offers the submit again.
	maxAge  time.Duration
	mu      sync.Mutex
	waits   map[string]*touched
	fresh   touchQueue
	touched touchQueue
	touches uint64
	ticks   uint64 // loop ticks (due calls), for tests of an idle Toucher
	// free keeps waits that left their queue (removed, then dropped at its
	// head) for the next Add: a wait per waiting job otherwise.
	free []*touched
	kick chan struct{} // a wait was added: the loop's timer runs again
	stop chan struct{}
	once sync.Once
}

type touched struct {
	job         string
	ds          []lifecycle.Delivery
	next, until time.Time
	gone        bool
	// inline holds ds when it fits: a waiting job has its submit's
	// delivery, rarely more (one allocation per wait, not two).
	inline [1]lifecycle.Delivery
}

// touchQueue is a FIFO of waits in order of their next touch. A wait is
// in one queue at a time; one that is gone is dropped when it reaches the
// head, and kept for reuse (free) from then: nothing refers to it.
type touchQueue struct {
	q    []*touched
	head int
	free *[]*touched
}

// touchFreeMax bounds the waits kept for reuse.
const touchFreeMax = 4096

func (q *touchQueue) push(w *touched) { q.q = append(q.q, w) }

// pop drops gone waits from the head and returns the first that is due at
// now; nil when the head is not due yet (or the queue is empty).
func (q *touchQueue) pop(now time.Time) *touched {
	for q.head < len(q.q) {
		w := q.q[q.head]
		if !w.gone && now.Before(w.next) {
			return nil
		}
		q.q[q.head] = nil
		q.head++
		if q.head >= 1024 && q.head*2 >= len(q.q) {
			n := copy(q.q, q.q[q.head:])
			clear(q.q[n:])
			q.q, q.head = q.q[:n], 0
		}
		if !w.gone {
			return w
		}
		if q.free != nil && len(*q.free) < touchFreeMax {
			*w = touched{}
			*q.free = append(*q.free, w)
		}
	}
	return nil
}

// NewToucher starts a Toucher that touches a wait for at most maxAge (the
// capacity grace and a margin; ≤ 0: an hour); Stop ends its goroutine.
func NewToucher(maxAge time.Duration) *Toucher {
	if maxAge <= 0 {
		maxAge = time.Hour
	}
	t := newToucher(maxAge)
	go t.loop()
	return t
}

// newToucher is a Toucher whose loop is not started.
func newToucher(maxAge time.Duration) *Toucher {
	t := &Toucher{maxAge: maxAge, waits: map[string]*touched{}, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	t.fresh.free, t.touched.free = &t.free, &t.free
	return t
}

// Add keeps job's deliveries (copied) until Remove.
func (t *Toucher) Add(job string, ds []lifecycle.Delivery) {
	now := time.Now()
	t.mu.Lock()
	var w *touched
	if k := len(t.free); k > 0 {
		w, t.free[k-1] = t.free[k-1], nil
		t.free = t.free[:k-1]
	} else {
		w = new(touched)
	}
	w.job, w.next, w.until = job, now.Add(TouchFirst), now.Add(t.maxAge)
	kept := w.inline[:0]
	if len(ds) > len(w.inline) {
		kept = make([]lifecycle.Delivery, 0, len(ds))
	}
	for _, d := range ds {
		if d != nil && !keptElsewhere(d) {
			kept = append(kept, d)
		}
	}
	w.ds = kept
	if old := t.waits[job]; old != nil {
		old.gone = true
	}
	t.waits[job] = w
	t.fresh.push(w)
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// Touches reports whether Add would keep any of ds: some delivery that
// is not kept in progress by its fetch loop (keptElsewhere). A wait with
// none needs no Add (nor Remove).
func Touches(ds []lifecycle.Delivery) bool {
	for _, d := range ds {
		if d != nil && !keptElsewhere(d) {
			return true
		}
	}
	return false
}

// keptElsewhere reports whether d's fetch loop keeps it in progress at
// JetStream until it is settled (bus.KeepInProgress): touched here too,
// it would cost nats-server twice the signals.
func keptElsewhere(d lifecycle.Delivery) bool {
	k, ok := d.(interface{ KeptInProgress() bool })
	return ok && k.KeptInProgress()
}

// Remove stops keeping job's deliveries.
func (t *Toucher) Remove(job string) {
	t.mu.Lock()
	if w := t.waits[job]; w != nil {
		w.gone = true
		delete(t.waits, job)
	}
	t.mu.Unlock()
}

// Len is how many jobs' deliveries are kept.
func (t *Toucher) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.waits)
}

// Touches is how many in-progress signals have been sent.
func (t *Toucher) Touches() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.touches
}

// Stop ends the Toucher's goroutine (idempotent).
func (t *Toucher) Stop() { t.once.Do(func() { close(t.stop) }) }

// loop ticks every touchTick while any wait is kept, and sleeps (no timer:
// an idle node pays nothing for it) while none is.
func (t *Toucher) loop() {
	timer := time.NewTimer(touchTick)
	defer timer.Stop()
	armed := true
	var due []lifecycle.Delivery
	for {
		select {
		case <-t.stop:
			return
		case <-t.kick:
			if !armed {
				timer.Reset(touchTick)
				armed = true
			}
		case now := <-timer.C:
			armed = false
			due = t.due(now, due[:0])
			for _, d := range due {
				_ = d.InProgress() // a lost touch only risks a redelivery, which the job absorbs
			}
			clear(due)
			if t.Len() > 0 {
				timer.Reset(touchTick)
				armed = true
			}
		}
	}
}

// due collects the deliveries whose touch is due, and queues their next
// one. The signals go out after the lock is released.
func (t *Toucher) due(now time.Time, out []lifecycle.Delivery) []lifecycle.Delivery {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ticks++
	for _, q := range []*touchQueue{&t.fresh, &t.touched} {
		for w := q.pop(now); w != nil; w = q.pop(now) {
			if now.After(w.until) {
				// See maxAge: its job's actor removes nothing now, so the
				// wait is forgotten here, or the map would keep one entry
				// per dead actor and the loop would tick for ever.
				w.gone = true
				if t.waits[w.job] == w {
					delete(t.waits, w.job)
				}
				if len(t.free) < touchFreeMax {
					*w = touched{} // popped: in no queue, in no map
					t.free = append(t.free, w)
				}
				continue
			}
			w.next = now.Add(TouchEvery)
			t.touched.push(w)
			out = append(out, w.ds...)
			t.touches += uint64(len(w.ds))
		}
	}
	return out
}
