package actors

import (
	"sync"
	"time"

	"github.com/troupe-run/troupe/actors/lifecycle"
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
const (
	TouchEvery = 4 * time.Second
	TouchFirst = 2 * time.Second
	touchTick  = 250 * time.Millisecond
)

// Toucher keeps the submits of the node's unwritten waits (jobs waiting for
// room within their capacity grace, with no record yet) un-acked but not
// redelivered: one goroutine tells JetStream each of them is in progress
// every TouchEvery, however many wait — no timer, activation or Redis
// command per waiting job. A job's actor adds its deliveries when its wait
// begins (lifecycle.Grace +1) and removes them when it ends (−1).
type Toucher struct {
	mu      sync.Mutex
	waits   map[string]*touched
	touches uint64
	stop    chan struct{}
	once    sync.Once
}

type touched struct {
	ds   []lifecycle.Delivery
	next time.Time
}

// NewToucher starts a Toucher; Stop ends its goroutine.
func NewToucher() *Toucher {
	t := &Toucher{waits: map[string]*touched{}, stop: make(chan struct{})}
	go t.loop()
	return t
}

// Add keeps job's deliveries (copied) until Remove.
func (t *Toucher) Add(job string, ds []lifecycle.Delivery) {
	kept := make([]lifecycle.Delivery, 0, len(ds))
	for _, d := range ds {
		if d != nil {
			kept = append(kept, d)
		}
	}
	t.mu.Lock()
	t.waits[job] = &touched{ds: kept, next: time.Now().Add(TouchFirst)}
	t.mu.Unlock()
}

// Remove stops keeping job's deliveries.
func (t *Toucher) Remove(job string) {
	t.mu.Lock()
	delete(t.waits, job)
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

func (t *Toucher) loop() {
	tick := time.NewTicker(touchTick)
	defer tick.Stop()
	var due []lifecycle.Delivery
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			due = t.due(now, due[:0])
			for _, d := range due {
				_ = d.InProgress() // a lost touch only risks a redelivery, which the job absorbs
			}
			clear(due)
		}
	}
}

// due collects the deliveries whose touch is due, and sets their next one.
// The signals go out after the lock is released.
func (t *Toucher) due(now time.Time, out []lifecycle.Delivery) []lifecycle.Delivery {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range t.waits {
		if now.Before(w.next) {
			continue
		}
		w.next = now.Add(TouchEvery)
		out = append(out, w.ds...)
		t.touches += uint64(len(w.ds))
	}
	return out
}
