package jobactor

import (
	"context"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/proto/capv1"
)

// KeyRecheckEvery: while jobs of a key wait on this node, its oldest waiter
// is woken this often when no wake came for the key meanwhile — a lost
// wake notice (Redis pub/sub keeps none), or a lingering slot that lapsed.
// One try per key per node per interval, whatever the number of waiters.
const KeyRecheckEvery = 2 * time.Second

// KeySlotTimeout bounds one call on the key slots.
const KeySlotTimeout = 5 * time.Second

// KeyWaiters are the node's jobs waiting for a slot of their concurrency
// key, per key, oldest first, and those asking for one. A slot handed to
// one of them (the release named it) wakes that job, which finds the slot
// its own; one handed to a job still asking wakes it once it is back in
// line. A notice naming no job goes to the oldest waiter not already
// woken; a woken job that finds no slot asks to wait again, and is woken
// next again.
type KeyWaiters struct {
	mu   sync.Mutex
	seq  uint64
	keys map[string]*keyLine
}

type keyLine struct {
	waiters  map[string]*keyWaiter
	lastWake time.Time
}

type keyWaiter struct {
	seq     uint64
	pid     *actor.PID
	woken   bool
	asking  bool      // its ask is under way: not in line yet
	granted bool      // a release handed it a slot
	grantAt time.Time // when, or when it was last woken for it
}

// NewKeyWaiters returns an empty set.
func NewKeyWaiters() *KeyWaiters { return &KeyWaiters{keys: map[string]*keyLine{}} }

func (w *KeyWaiters) entry(key, jobID string, pid *actor.PID) *keyWaiter {
	l := w.keys[key]
	if l == nil {
		l = &keyLine{waiters: map[string]*keyWaiter{}}
		w.keys[key] = l
	}
	kw := l.waiters[jobID]
	if kw == nil {
		w.seq++
		kw = &keyWaiter{seq: w.seq}
		l.waiters[jobID] = kw
	}
	kw.pid = pid
	return kw
}

// asking notes that the job asks for a slot of key (a release may hand it
// one before its answer is back).
func (w *KeyWaiters) asking(key, jobID string, pid *actor.PID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.entry(key, jobID, pid).asking = true
}

// add puts the job in line for key (its ask found no slot); a job handed
// a slot meanwhile is woken at once (false: it was not).
func (w *KeyWaiters) add(key, jobID string, pid *actor.PID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.entry(key, jobID, pid)
	kw.asking, kw.woken = false, kw.granted // asked and found none: in line again, in its place
	if kw.granted {
		kw.grantAt = time.Now()
	}
	return kw.granted
}

func (w *KeyWaiters) remove(key, jobID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l := w.keys[key]; l != nil {
		delete(l.waiters, jobID)
		if len(l.waiters) == 0 {
			delete(w.keys, key)
		}
	}
}

// Grant: a release handed a slot of key to jobID; if the job is this
// node's, it is woken (now, or once its ask is back). False: not this
// node's job.
func (w *KeyWaiters) Grant(root *actor.RootContext, key, jobID string) bool {
	w.mu.Lock()
	var kw *keyWaiter
	if l := w.keys[key]; l != nil {
		kw = l.waiters[jobID]
		l.lastWake = time.Now()
	}
	send := kw != nil && !kw.asking
	if kw != nil {
		kw.granted, kw.grantAt = true, time.Now()
		kw.woken = kw.woken || send
	}
	var pid *actor.PID
	if send {
		pid = kw.pid
	}
	w.mu.Unlock()
	if send {
		root.Send(pid, &lifecycle.KeyBack{})
	}
	return kw != nil
}

// Wake wakes the oldest waiter of key not yet woken (false: none).
func (w *KeyWaiters) Wake(root *actor.RootContext, key string) bool {
	w.mu.Lock()
	l := w.keys[key]
	var first *keyWaiter
	if l != nil {
		l.lastWake = time.Now()
		for _, kw := range l.waiters {
			if !kw.woken && !kw.asking && (first == nil || kw.seq < first.seq) {
				first = kw
			}
		}
	}
	var pid *actor.PID
	if first != nil {
		first.woken, pid = true, first.pid
	}
	w.mu.Unlock()
	if first == nil {
		return false
	}
	root.Send(pid, &lifecycle.KeyBack{})
	return true
}

// Len returns how many jobs wait, and on how many keys (jobs still asking
// left out).
func (w *KeyWaiters) Len() (jobs, keys int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.keys {
		n := 0
		for _, kw := range l.waiters {
			if !kw.asking {
				n++
			}
		}
		if jobs += n; n > 0 {
			keys++
		}
	}
	return jobs, keys
}

// Run wakes waiters as slots are announced freed on slots' channel (the
// job named, else the key's oldest waiter), and rechecks each key with
// waiters every KeyRecheckEvery, until ctx ends.
func (w *KeyWaiters) Run(ctx context.Context, root *actor.RootContext, slots *keyslot.Slots, onErr func(error)) {
	go func() {
		t := time.NewTicker(KeyRecheckEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				for _, pid := range w.idle(now) {
					root.Send(pid, &lifecycle.KeyBack{})
				}
			}
		}
	}()
	wake := func(key, job string) {
		if job != "" {
			w.Grant(root, key, job)
			return
		}
		w.Wake(root, key)
	}
	for ctx.Err() == nil {
		if err := slots.Subscribe(ctx, wake); err != nil && onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// idle returns the waiters to wake (a wake may have been lost): those
// handed a slot KeyRecheckEvery or longer ago and still in line, and of
// each key with no wake for KeyRecheckEvery its oldest other waiter (the
// woken marks of its waiters cleared).
func (w *KeyWaiters) idle(now time.Time) []*actor.PID {
	w.mu.Lock()
	defer w.mu.Unlock()
	var pids []*actor.PID
	for _, l := range w.keys {
		quiet := now.Sub(l.lastWake) >= KeyRecheckEvery
		var first *keyWaiter
		for _, kw := range l.waiters {
			if kw.asking {
				continue
			}
			if kw.granted {
				if now.Sub(kw.grantAt) >= KeyRecheckEvery {
					kw.woken, kw.grantAt = true, now
					pids = append(pids, kw.pid)
				}
				continue
			}
			if quiet {
				kw.woken = false
				if first == nil || kw.seq < first.seq {
					first = kw
				}
			}
		}
		if first != nil {
			first.woken = true
			pids = append(pids, first.pid)
			l.lastWake = now
		}
	}
	return pids
}

// keyEffect carries out a concurrency-key effect of the core.
func (a *JobActor) keyEffect(c actor.Context, e lifecycle.Effect) {
	env := a.env
	switch e := e.(type) {
	case lifecycle.AskKeySlot:
		self, root, id, slots, waiters := c.Self(), env.Root, a.id, env.KeySlots, env.KeyWaiters
		if slots != nil && waiters != nil {
			waiters.asking(e.Key, id, self)
			a.waitingKey = e.Key
		}
		go func() {
			done := &lifecycle.KeySlotDone{Epoch: e.Epoch}
			if slots == nil {
				done.Outcome = lifecycle.KeyAdmitted
				root.Send(self, done)
				return
			}
			strategy, _ := keyslot.ParseStrategy(e.Strategy)
			ctx, cancel := context.WithTimeout(context.Background(), KeySlotTimeout)
			r, err := slots.Acquire(ctx, e.Key, id, e.Limit, strategy, time.Now())
			cancel()
			switch {
			case err != nil:
				done.Err = err
			case r.Outcome == keyslot.Admitted:
				done.Outcome = lifecycle.KeyAdmitted
			case r.Outcome == keyslot.Refused:
				done.Outcome = lifecycle.KeyRefused
			default:
				done.Outcome, done.Victim = lifecycle.KeyWaiting, r.Victim
			}
			if waiters != nil && done.Outcome != lifecycle.KeyWaiting {
				// Not in line (it holds a slot, or took none): a hand-off
				// can name it no more. In line, it stays, asking, until
				// its WaitKey puts it back in line.
				waiters.remove(e.Key, id)
			}
			root.Send(self, done)
		}()
	case lifecycle.WaitKey:
		if env.KeyWaiters == nil {
			return
		}
		if e.On {
			if env.KeyWaiters.add(e.Key, a.id, c.Self()) {
				c.Send(c.Self(), &lifecycle.KeyBack{}) // handed a slot while it asked
			}
			a.waitingKey = e.Key
		} else {
			env.KeyWaiters.remove(e.Key, a.id)
			a.waitingKey = ""
		}
	case lifecycle.ReleaseKey:
		if env.KeySlots == nil {
			return
		}
		slots, id, log := env.KeySlots, a.id, env.Log
		go func() {
			var err error
			for try := range 3 {
				if try > 0 {
					time.Sleep(time.Duration(try) * 200 * time.Millisecond)
				}
				ctx, cancel := context.WithTimeout(context.Background(), KeySlotTimeout)
				_, err = slots.Release(ctx, e.Key, id, e.LingerUntil, e.Limit)
				cancel()
				if err == nil {
					return
				}
			}
			log.Warn("concurrency key slot not given back; the key slots' repair will", "job_id", id, "key", e.Key, "err", err)
		}()
	case lifecycle.CancelJob:
		data, err := bus.EncodeCancel(a.job.TraceID, env.NodeID, &capv1.JobCancel{JobId: e.JobID, Reason: e.Reason,
			RequestedBy: env.NodeID})
		if err == nil {
			err = env.Publish(env.Subjects.Cancel, data)
		}
		if err != nil {
			env.Log.Warn("cancel publish failed", "job_id", e.JobID, "err", err)
		} else {
			env.Log.Info("job cancelled for a newer job of its concurrency key", "job_id", e.JobID, "by_job", a.id)
		}
	}
}
