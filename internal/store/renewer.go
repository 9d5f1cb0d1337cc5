package store

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// LockRenewer keeps the job locks of this node alive. It keeps two kinds:
//
//   - Live locks, held by a job actor on this node: each has a TTL and an
//     entry in its shard's lease set. Every tick renews all of them with one
//     owner-checked script call per shard (up to RenewBatch locks per call),
//     so 64 calls cover any number of locks. A lock whose renewal is refused
//     (someone else holds it, or it expired) or fails MaxRenewFailures ticks in
//     a row is reported through the lost callback given at registration and
//     forgotten.
//   - Parked locks, of jobs that wait for their worker with no live actor
//     (parkScript): they have no TTL; they are held through the node lease,
//     one key per shard with a TTL (Keys.Alive) plus the node's entry in the
//     nodes set. Renewing the lease is 65 commands per tick whatever the
//     number of parked jobs. When the node dies the lease expires and the due
//     poller of another node adopts the parked jobs; no write of the dead
//     node can land after that, because every write is fenced on the lock
//     value, which adoption changes.
type LockRenewer struct {
	s        *Store
	interval time.Duration
	log      *slog.Logger
	node     string // the node whose lease this renewer keeps ("": none)

	mu    sync.Mutex // guards locks
	locks map[string]*heldLock

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	renewed, refused, failed, lostN atomic.Uint64
	leaseRenewed, leaseFailed       atomic.Uint64
	calls                           atomic.Uint64

	// Data-loss detection (with the node lease): epoch is the value of
	// Keys.Epoch last seen, onLoss what to call when it changed or vanished.
	epoch  string
	onLoss func()
}

// RenewStats counts renewal outcomes since start.
type RenewStats struct {
	Renewed uint64 // renewals that extended a lock
	Refused uint64 // renewals refused: the lock was gone or someone else's
	Failed  uint64 // renewals that could not reach Redis
	Lost    uint64 // locks reported lost
	// LeaseRenewed and LeaseFailed count node lease renewals (parked locks).
	LeaseRenewed uint64
	LeaseFailed  uint64
	// Calls counts the Redis commands the renewer sent (script calls and
	// lease commands), whatever the number of locks they covered.
	Calls uint64
}

// Stats returns the renewal counters.
func (r *LockRenewer) Stats() RenewStats {
	return RenewStats{Renewed: r.renewed.Load(), Refused: r.refused.Load(), Failed: r.failed.Load(),
		Lost: r.lostN.Load(), LeaseRenewed: r.leaseRenewed.Load(), LeaseFailed: r.leaseFailed.Load(),
		Calls: r.calls.Load()}
}

type heldLock struct {
	value    string
	failures int
	lost     func(vanished bool)
}

const (
	// RenewBatch is the number of locks one renewal script call covers.
	RenewBatch = 1000
	// MaxRenewFailures consecutive failed renewals mean the lock is lost.
	MaxRenewFailures = 3
	// leaseDeadScore marks a node in the nodes set that stopped gracefully
	// (dead, adoption not started); leaseAdoptingScore marks a dead node
	// whose parked jobs the due poller is adopting. Both are below any real
	// renewal time.
	leaseDeadScore     = 1
	leaseAdoptingScore = 0
)

// NewLockRenewer returns a renewer that runs every LockTTL/3.
func (s *Store) NewLockRenewer(log *slog.Logger) *LockRenewer {
	return &LockRenewer{s: s, interval: s.cfg.LockTTL / 3, log: log, locks: map[string]*heldLock{},
		stop: make(chan struct{}), done: make(chan struct{})}
}

// KeepNodeLease makes the renewer keep node's lease, which holds the locks of
// the jobs node parks. Call it before Start.
func (r *LockRenewer) KeepNodeLease(node string) { r.node = node }

// OnDataLoss makes the renewer, with each lease renewal, watch for Redis
// losing its data (a restart without persistence, a flush): Keys.Epoch is
// set once (SET NX GET) and never expires, so finding it gone, or holding a
// value another node wrote after finding it gone, means everything else may
// be gone too. onLoss is called once per loss seen. Call before Start; it
// needs KeepNodeLease.
func (r *LockRenewer) OnDataLoss(onLoss func()) { r.onLoss = onLoss }

// Start renews once (so the node lease exists before any job parks) and
// runs the renewal loop until Stop.
func (r *LockRenewer) Start() {
	if r.node != "" {
		ctx, cancel := context.WithTimeout(context.Background(), r.interval)
		if err := r.renewLease(ctx); err != nil && r.log != nil {
			r.log.Warn("node lease not renewed", "err", err)
		}
		cancel()
	}
	go r.loop()
}

// Stop ends the loop. A node that stops gracefully gives its lease up, so
// another replica adopts its parked jobs at once instead of after a lock TTL.
// Stop is safe to call more than once.
func (r *LockRenewer) Stop() {
	r.stopOnce.Do(r.stopNow)
}

func (r *LockRenewer) stopNow() {
	close(r.stop)
	<-r.done
	if r.node == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pipe := r.s.rdb.Pipeline()
	for i := 0; i < Shards; i++ {
		pipe.Del(ctx, r.s.keys.Alive(i, r.node))
	}
	pipe.ZAdd(ctx, r.s.keys.Nodes(), redis.Z{Score: leaseDeadScore, Member: r.node})
	_, _ = pipe.Exec(ctx)
}

// Hold registers a lock; lost is called (once, from the renewer's goroutine)
// if the lock cannot be kept: vanished when nobody holds it any more (it
// expired while renewals failed, or Redis lost its data), not when another
// holder has it.
func (r *LockRenewer) Hold(jobID, value string, lost func(vanished bool)) {
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

// Held returns the number of registered (live) locks.
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

// renewLease sets the node's alive key in every shard and its entry in the
// nodes set: one pipeline of Shards+1 commands.
func (r *LockRenewer) renewLease(ctx context.Context) error {
	pipe := r.s.rdb.Pipeline()
	for i := 0; i < Shards; i++ {
		pipe.Set(ctx, r.s.keys.Alive(i, r.node), "1", r.s.cfg.LockTTL)
	}
	pipe.ZAdd(ctx, r.s.keys.Nodes(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: r.node})
	r.calls.Add(Shards + 1)
	var epoch *redis.StatusCmd
	// A fresh value every time: one written after a loss must differ from
	// every value written before it, whoever wrote them.
	token := strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + r.node
	if r.onLoss != nil {
		epoch = pipe.SetArgs(ctx, r.s.keys.Epoch(), token, redis.SetArgs{Mode: "NX", Get: true})
		r.calls.Add(1)
	}
	_, err := pipe.Exec(ctx)
	if errors.Is(err, redis.Nil) {
		err = nil // the epoch's reply when it was absent
	}
	if err != nil {
		r.leaseFailed.Add(1)
		return err
	}
	r.leaseRenewed.Add(1)
	if epoch != nil {
		r.checkEpoch(epoch, token)
	}
	return nil
}

// checkEpoch compares the epoch found with the one seen before; token is
// the value the renewal would have set.
func (r *LockRenewer) checkEpoch(cmd *redis.StatusCmd, token string) {
	found, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		found = token // it was absent: now it is this value
	case err != nil:
		return // unknown (a server without SET NX GET): no verdict
	}
	lost := r.epoch != "" && found != r.epoch
	r.epoch = found
	if lost {
		if r.log != nil {
			r.log.Error("Redis lost its data (the epoch key vanished): jobs whose records are gone are recreated by their live actors or dead-lettered as state_lost")
		}
		r.onLoss()
	}
}

// RenewOnce renews the node lease and every registered lock now.
func (r *LockRenewer) RenewOnce(ctx context.Context) {
	if r.node != "" {
		lctx, cancel := context.WithTimeout(ctx, r.interval)
		if err := r.renewLease(lctx); err != nil && r.log != nil {
			r.log.Warn("node lease not renewed", "err", err)
		}
		cancel()
	}
	type item struct {
		id string
		h  *heldLock
	}
	var byShard [Shards][]item
	r.mu.Lock()
	for id, h := range r.locks {
		sh := Shard(id)
		byShard[sh] = append(byShard[sh], item{id, h})
	}
	r.mu.Unlock()
	type call struct {
		items []item
		cmd   *redis.Cmd
	}
	var calls []call
	for sh := range byShard {
		for start := 0; start < len(byShard[sh]); start += RenewBatch {
			calls = append(calls, call{items: byShard[sh][start:min(start+RenewBatch, len(byShard[sh]))]})
		}
	}
	if len(calls) == 0 {
		return
	}
	ttl := r.s.cfg.LockTTL.Milliseconds()
	leaseUntil := time.Now().Add(2 * r.s.cfg.LockTTL).UnixMilli()
	cctx, cancel := context.WithTimeout(ctx, r.interval)
	_, _ = r.s.sendScripts(cctx, len(calls), func(pipe redis.Pipeliner, i int) []redis.Cmder {
		c := calls[i]
		rc := renewManyCall{leasesKey: r.s.keys.Leases(Shard(c.items[0].id)), ttlMs: ttl, leaseUntilMs: leaseUntil,
			locks: make([]renewedLock, len(c.items))}
		for j, it := range c.items {
			rc.locks[j] = renewedLock{jobID: it.id, lockKey: r.s.keys.Lock(it.id), lockValue: it.h.value}
		}
		calls[i].cmd = evalSha(cctx, pipe, rc)
		r.calls.Add(1)
		return []redis.Cmder{calls[i].cmd}
	})
	cancel()

	type lostLock struct {
		f        func(bool)
		vanished bool
	}
	var lost []lostLock
	r.mu.Lock()
	for _, c := range calls {
		res, err := c.cmd.Int64Slice()
		if err == nil && len(res) != len(c.items) {
			err = redis.Nil
		}
		for i, it := range c.items {
			cur, still := r.locks[it.id]
			if !still || cur != it.h {
				continue
			}
			switch {
			case err == nil && res[i] == 1:
				r.renewed.Add(1)
				it.h.failures = 0
			case err == nil:
				// Refused: the lock is gone (-1) or someone else's (0).
				r.refused.Add(1)
				delete(r.locks, it.id)
				lost = append(lost, lostLock{it.h.lost, res[i] < 0})
			default:
				r.failed.Add(1)
				it.h.failures++
				if it.h.failures >= MaxRenewFailures {
					delete(r.locks, it.id)
					lost = append(lost, lostLock{it.h.lost, false})
				}
			}
		}
	}
	r.mu.Unlock()
	r.lostN.Add(uint64(len(lost)))
	if len(lost) > 0 && r.log != nil {
		r.log.Warn("job locks lost", "count", len(lost))
	}
	for _, l := range lost {
		l.f(l.vanished)
	}
}
