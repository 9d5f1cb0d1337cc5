package store

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// LockRenewer keeps every job lock this node holds alive. There is no timer
// per job: each tick renews all registered locks in owner-checked pipelines of
// RenewBatch. A lock whose renewal is refused (someone else holds it, or it
// expired) or fails MaxRenewFailures ticks in a row is reported through the
// lost callback given at registration and forgotten.
type LockRenewer struct {
	s        *Store
	interval time.Duration
	log      *slog.Logger

	mu    sync.Mutex // guards locks
	locks map[string]*heldLock

	stop chan struct{}
	done chan struct{}

	renewed, refused, failed, lostN atomic.Uint64
}

// RenewStats counts renewal outcomes since start.
type RenewStats struct {
	Renewed uint64 // renewals that extended a lock
	Refused uint64 // renewals refused: the lock was gone or someone else's
	Failed  uint64 // renewals that could not reach Redis
	Lost    uint64 // locks reported lost
}

// Stats returns the renewal counters.
func (r *LockRenewer) Stats() RenewStats {
	return RenewStats{Renewed: r.renewed.Load(), Refused: r.refused.Load(), Failed: r.failed.Load(), Lost: r.lostN.Load()}
}

type heldLock struct {
	value    string
	failures int
	lost     func()
}

const (
	// RenewBatch is the number of renewals per pipeline.
	RenewBatch = 1000
	// MaxRenewFailures consecutive failed renewals mean the lock is lost.
	MaxRenewFailures = 3
)

// NewLockRenewer returns a renewer that runs every LockTTL/3.
func (s *Store) NewLockRenewer(log *slog.Logger) *LockRenewer {
	return &LockRenewer{s: s, interval: s.cfg.LockTTL / 3, log: log, locks: map[string]*heldLock{},
		stop: make(chan struct{}), done: make(chan struct{})}
}

// Start runs the renewal loop until Stop.
func (r *LockRenewer) Start() { go r.loop() }

// Stop ends the loop.
func (r *LockRenewer) Stop() {
	close(r.stop)
	<-r.done
}

// Hold registers a lock; lost is called (once, from the renewer's goroutine)
// if the lock cannot be kept.
func (r *LockRenewer) Hold(jobID, value string, lost func()) {
	r.mu.Lock()
	r.locks[jobID] = &heldLock{value: value, lost: lost}
	r.mu.Unlock()
}

// Forget unregisters jobID's lock if value is still the one held.
func (r *LockRenewer) Forget(jobID, value string) {
	r.mu.Lock()
	if h, ok := r.locks[jobID]; ok && h.value == value {
		delete(r.locks, jobID)
	}
	r.mu.Unlock()
}

// Held returns the number of registered locks.
func (r *LockRenewer) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.locks)
}

func (r *LockRenewer) loop() {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.RenewOnce(context.Background())
		}
	}
}

// RenewOnce renews every registered lock now.
func (r *LockRenewer) RenewOnce(ctx context.Context) {
	type item struct {
		id string
		h  *heldLock
	}
	r.mu.Lock()
	items := make([]item, 0, len(r.locks))
	for id, h := range r.locks {
		items = append(items, item{id, h})
	}
	r.mu.Unlock()
	ttl := r.s.cfg.LockTTL.Milliseconds()
	leaseUntil := time.Now().Add(2 * r.s.cfg.LockTTL).UnixMilli()
	var lost []func()
	for start := 0; start < len(items); start += RenewBatch {
		end := min(start+RenewBatch, len(items))
		chunk := items[start:end]
		cmds := make([]*redis.Cmd, len(chunk))
		cctx, cancel := context.WithTimeout(ctx, r.interval)
		pipe := r.s.rdb.Pipeline()
		for i, it := range chunk {
			cmds[i] = r.renew(cctx, pipe, it.id, it.h.value, ttl, leaseUntil)
		}
		_, _ = pipe.Exec(cctx)
		if noScriptCmds(cmds) {
			_ = r.s.LoadScripts(cctx)
			pipe = r.s.rdb.Pipeline()
			for i, it := range chunk {
				cmds[i] = r.renew(cctx, pipe, it.id, it.h.value, ttl, leaseUntil)
			}
			_, _ = pipe.Exec(cctx)
		}
		cancel()
		r.mu.Lock()
		for i, it := range chunk {
			n, err := cmds[i].Int64()
			cur, still := r.locks[it.id]
			if !still || cur != it.h {
				continue
			}
			switch {
			case err == nil && n == 1:
				r.renewed.Add(1)
				it.h.failures = 0
			case err == nil && n == 0:
				// Refused: the lock is gone or someone else's.
				r.refused.Add(1)
				delete(r.locks, it.id)
				lost = append(lost, it.h.lost)
			default:
				r.failed.Add(1)
				it.h.failures++
				if it.h.failures >= MaxRenewFailures {
					delete(r.locks, it.id)
					lost = append(lost, it.h.lost)
				}
			}
		}
		r.mu.Unlock()
	}
	r.lostN.Add(uint64(len(lost)))
	if len(lost) > 0 && r.log != nil {
		r.log.Warn("job locks lost", "count", len(lost))
	}
	for _, f := range lost {
		f()
	}
}

func (r *LockRenewer) renew(ctx context.Context, pipe redis.Pipeliner, jobID, value string, ttl, leaseUntil int64) *redis.Cmd {
	return renewScript.EvalSha(ctx, pipe, []string{r.s.keys.Lock(jobID), r.s.keys.Leases(Shard(jobID))},
		value, ttl, jobID, leaseUntil)
}

func noScriptCmds(cmds []*redis.Cmd) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && len(err.Error()) >= 8 && err.Error()[:8] == "NOSCRIPT" {
			return true
		}
	}
	return false
}
