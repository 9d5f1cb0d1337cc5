package troupe

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/lifecycle"
)

// Waits left alone (issue 31): a parked retry wait, an approval and a
// rate-limited park have no actor and no worker; their record and the wake
// source kept with it are their only home. A delayed submit not yet due
// has no record at all: its entry in the delayed set is its only home. When Redis loses its data no
// event is owed to them, so this node wakes each one it left alone
// (jobactor.AloneWaits) and the core ends a job it finds with no record
// state_lost: dead-lettered, its client told once.

const (
	// aloneBatch: the waits read (one pipelined HMGET each) and woken per
	// step of a sweep or a verify.
	aloneBatch = 1000
	// aloneSweepPace: the pause between two batches of a sweep — at most
	// 10,000 lost waits woken a second, each an actor until its DLQ write.
	aloneSweepPace = 100 * time.Millisecond
	// aloneVerifyPerTick: the waits with no due time (approvals, rate
	// parks) whose records are read each tick to drop those that moved on
	// (woken on another replica).
	aloneVerifyPerTick = 1000
)

// aloneGrace is how long past its retry time a parked retry wait is taken
// to be woken by some replica's due poller (it is DueSlack + DueIdlePoll
// late at most, unless the poller stalls): a retry due that long before Redis
// was last seen intact had left its wait before the loss.
func (n *Node) aloneGrace() time.Duration {
	return max(n.store.LockTTL(), n.cfg.Tuning.DueSlack+2*max(n.cfg.Tuning.DuePoll, n.cfg.Tuning.DueIdlePoll))
}

// aloneWaitsPart prunes and verifies the index of waits left alone, and
// sweeps it when Redis loses its data.
func (n *Node) aloneWaitsPart() part {
	return goPart("alone-waits", func(ctx context.Context) {
		tick := time.NewTicker(max(n.store.LockTTL()/3, 100*time.Millisecond))
		defer tick.Stop()
		var cursor int
		for {
			select {
			case <-ctx.Done():
				return
			case intact := <-n.aloneLost:
				n.restoreSchedules(ctx, intact)
				n.sweepAlone(ctx, intact)
			case <-tick.C:
				select {
				case intact := <-n.aloneLost: // first: a prune must not drop what it owes
					n.restoreSchedules(ctx, intact)
					n.sweepAlone(ctx, intact)
				default:
				}
				if at := n.renewer.IntactAt(); !at.IsZero() {
					n.alone.Prune(at.Add(-n.aloneGrace()))
				}
				cursor = n.verifyAlone(ctx, cursor)
			}
		}
	})
}

// sweepAlone wakes, as lost, every wait left alone here whose record is
// gone, Redis having lost its data after intact (zero: unknown).
//
// It first waits a lock TTL: a job woken on another replica and live there
// meanwhile has its record written back by its actor (state_lost hops) at
// that replica's next renewal, and is then no lost wait. A retry due
// before intact less aloneGrace had left its wait before the loss.
func (n *Node) sweepAlone(ctx context.Context, intact time.Time) {
	var cut time.Time
	if !intact.IsZero() {
		cut = intact.Add(-n.aloneGrace())
	}
	defer n.lostWaitSweeps.Inc()
	waits := n.alone.Snapshot(cut)
	if len(waits) == 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(n.store.LockTTL()):
	}
	in := n.intakeRef.Load()
	if in == nil {
		return
	}
	woken := 0
	for len(waits) > 0 {
		batch := waits[:min(aloneBatch, len(waits))]
		waits = waits[len(batch):]
		states, err := n.waitStates(ctx, batch)
		if err != nil {
			n.log.Warn("waits left alone: cannot read their records after Redis lost its data; left for the next loss seen",
				"err", err, "waits", len(batch)+len(waits))
			return
		}
		var gone []jobactor.AloneWait
		for i, w := range batch {
			// A delayed submit has no record until it is due: it is lost
			// when its delayed entry is gone too (and it was not cancelled).
			if st := states[i]; st.record == "" && !st.held && !st.cancelled {
				gone = append(gone, w)
			}
		}
		mine, err := n.claimLostWakes(ctx, gone)
		if err != nil {
			n.log.Warn("waits left alone: cannot claim their wakes after Redis lost its data; waking them here",
				"err", err, "waits", len(gone))
			mine = gone
		}
		for _, w := range mine {
			in.WakeLost(w.JobID)
		}
		n.alone.Drop(gone)
		n.lostWaitsWoken.Add(float64(len(mine)))
		woken += len(mine)
		if len(waits) > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(aloneSweepPace):
			}
		}
	}
	n.log.Warn("waits left alone whose records Redis lost were woken to end state_lost", "woken", woken)
}

// verifyAlone reads the records of the indexed waits with no due time in
// the index's stripes from cursor on (about aloneVerifyPerTick), and drops those whose record left the
// wait (the job was woken elsewhere). A missing record is kept: Redis may
// have lost it, which the next lease renewal tells. It returns the next
// cursor.
func (n *Node) verifyAlone(ctx context.Context, cursor int) int {
	waits, next := n.alone.Undue(cursor, aloneVerifyPerTick)
	if len(waits) == 0 {
		return next
	}
	states, err := n.waitStates(ctx, waits)
	if err != nil {
		return cursor
	}
	var moved []jobactor.AloneWait
	for i, w := range waits {
		st := states[i]
		if w.Kind == lifecycle.WaitDelayed {
			// Out of the delayed set and submitted (a record) or
			// cancelled: moved on. Out of it with neither: lost, or
			// between its submit and its record; kept.
			if !st.held && (st.record != "" || st.cancelled) {
				moved = append(moved, w)
			}
			continue
		}
		if s := st.record; s != "" && !w.StillWaiting(s) {
			moved = append(moved, w)
		}
	}
	n.alone.Drop(moved)
	return next
}

// lostWakeClaim is how long a lost wait's wake claim is kept: longer than
// any sweep of the loss that made it.
const lostWakeClaim = 24 * time.Hour

// claimLostWakes returns the waits of gone whose wake this node claimed
// (`SET <tag>lostwake:<job> NX`): a job that two replicas both indexed (a
// retry wait parked by one node, activated and parked again by another,
// whose first entry is kept until its due time) is woken by one of them,
// so it gets one DLQ entry.
func (n *Node) claimLostWakes(ctx context.Context, gone []jobactor.AloneWait) ([]jobactor.AloneWait, error) {
	if len(gone) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pipe := n.rdb.Pipeline()
	cmds := make([]*redis.BoolCmd, len(gone))
	keys := n.store.Keys()
	for i, w := range gone {
		cmds[i] = pipe.SetNX(ctx, keys.Tag(w.JobID)+"lostwake:"+w.JobID, n.cfg.NodeID, lostWakeClaim)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	mine := gone[:0:0]
	for i, c := range cmds {
		if c.Val() {
			mine = append(mine, gone[i])
		}
	}
	return mine, nil
}

// waitState is what Redis holds of a wait left alone: its record's "state
// reason" ("" where the record is gone) and, for a delayed submit, whether
// it is still in the delayed set and whether it was cancelled there (both
// false for the other waits: only their record speaks for them).
type waitState struct {
	record          string
	held, cancelled bool
}

// waitStates reads what Redis holds of each of waits, in one pipeline.
func (n *Node) waitStates(ctx context.Context, waits []jobactor.AloneWait) ([]waitState, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pipe := n.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(waits))
	delayed := make([]func() (bool, bool), len(waits))
	keys := n.store.Keys()
	for i, w := range waits {
		cmds[i] = pipe.HMGet(ctx, keys.Job(w.JobID), "s", "reason")
		if w.Kind == lifecycle.WaitDelayed && n.ticker != nil {
			delayed[i] = n.ticker.Store().QueueDelayedStatus(ctx, pipe, w.JobID)
		}
	}
	done, _ := pipe.Exec(ctx)
	for _, c := range done {
		// A cancellation's ZSCORE answers Nil for a job never cancelled.
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
	}
	out := make([]waitState, len(waits))
	for i, c := range cmds {
		if v := c.Val(); len(v) == 2 && v[0] != nil {
			s, _ := v[0].(string)
			r, _ := v[1].(string)
			out[i].record = s + " " + r
		}
		if delayed[i] != nil {
			out[i].held, out[i].cancelled = delayed[i]()
		}
	}
	return out, nil
}
