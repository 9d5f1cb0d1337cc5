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

	mu    sync.Mutex // guards locks and the HeldLocks' fields but id, value, loser and r
	locks map[string]*HeldLock
	heldN atomic.Int64 // len(locks), read without mu

	// now is the clock (time.Now; tests set another with SetClock).
	now func() time.Time
	// renewedThrough (unix ns): every live lock was renewed, or
	// registered, at or after it (see Late).
	renewedThrough atomic.Int64

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
	// intactAt: when the last lease renewal that found the epoch this
	// node had seen was sent (unix ms; 0: none yet) — Redis held its data
	// then.
	intactAt atomic.Int64
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

// HeldLock is a lock registered with HoldFor, its holder's handle: the
// holder (ForgetHeld) and the Writer (an Op's Held) reach the lock's entry
// through it, without looking the job's id up in the renewer's map (a
// job's lock was five look-ups under the renewer's mutex; it is two, the
// registration's, and the delete).
type HeldLock struct {
	id       string
	value    string
	r        *LockRenewer
	failures int
	loser    LockLoser
	// releasing counts the writes in flight that give this lock up if
	// they apply (see releasing.go).
	releasing int
	// live: the entry is in r.locks (under r.mu).
	live bool
}

// Value is the lock value h holds.
func (h *HeldLock) Value() string { return h.value }

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
	r := &LockRenewer{s: s, interval: s.cfg.LockTTL / 3, log: log, locks: map[string]*HeldLock{},
		stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
	r.renewedThrough.Store(time.Now().UnixNano())
	s.addRenewer(r)
	return r
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

// IntactAt is when the last lease renewal that found Redis still holding
// its data (the epoch this node had seen) was sent; zero before the
// second renewal with OnDataLoss. A loss seen later happened after it.
func (r *LockRenewer) IntactAt() time.Time {
	if ms := r.intactAt.Load(); ms > 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}

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
	r.HoldFor(jobID, value, lostFunc(lost))
}

// lostFunc is Hold's function as a LockLoser.
type lostFunc func(vanished bool)

func (f lostFunc) LockLost(_ string, vanished bool) { f(vanished) }

// LockLoser is told, as Hold's lost is, that its lock of value could not be kept.
type LockLoser interface {
	LockLost(value string, vanished bool)
}

// HoldFor is Hold telling l instead of calling a function: a job actor is
// its own LockLoser, where a closure per job was an allocation per job.
//
// It returns the lock's handle: ForgetHeld(h) is Forget(jobID, value)
// without a look-up, and an Op's Held does the same for the Writer.
//
// Held again with the value it holds, a job keeps its entry (registered
// afresh: no failures, no releasing write counted, l told of a loss), so
// a handle given out before, in an op still in flight, stays the one the
// job's id and value look up.
func (r *LockRenewer) HoldFor(jobID, value string, l LockLoser) *HeldLock {
	r.mu.Lock()
	if len(r.locks) == 0 {
		// Every live lock is this one, taken just now.
		r.renewedThrough.Store(r.now().UnixNano())
	}
	old, ok := r.locks[jobID]
	if ok && old.value == value {
		old.failures, old.releasing, old.loser = 0, 0, l
		r.mu.Unlock()
		return old
	}
	h := &HeldLock{id: jobID, value: value, loser: l, r: r, live: true}
	if ok {
		old.live = false
	} else {
		r.heldN.Add(1)
	}
	r.locks[jobID] = h
	r.mu.Unlock()
	return h
}

// Forget unregisters jobID's lock if value is still the one held.
func (r *LockRenewer) Forget(jobID, value string) {
	r.mu.Lock()
	if h, ok := r.locks[jobID]; ok && h.value == value {
		r.forgetLocked(h)
	}
	r.mu.Unlock()
}

// ForgetHeld unregisters h's lock if it is still registered: Forget(id,
// value) of h's job and value, without looking the job up.
func (r *LockRenewer) ForgetHeld(h *HeldLock) {
	r.mu.Lock()
	if h.live {
		r.forgetLocked(h)
	}
	r.mu.Unlock()
}

// forgetLocked removes h, which is live; r.mu is held.
func (r *LockRenewer) forgetLocked(h *HeldLock) {
	delete(r.locks, h.id)
	h.live = false
	r.heldN.Add(-1)
}

// Held returns the number of registered (live) locks.
func (r *LockRenewer) Held() int { return int(r.heldN.Load()) }

// Holds reports whether this node holds jobID's live lock: the job's actor
// is live here.
func (r *LockRenewer) Holds(jobID string) bool {
	r.mu.Lock()
	_, ok := r.locks[jobID]
	r.mu.Unlock()
	return ok
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
	sent := time.Now()
	token := strconv.FormatInt(sent.UnixNano(), 36) + "-" + r.node
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
		r.checkEpoch(epoch, token, sent)
	}
	return nil
}

// checkEpoch compares the epoch found with the one seen before; token is
// the value the renewal would have set, sent when it was sent.
func (r *LockRenewer) checkEpoch(cmd *redis.StatusCmd, token string, sent time.Time) {
	found, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		found = token // it was absent: now it is this value
	case err != nil:
		return // unknown (a server without SET NX GET): no verdict
	}
	lost := r.epoch != "" && found != r.epoch
	if r.epoch != "" && !lost {
		r.intactAt.Store(sent.UnixMilli())
	}
	r.epoch = found
	if lost {
		if r.log != nil {
			r.log.Error("Redis lost its data (the epoch key vanished): jobs whose records are gone are recreated by their live actors or dead-lettered as state_lost")
		}
		r.onLoss()
	}
}

// RenewOnce renews the node lease and every registered lock now.
//
// The locks go in pipelines of at most RenewPipelineCalls script calls
// (RenewPipelineCalls × RenewBatch locks), one after another: a round's
// memory is one pipeline's arguments and replies whatever the number of
// locks, and a pipeline's replies arrive well within the client's read
// timeout even on a loaded Redis (one pipeline of every lock — a thousand
// calls at a million locks — did not, and a timed-out read failed the
// renewal of every lock at once). The first pipeline that cannot reach
// Redis ends the round: the locks not sent count a failed renewal, as
// they would have, without a wait per pipeline.
func (r *LockRenewer) RenewOnce(ctx context.Context) {
	if r.node != "" {
		lctx, cancel := context.WithTimeout(ctx, r.interval)
		if err := r.renewLease(lctx); err != nil && r.log != nil {
			r.log.Warn("node lease not renewed", "err", err)
		}
		cancel()
	}
	snapshot := r.now()
	var byShard [Shards][]renewItem
	r.mu.Lock()
	for id, h := range r.locks {
		sh := Shard(id)
		byShard[sh] = append(byShard[sh], renewItem{id, h})
	}
	r.mu.Unlock()
	var calls [][]renewItem
	for sh := range byShard {
		for start := 0; start < len(byShard[sh]); start += RenewBatch {
			calls = append(calls, byShard[sh][start:min(start+RenewBatch, len(byShard[sh]))])
		}
	}
	if len(calls) == 0 {
		r.caughtUp(snapshot)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, r.interval)
	defer cancel()
	var out renewOutcome
	var unreachable error
	for start := 0; start < len(calls); start += RenewPipelineCalls {
		group := calls[start:min(start+RenewPipelineCalls, len(calls))]
		if unreachable == nil {
			unreachable = r.renewGroup(cctx, group, &out)
			continue
		}
		r.settle(group, nil, unreachable, &out)
	}
	r.lostN.Add(uint64(len(out.lost)))
	if len(out.lost) > 0 && r.log != nil {
		r.log.Warn("job locks lost", "count", len(out.lost), "refused_gone", out.gone, "refused_taken", out.taken,
			"failed", out.failedOut, "round_s", r.now().Sub(snapshot).Seconds(), "err", unreachable)
	}
	if out.failures == 0 {
		r.caughtUp(snapshot)
	}
	for _, l := range out.lost {
		l.h.loser.LockLost(l.h.value, l.vanished)
	}
}

// RenewPipelineCalls bounds the renewal script calls of one pipeline.
const RenewPipelineCalls = 8

type renewItem struct {
	id string
	h  *HeldLock
}

type lostLock struct {
	h        *HeldLock
	vanished bool
}

// renewOutcome gathers a round's outcome over its pipelines.
type renewOutcome struct {
	lost                   []lostLock
	gone, taken, failedOut int // lost locks by cause
	failures               int // renewals that failed (lost or not)
}

// renewGroup sends one pipeline of renewal calls (each of one shard) and
// settles its locks. It returns the pipeline's error when Redis could not
// be reached at all (no reply came), so the round stops there.
func (r *LockRenewer) renewGroup(ctx context.Context, group [][]renewItem, out *renewOutcome) error {
	ttl := r.s.cfg.LockTTL.Milliseconds()
	leaseUntil := time.Now().Add(2 * r.s.cfg.LockTTL).UnixMilli()
	cmds := make([]*redis.Cmd, len(group))
	_, _ = r.s.sendScripts(ctx, len(group), func(pipe redis.Pipeliner, i int) []redis.Cmder {
		items := group[i]
		rc := renewManyCall{dueKey: r.s.keys.Due(Shard(items[0].id)), ttlMs: ttl, leaseUntilMs: leaseUntil,
			locks: make([]renewedLock, len(items))}
		for j, it := range items {
			rc.locks[j] = renewedLock{jobID: it.id, lockKey: r.s.keys.Lock(it.id), lockValue: it.h.value}
		}
		cmds[i] = evalSha(ctx, pipe, rc)
		r.calls.Add(1)
		return []redis.Cmder{cmds[i]}
	})
	r.settle(group, cmds, nil, out)
	for _, c := range cmds {
		if c.Err() == nil || !isNetErr(c.Err()) {
			return nil // Redis answered something
		}
	}
	return cmds[0].Err()
}

// isNetErr reports whether err is a failure to reach Redis (no reply), not
// an error reply.
func isNetErr(err error) bool {
	var re redis.Error
	return err != nil && !errors.As(err, &re)
}

// settle applies a pipeline's replies (cmds; nil: not sent, failed with
// err) to its locks.
func (r *LockRenewer) settle(group [][]renewItem, cmds []*redis.Cmd, err error, out *renewOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ci, items := range group {
		var res []int64
		cerr := err
		if cmds != nil {
			res, cerr = cmds[ci].Int64Slice()
			if cerr == nil && len(res) != len(items) {
				cerr = redis.Nil
			}
		}
		for i, it := range items {
			if !it.h.live {
				continue // forgotten, or held again, since the snapshot
			}
			switch {
			case cerr == nil && res[i] == 1:
				r.renewed.Add(1)
				it.h.failures = 0
			case cerr == nil && it.h.releasing > 0:
				// Refused while a write that gives the lock up is in
				// flight: that write's own outcome tells its job what
				// happened (released, or fenced), not a loss report.
				r.forgetLocked(it.h)
			case cerr == nil:
				// Refused: the lock is gone (-1) or someone else's (0).
				r.refused.Add(1)
				r.forgetLocked(it.h)
				out.lost = append(out.lost, lostLock{it.h, res[i] < 0})
				if res[i] < 0 {
					out.gone++
				} else {
					out.taken++
				}
			default:
				r.failed.Add(1)
				out.failures++
				it.h.failures++
				if it.h.failures >= MaxRenewFailures {
					r.forgetLocked(it.h)
					out.lost = append(out.lost, lostLock{it.h, false})
					out.failedOut++
				}
			}
		}
	}
}

// caughtUp records that every lock registered before snapshot has been
// answered by a renewal sent at or after it.
func (r *LockRenewer) caughtUp(snapshot time.Time) {
	ns := snapshot.UnixNano()
	for {
		cur := r.renewedThrough.Load()
		if cur >= ns || r.renewedThrough.CompareAndSwap(cur, ns) {
			return
		}
	}
}

// LateAfter is how long after its last renewal a live lock counts as late
// (see Late): one and a half renewal intervals, half a lock TTL, so the
// lock still has half its TTL to be renewed in while the node takes no
// more work.
func (r *LockRenewer) LateAfter() time.Duration { return r.interval + r.interval/2 }

// Late reports whether the renewals are behind: some live lock has gone
// unrenewed for longer than LateAfter — its renewal round is slow, or
// failed. A node takes no more work while its renewals are late (the
// intake holds its fetches): taking work adds locks and writes, and its
// own locks must not lapse for it.
//
// It is a lower bound on the oldest lock's renewal, kept per round: every
// round that answers all the locks it saw (renewed, or found lost) moves
// it to the round's start; a registration into an empty renewer moves it
// to now.
func (r *LockRenewer) Late() bool {
	if r.heldN.Load() == 0 {
		return false
	}
	return r.now().Sub(time.Unix(0, r.renewedThrough.Load())) > r.LateAfter()
}

// SetClock replaces the renewer's clock (the one Late and the rounds read;
// time.Now by default). For tests: call before using the renewer.
func (r *LockRenewer) SetClock(now func() time.Time) {
	r.now = now
	r.renewedThrough.Store(now().UnixNano())
}
